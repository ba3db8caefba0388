#!/usr/bin/env bash
# Two collc binaries side by side (a change to the data path before and after), alternating in one run: per case
# (data type, operator) and size, RUNS runs of `collc run ALGO` out of place with each binary in turn, then the
# medians of the time and the ratio new / old (below 1: the new one is faster).
#
# Usage: bench/binaries_ab.sh OLD_COLLC NEW_COLLC
# Env knobs: RUNS [5]  RANKS [2]  ALGO [allreduce/one_shot]  TRANSPORT [threads]  SIZES ["64K 1M 16M"]  ITERS [30]
#            WARMUP [5]
#            CASES ["float:sum int32:sum double:sum bfloat16:sum int32:max float:max int64:sum int32:premulsum:3
#                    float:premulsum:0.5"]
set -euo pipefail
old=$(realpath "$1")
new=$(realpath "$2")
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
work=$(mktemp -d "${TMPDIR:-/tmp}/binaries_ab.XXXXXX")
trap 'rm -rf "$work"' EXIT
cases=${CASES:-float:sum int32:sum double:sum bfloat16:sum int32:max float:max int64:sum int32:premulsum:3 float:premulsum:0.5}

# median FILE -> the median of the numbers in FILE, one a line
median() {
  sort -g "$1" | awk '{v[NR] = $1} END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

printf '%-22s %8s %12s %12s %10s\n' case bytes old_us new_us new/old
for case in $cases; do
  dtype=${case%%:*}
  op=${case#*:}
  for size in ${SIZES:-64K 1M 16M}; do
    : >"$work/old" && : >"$work/new"
    for _ in $(seq "$runs"); do
      for side in old new; do
        "${!side}" run "${ALGO:-allreduce/one_shot}" --ranks "${RANKS:-2}" --transport "${TRANSPORT:-threads}" \
          -d "$dtype" -o "$op" -b "$size" -e "$size" \
          -n "${ITERS:-30}" -w "${WARMUP:-5}" -c 0 | awk '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ {print $6}' >>"$work/$side"
      done
    done
    o=$(median "$work/old")
    n=$(median "$work/new")
    printf '%-22s %8s %12s %12s %10.2f\n' "$dtype $op" "$size" "$o" "$n" "$(awk -v a="$n" -v b="$o" 'BEGIN {print a / b}')"
  done
done
