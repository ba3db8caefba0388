#!/usr/bin/env bash
# The checks of the ib transport (issue 33) for a machine with an RDMA NIC (InfiniBand or RoCE), on a release binary
# built beforehand with `cargo build --release -p collc --features ib` (linked against the system's libibverbs):
#  1. the matrix: every library algorithm x every dtype x every op at 2 and 4 rank processes on this host, through
#     the NIC's loopback, in and out of place, each row checked against the collective's definition (`-c 1`);
#  2. a busbw sweep of allreduce at 2 ranks, 1 MiB to 1 GiB, printed beside the line rate: LINE_GBPS (GB/s; NDR
#     400 Gb/s is 50 GB/s, of which NCCL reports 46-49 per NIC), else what `ibv_devinfo`'s active rate says.
# Across hosts, run `collc run allreduce --transport ib` on each with RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT and COLLC_JOB_TOKEN set (torchrun's variables).
#
# Usage: tests/ib/run.sh [COLLC_BIN]      (default target/release/collc)
# Env: RANKS ["2 4"]  SIZES ["-b 8 -e 256K -f 32"]  ALGOS [every library algorithm]  LINE_GBPS [from ibv_devinfo]
#      SWEEP ["-b 1M -e 1G -f 4 -n 20 -w 5"]
#      COLLC_IB_HCA, COLLC_IB_GID_INDEX (RoCE), COLLC_IB_TIMEOUT, COLLC_IB_RETRY_CNT as the transport reads them.
# On a machine without a NIC, put the software verbs library first on LD_LIBRARY_PATH (cli/tests/ib.rs builds it
# with collc_runtime::build_soft_verbs) to try the script; its figures are then the CPU's.
set -uo pipefail
if [ -n "${1:-${COLLC_BIN:-}}" ]; then
  collc=$(realpath "${1:-${COLLC_BIN:-}}")
fi
cd "$(dirname "$0")/../.."
collc=${collc:-$(realpath target/release/collc)}
read -r -a sizes <<<"${SIZES:--b 8 -e 256K -f 32}"
export COLLC_TIMEOUT=${COLLC_TIMEOUT:-60}
started=$(date +%s)
fail=0

echo "== 1. matrix over ib: ranks {${RANKS:-2 4}}, every dtype and op, ${sizes[*]}"
algos=${ALGOS:-$("$collc" list | awk 'NR > 1 && $1 !~ /^#/ && $2 ~ /\// {print $2}')}
[ -n "$algos" ] || { echo "FAIL: collc list gave no algorithms"; exit 1; }
runs=0 rows=0
for n in ${RANKS:-2 4}; do
  for algo in $algos; do
    out=$("$collc" run "$algo" --ranks "$n" --transport ib -d all -o all "${sizes[@]}" -n 2 -w 1 -c 1 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && grep -q 'does not compile for' <<<"$out"; then
      continue
    fi
    runs=$((runs + 1))
    rows=$((rows + $(grep -cE '^ +[0-9]+ +[0-9]+ ' <<<"$out")))
    if [ $rc -ne 0 ] || ! grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
      fail=1
      echo "FAIL: $algo --ranks $n (exit $rc):"
      grep -E 'error|FAILED|Out of bounds' <<<"$out" | head -5
    fi
  done
done
echo "matrix: $runs runs, $rows rows, $([ $fail -eq 0 ] && echo '0 wrong' || echo 'FAILURES above')"

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
echo "== done in $(($(date +%s) - started)) s: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
