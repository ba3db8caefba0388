#!/usr/bin/env bash
# The checks of the ib transport (issue 33) for a machine with an RDMA NIC (InfiniBand or RoCE), on a release binary
# built beforehand with `cargo build --release -p collc --features ib` (linked against the system's libibverbs):
#  1. the matrix: every library algorithm x every dtype x every op at 2 and 4 rank processes on this host, through
#     the NIC's loopback, in and out of place, each row checked against the collective's definition (`-c 1`);
#  2. a busbw sweep of allreduce at 2 ranks, 1 MiB to 1 GiB, printed beside the line rate: LINE_GBPS (GB/s; NDR
#     400 Gb/s is 50 GB/s, of which NCCL reports 46-49 per NIC), else what `ibv_devinfo`'s active rate says;
#  3. with GPUs (a binary built with `--features ib,cuda`): device ranks on two hosts made by COLLC_HOSTID, over
#     the NIC, with GPUDirect RDMA and staged (see below).
# bench/ib_qps.sh compares a queue pair per pair of ranks with one per link on the same machine.
# Across hosts, run `collc run allreduce --transport ib` on each with RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT and COLLC_JOB_TOKEN set (torchrun's variables).
#
# Usage: tests/ib/run.sh [COLLC_BIN]      (default target/release/collc)
# Env: RANKS ["2 4"]  SIZES ["-b 8 -e 256K -f 32"]  ALGOS [every library algorithm]  LINE_GBPS [from ibv_devinfo]
#      SWEEP ["-b 1M -e 1G -f 4 -n 20 -w 5"]  GPU_ALGOS  GPU_SIZES ["-b 8 -e 4M -f 64"]  GPU_BYTES [64M]
#      COLLC_IB_HCA, COLLC_IB_GID_INDEX (RoCE), COLLC_IB_TIMEOUT, COLLC_IB_RETRY_CNT as the transport reads them.
# On a machine without a NIC, put the software verbs library first on LD_LIBRARY_PATH (cli/tests/ib.rs builds it
# with collc_runtime::build_soft_verbs) to try the script; its figures are then the CPU's.
set -uo pipefail
if [ -n "${1:-${COLLC_BIN:-}}" ]; then
  collc=$(realpath "${1:-${COLLC_BIN:-}}")
fi
cd "$(dirname "$0")/../.."
. tests/matrix.sh
collc=${collc:-$(realpath target/release/collc)}
read -r -a sizes <<<"${SIZES:--b 8 -e 256K -f 32}"
export COLLC_TIMEOUT=${COLLC_TIMEOUT:-60}
started=$(date +%s)
fail=0

echo "== 1. matrix over ib: ranks {${RANKS:-2 4}}, every dtype and op, ${sizes[*]}"
matrix "$collc" ib "${RANKS:-2 4}" "${sizes[@]}" || fail=1

read -r -a sweep <<<"${SWEEP:--b 1M -e 1G -f 4 -n 20 -w 5}"
echo "== 2. busbw: allreduce, 2 ranks, ${sweep[*]}"
line=${LINE_GBPS:-}
if [ -z "$line" ] && command -v ibv_devinfo >/dev/null 2>&1; then
  # active_width 4X and active_speed 100.0 Gbps (NDR per lane) -> 4 x 100 / 8 GB/s
  width=$(ibv_devinfo -v 2>/dev/null | awk '/active_width/ {print $2; exit}' | tr -dc '0-9')
  speed=$(ibv_devinfo -v 2>/dev/null | awk '/active_speed/ {print $2; exit}')
  [ -n "$width" ] && [ -n "$speed" ] && line=$(awk -v w="$width" -v s="$speed" 'BEGIN {printf "%.1f", w * s / 8}')
fi
out=$("$collc" run allreduce --transport ib --ranks 2 "${sweep[@]}" -c 0 2>&1) || fail=1
grep -E '^ +[0-9]+ +[0-9]+ ' <<<"$out" | awk -v line="${line:-0}" '{
  busbw = $8; printf "%12s B  busbw %7.2f GB/s", $1, busbw
  if (line > 0) printf "  %.0f%% of the line rate %.1f GB/s", 100 * busbw / line, line
  printf "\n" }'
# 3. Device ranks over ib (a binary built with `--features ib,cuda` on a machine with GPUs): two hosts of two
#    ranks each made on this one by COLLC_HOSTID, so the hosts' connections go through the NIC's loopback, with
#    GPUDirect RDMA (COLLC_IB_GDR=auto: used where the GPU and the NIC can; the log says which) and staged
#    (COLLC_IB_GDR=0): a few algorithms checked, then allreduce's busbw at GPU_BYTES.
gpu_algos=${GPU_ALGOS:-allreduce/ring allreduce/recursive_doubling allgather/ring alltoall/pairwise}
if "$collc" gpu info >/dev/null 2>&1; then
  read -r -a gpu_sizes <<<"${GPU_SIZES:--b 8 -e 4M -f 64}"
  gpu_bytes=${GPU_BYTES:-64M}
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  port=$((29600 + RANDOM % 300))
  # ranks ARGS... -> 2 hosts x 2 device ranks of `collc run ARGS`, torchrun's variables; rank 0's output
  ranks() {
    local pids=() r rc=0
    port=$((port + 1))
    for r in 0 1 2 3; do
      RANK=$r WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port COLLC_JOB_TOKEN=$token \
        COLLC_HOSTID=host$((r / 2)) COLLC_DEBUG=${COLLC_DEBUG:-INFO} "$collc" run "$@" >"$work.$r" 2>&1 &
      pids+=($!)
    done
    for r in 0 1 2 3; do wait "${pids[$r]}" || rc=1; done
    cat "$work.0"
    return $rc
  }
  work=$(mktemp "${TMPDIR:-/tmp}/collc-ib-gpu.XXXXXX")
  for gdr in auto 0; do
    echo "== 3. device ranks over ib, 2 hosts x 2, COLLC_IB_GDR=$gdr: ${gpu_algos}"
    for algo in $gpu_algos; do
      if ! out=$(COLLC_NET=IB COLLC_IB_GDR=$gdr ranks "$algo" --transport cuda "${gpu_sizes[@]}" -n 2 -w 1 -c 1) ||
        ! grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
        fail=1
        echo "FAIL: $algo (COLLC_IB_GDR=$gdr):"
        grep -hE 'error|FAILED|Out of bounds' "$work".[0-3] | head -5
      fi
    done
    grep -hoE 'GPU Direct RDMA (enabled|disabled[^;]*)' "$work.0" | head -1
    out=$(COLLC_NET=IB COLLC_IB_GDR=$gdr ranks allreduce --transport cuda -b "$gpu_bytes" -e "$gpu_bytes" -n 20 -w 5 -c 0) || fail=1
    grep -E '^ +[0-9]+ +[0-9]+ ' <<<"$out" | awk '{printf "%12s B  busbw %7.2f GB/s\n", $1, $8}'
  done
  rm -f "$work" "$work".[0-3]
else
  echo "== 3. device ranks over ib: skipped (\`collc gpu info\` finds no GPU, or this collc lacks the cuda feature)"
fi
echo "== done in $(($(date +%s) - started)) s: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
