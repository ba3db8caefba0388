#!/usr/bin/env bash
# The ib transport's queue pairs, side by side in one run: one RC queue pair per pair of ranks that their links
# share (COLLC_IB_QPS=peer, the default) against one per link (COLLC_IB_QPS=link, NCCL's queue pair per
# connection), `collc run allreduce/ring --transport ib`, RUNS runs alternating, per-size medians of the out-of-place
# time and busbw, and the ratio link/peer. On a NIC this says what sharing a queue pair costs or saves (fewer queue
# pairs in the NIC's cache against one send queue for every link to a peer); without one, put the software verbs
# library first on LD_LIBRARY_PATH (collc_runtime::build_soft_verbs; cli/tests/ib.rs builds it under
# target/tmp/ib-soft-verbs), whose figures are the CPU's.
#
# Usage: bench/ib_qps.sh
# Env knobs: RUNS [5]  RANKS [4]  SIZES ["-b 8 -e 8M -f 32"]  ITERS [20]  WARMUP [3]
#            ALGO [allreduce/ring]  COLLC_BIN [target/release/collc, built with --features ib]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

runs=${RUNS:-5}
ranks=${RANKS:-4}
algo=${ALGO:-allreduce/ring}
read -r -a sizes <<<"${SIZES:--b 8 -e 8M -f 32}"
flags=("${sizes[@]}" -n "${ITERS:-20}" -w "${WARMUP:-3}" -c 0)
work=$(mktemp -d "${TMPDIR:-/tmp}/ib_qps.XXXXXX")
trap 'rm -rf "$work"' EXIT
collc=$(collc_bin ib)

# medians SIDE -> "size median_time_us median_busbw"
medians() { join <(column "$work" "$1" 6) <(column "$work" "$1" 8); }

echo "collc: $collc run $algo --transport ib --ranks $ranks ${flags[*]}"
echo "== $runs runs per side (COLLC_IB_QPS peer, link), alternating ..." >&2
for r in $(seq "$runs"); do
  for q in peer link; do
    COLLC_IB_QPS=$q "$collc" run "$algo" --transport ib --ranks "$ranks" "${flags[@]}" >"$work/$q.$r.txt"
  done
done
echo "== $algo, $ranks ranks, out of place, medians of $runs runs"
join <(medians peer) <(medians link) | awk '
  BEGIN { printf "%10s %12s %12s %11s %11s %10s\n", "bytes", "peer_us", "link_us", "peer_GBps", "link_GBps", "link/peer" }
  { printf "%10s %12.2f %12.2f %11.3f %11.3f %10.2f\n", $1, $2, $4, $3, $5, $4 / $2 }'
