#!/usr/bin/env bash
# The tcp transport, side by side in one run:
#  1. over the loopback, 2 ranks: `collc run allreduce --transport tcp` (its per-size selection) against OpenMPI's
#     MPI_Allreduce on its TCP path (`--mca btl tcp,self`, bench/mpi_allreduce.c), RUNS runs alternating, per-size
#     medians of the out-of-place columns; and the 8-byte latency from separate runs of many iterations;
#  2. across two network namespaces joined by a veth pair through a bridge (one rank in each): the same collc run
#     against the raw TCP stream rate between the same two namespaces (bench/tcp_stream.c, one connection, one
#     direction), measured in the same run, alternating: the limit of this link.
# Goals (issue 22): busbw >= 1.2x OpenMPI's at >= 1 MB; >= 80% of the stream rate at 64 MB across namespaces;
# 8-byte latency <= 1.2x OpenMPI's. Needs root (namespaces), iproute2, a C compiler, and Open MPI (installed
# with apt when missing).
#
# Usage: bench/tcp_vs_mpi.sh
# Env knobs: RUNS [5]  SIZES_B [8] SIZES_E [64M] FACTOR [4] ITERS [20] WARMUP [3]  LAT_ITERS [5000]
#            COLLC_BIN [target/release/collc, built]  STREAM_BYTES [2147483648]
#            NSOCKS ["1 2"]  connections per pair of ranks (COLLC_NSOCKS_PERPEER) tried across the namespaces
#            PROXY ["0 1"]   who moves collc's data (COLLC_NET_PROXY): 0 the executor inline, 1 a network proxy
#                            thread per rank; each is run in turn, alternating with the others and MPI
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

runs=${RUNS:-5}
modes=${PROXY:-0 1}
size_flags=(-b "${SIZES_B:-8}" -e "${SIZES_E:-64M}" -f "${FACTOR:-4}" -n "${ITERS:-20}" -w "${WARMUP:-3}" -c 0)
lat_iters=${LAT_ITERS:-5000}
stream_bytes=${STREAM_BYTES:-2147483648}
work=$(mktemp -d "${TMPDIR:-/tmp}/tcp_vs_mpi.XXXXXX")
ns=collc-bench-$$
cleanup() {
  for n in "$ns-a" "$ns-b" "$ns-sw"; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

if ! command -v mpicc >/dev/null 2>&1; then
  echo "mpicc not found: installing openmpi-bin libopenmpi-dev" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >&2
fi
mpicc -O2 -o "$work/mpi_allreduce" bench/mpi_allreduce.c
cc -O2 -o "$work/tcp_stream" bench/tcp_stream.c
collc=$(collc_bin)
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo -np 2)

median() { sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# table FILE... -> "size time_us" rows of the out-of-place columns of nccl-tests tables
rows() { awk '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ {print $1, $6}' "$@"; }
# medians SIDE -> "size median_us" per size over all runs of SIDE
medians() {
  rows "$work/$1".*.txt | sort -k1,1n -k2,2g | awk '
    function flush() { if (n) { print size, (n % 2) ? t[(n + 1) / 2] : (t[n / 2] + t[n / 2 + 1]) / 2 } n = 0 }
    $1 != size { flush(); size = $1 } { t[++n] = $2 } END { flush() }'
}

echo "collc: $collc run allreduce --transport tcp --ranks 2 ${size_flags[*]}"
echo "MPI:   ${mpi[*]} mpi_allreduce ${size_flags[*]}  ($(mpirun --version 2>/dev/null | head -1))"
echo "== loopback, 2 ranks: $runs runs per side (COLLC_NET_PROXY $modes, MPI), alternating ..." >&2
for r in $(seq "$runs"); do
  for m in $modes; do
    COLLC_NET_PROXY=$m COLLC_SOCKET_IFNAME=lo "$collc" run allreduce --transport tcp --ranks 2 "${size_flags[@]}" \
      >"$work/loop_collc_p$m.$r.txt"
  done
  "${mpi[@]}" "$work/mpi_allreduce" "${size_flags[@]}" >"$work/loop_mpi.$r.txt" 2>/dev/null
done
for m in $modes; do
  grep -E '^#   sizes' "$work/loop_collc_p$m.1.txt" | sed "s/^#  /  collc (COLLC_NET_PROXY=$m) selected:/" || true
  join <(medians "loop_collc_p$m") <(medians loop_mpi) >"$work/loop_p$m"
  echo "== loopback, 2 ranks, out of place, COLLC_NET_PROXY=$m, medians of $runs runs (busbw = size / time at 2 ranks)"
  awk '{ printf "%10s %12.2f %12.2f %10.3f %10.3f %8.2f\n", $1, $2, $3, $1 / $2 / 1e3, $1 / $3 / 1e3, $3 / $2 }
       BEGIN { printf "%10s %12s %12s %10s %10s %8s\n", "bytes", "collc_us", "mpi_us", "collc_GBps", "mpi_GBps", "busbw_c/m" }' \
    "$work/loop_p$m"
done

echo "== 8-byte latency, $runs x $lat_iters iterations per side ..." >&2
for r in $(seq "$runs"); do
  for m in $modes; do
    COLLC_NET_PROXY=$m COLLC_SOCKET_IFNAME=lo "$collc" run allreduce --transport tcp --ranks 2 -b 8 -e 8 \
      -n "$lat_iters" -w 200 -c 0 | rows /dev/stdin | awk '{print $2}' >>"$work/lat_collc_p$m"
  done
  "${mpi[@]}" "$work/mpi_allreduce" -b 8 -e 8 -n "$lat_iters" -w 200 -c 0 2>/dev/null |
    rows /dev/stdin | awk '{print $2}' >>"$work/lat_mpi"
done
lat_m=$(median <"$work/lat_mpi")

# --- two namespaces ------------------------------------------------------------------------------------------
ip netns add "$ns-sw"; ip -n "$ns-sw" link add br0 type bridge; ip -n "$ns-sw" link set br0 up
i=1
for side in a b; do
  ip netns add "$ns-$side"
  ip -n "$ns-sw" link add "p$side" type veth peer name eth0 netns "$ns-$side"
  ip -n "$ns-sw" link set "p$side" master br0 up
  ip -n "$ns-$side" addr add "10.78.0.$i/24" dev eth0
  ip -n "$ns-$side" link set eth0 up; ip -n "$ns-$side" link set lo up
  i=$((i + 1))
done
echo "== two namespaces (10.78.0.1, 10.78.0.2 over veth and a bridge): $runs x (stream, collc 64M) ..." >&2
port=29700
for r in $(seq "$runs"); do
  port=$((port + 1))
  ip netns exec "$ns-b" "$work/tcp_stream" recv "$port" "$stream_bytes" >"$work/stream.$r" &
  ip netns exec "$ns-a" "$work/tcp_stream" send 10.78.0.2 "$port" "$stream_bytes"
  wait
  # Both directions at once, as a 2-rank allreduce sends: the rate each direction gets.
  port=$((port + 2))
  ip netns exec "$ns-b" "$work/tcp_stream" recv "$port" "$stream_bytes" >"$work/duplex_ab.$r" &
  ip netns exec "$ns-a" "$work/tcp_stream" recv "$((port + 1))" "$stream_bytes" >"$work/duplex_ba.$r" &
  ip netns exec "$ns-a" "$work/tcp_stream" send 10.78.0.2 "$port" "$stream_bytes" &
  ip netns exec "$ns-b" "$work/tcp_stream" send 10.78.0.1 "$((port + 1))" "$stream_bytes"
  wait
  for nsocks in ${NSOCKS:-1 2}; do
    for m in $modes; do
      port=$((port + 1))
      for rank in 0 1; do
        side=$([ $rank = 0 ] && echo a || echo b)
        ip netns exec "$ns-$side" env RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.78.0.1 \
          MASTER_PORT=$port TORCHELASTIC_RUN_ID="bench-$$-$r-$nsocks-$m" \
          COLLC_JOB_TOKEN="bench-token-$$-0123456789abcdef" COLLC_NSOCKS_PERPEER="$nsocks" COLLC_NET_PROXY="$m" \
          "$collc" run allreduce --transport tcp -b 64M -e 64M -n "${ITERS:-20}" -w "${WARMUP:-3}" -c 0 \
          >"$work/ns_collc_${nsocks}_p$m.$r.$rank.txt" &
      done
      wait
    done
  done
done
stream=$(awk '{print $2}' "$work"/stream.* | median)
duplex=$(cat "$work"/duplex_ab.* "$work"/duplex_ba.* | awk '{print $2}' | median)
echo "== two namespaces: raw stream median $stream GB/s one way, $duplex GB/s each way with both at once"

echo
for m in $modes; do
  best_busbw=0
  for nsocks in ${NSOCKS:-1 2}; do
    us=$(rows "$work"/ns_collc_"${nsocks}_p$m".*.0.txt | awk '{print $2}' | median)
    busbw=$(awk -v us="$us" 'BEGIN {printf "%.3f", 67108864 / us / 1e3}')
    echo "== two namespaces, COLLC_NET_PROXY=$m, $nsocks connection(s) per pair: collc allreduce 64M median $us us" \
         "= busbw $busbw GB/s"
    if awk -v a="$busbw" -v b="$best_busbw" 'BEGIN {exit !(a > b)}'; then best_busbw=$busbw; best_nsocks=$nsocks; fi
  done
  ns_busbw=$best_busbw
  lat_c=$(median <"$work/lat_collc_p$m")
  echo "== goals, COLLC_NET_PROXY=$m"
  awk '$1 >= 1048576 && $1 <= 33554432 { r = $3 / $2; if (w == "" || r < w) { w = r; ws = $1 } } END {
         printf "loopback busbw collc/MPI from 1 MB to 32 MB: worst %.2f at %d bytes (goal >= 1.2)\n", w, ws }' \
    "$work/loop_p$m"
  awk '$1 >= 1048576 { print $3 / $2 }' "$work/loop_p$m" | median |
    awk '{printf "loopback busbw collc/MPI at >= 1 MB: median %.2f\n", $1}'
  awk -v c="$lat_c" -v m="$lat_m" 'BEGIN {printf "8-byte latency collc/MPI = %.2f (%s us / %s us) (goal <= 1.2)\n", c / m, c, m}'
  awk -v b="$ns_busbw" -v s="$stream" -v n="$best_nsocks" 'BEGIN {
    printf "across namespaces at 64 MB: busbw / stream rate = %.0f%% (%s / %s GB/s, %s connection(s)) (goal >= 80%%)\n",
      100 * b / s, b, s, n}'
  awk -v b="$ns_busbw" -v d="$duplex" 'BEGIN {
    printf "across namespaces at 64 MB: busbw / each-way rate with both directions at once = %.0f%% (%s / %s GB/s)\n",
      100 * b / d, b, d}'
done
