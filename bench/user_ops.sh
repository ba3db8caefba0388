#!/usr/bin/env bash
# What a user's reduction operator costs against a built-in one (issue 34, item 3), side by side in one run: RUNS
# runs alternating, per data type, `collc run allreduce/one_shot` (threads, out of place) with
#   - max: the built-in operator, the host kernels' vector loop;
#   - absmax: `op absmax(a, b) = max(abs(a), abs(b))` from an --ops file, compiled with cranelift (one element per
#     iteration; half types through the conversions the reference uses);
# then per size the medians of the time and the ratio absmax / max (1.0: as fast as the built-in).
#
# Usage: bench/user_ops.sh
# Env knobs: RUNS [5]  RANKS [2]  DTYPES ["float bfloat16 int32"]  SIZES_B [4K]  SIZES_E [16M]  FACTOR [4]
#            ITERS [20]  WARMUP [3]  COLLC_BIN [target/release/collc, built]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

runs=${RUNS:-5}
ranks=${RANKS:-2}
flags=(-b "${SIZES_B:-4K}" -e "${SIZES_E:-16M}" -f "${FACTOR:-4}" -n "${ITERS:-20}" -w "${WARMUP:-3}" -c 0)
work=$(mktemp -d "${TMPDIR:-/tmp}/user_ops.XXXXXX")
trap 'rm -rf "$work"' EXIT
printf 'op absmax(a, b) = max(abs(a), abs(b))\n' >"$work/ops.coll"
collc=$(collc_bin)

for dtype in ${DTYPES:-float bfloat16 int32}; do
  echo "== $dtype: $runs runs per side (max, absmax), alternating ..." >&2
  for r in $(seq "$runs"); do
    for op in max absmax; do
      "$collc" run allreduce/one_shot --ranks "$ranks" --ops "$work/ops.coll" -o "$op" -d "$dtype" "${flags[@]}" \
        >"$work/${op}_$dtype.$r.txt"
    done
  done
  echo "== allreduce/one_shot, $ranks ranks, $dtype, out of place, medians of $runs runs: time (us)"
  join <(column "$work" "max_$dtype" 6) <(column "$work" "absmax_$dtype" 6) |
    awk 'BEGIN { printf "%13s%13s%13s%13s\n", "bytes", "max_us", "absmax_us", "absmax/max" }
         { printf "%13s%13s%13s%13.2f\n", $1, $2, $3, $3 / $2 }'
done
