#!/usr/bin/env bash
# The JIT executor against the interpreter (issue 34, item 2), side by side in one run: RUNS runs alternating, per
# rank count, transport and algorithm, `collc run ALGO --executor interp` and `--executor jit` (out of place, the
# same binary), then per size the medians of the time and the ratio jit / interp (below 1: the JIT is faster; the
# goal at <= 4 KiB on 4 and 8 ranks is <= 1/1.3 = 0.77).
#
# Usage: bench/jit_vs_interp.sh
# Env knobs: RUNS [5]  RANKS ["2 4 8"]  TRANSPORTS ["threads shm"]  ALGOS ["allreduce/ring allreduce/one_shot"]
#            SIZES_B [8]  SIZES_E [1M]  FACTOR [8]  ITERS [2000]  WARMUP [200]  COLLC_BIN [target/release/collc, built]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

runs=${RUNS:-5}
flags=(-b "${SIZES_B:-8}" -e "${SIZES_E:-1M}" -f "${FACTOR:-8}" -n "${ITERS:-2000}" -w "${WARMUP:-200}" -c 0)
work=$(mktemp -d "${TMPDIR:-/tmp}/jit_vs_interp.XXXXXX")
trap 'rm -rf "$work"' EXIT
collc=$(collc_bin)
echo "# $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

for ranks in ${RANKS:-2 4 8}; do
  for transport in ${TRANSPORTS:-threads shm}; do
    for algo in ${ALGOS:-allreduce/ring allreduce/one_shot}; do
      side="${ranks}_${transport}_${algo//\//_}"
      echo "== $algo, $ranks ranks, $transport: $runs runs per side (interp, jit), alternating ..." >&2
      for r in $(seq "$runs"); do
        for executor in interp jit; do
          "$collc" run "$algo" --ranks "$ranks" --transport "$transport" --executor "$executor" "${flags[@]}" \
            >"$work/${executor}_$side.$r.txt"
        done
      done
      echo "== $algo, $ranks ranks, $transport, out of place, medians of $runs runs: time (us)"
      join <(column "$work" "interp_$side" 6) <(column "$work" "jit_$side" 6) |
        awk 'BEGIN { printf "%13s%13s%13s%13s\n", "bytes", "interp_us", "jit_us", "jit/interp" }
             { printf "%13s%13s%13s%13.2f\n", $1, $2, $3, $3 / $2 }'
    done
  done
done
