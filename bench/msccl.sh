#!/usr/bin/env bash
# MSCCL XML in and out, timed: `collc import` (read, lower, verify) of every file of tests/fixtures/msccl, and
# `collc build --emit msccl-xml --target msccl-legacy` (compile, verify, export, read back, verify again) of the ring
# AllReduce at 64 and 128 ranks, the sizes REFERENCE.md section 6 gives MSCCLang's Python compiler's times for
# (2.3 s and 33.7 s on this kind of machine; MSCCLang does not verify what it emits).
#
#   bench/msccl.sh            # RUNS=5: the median of 5 wall-clock times per line, release build
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
runs=${RUNS:-5}
collc=$(collc_bin)

# median_time CMD... -> the median wall-clock seconds of $runs runs of CMD (its output dropped)
median_time() {
  for _ in $(seq "$runs"); do
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null
    end=$(date +%s.%N)
    echo "$end - $start" | bc
  done | sort -g | awk '{v[NR] = $1} END {printf "%.3f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

echo "# collc import, median of $runs runs (s)"
printf "%-58s %10s %8s\n" file bytes seconds
for file in tests/fixtures/msccl/*/*.xml; do
  printf "%-58s %10d %8s\n" "${file#tests/fixtures/msccl/}" "$(stat -c %s "$file")" "$(median_time "$collc" import "$file")"
done
echo "# collc build allreduce/ring --emit msccl-xml --target msccl-legacy, median of $runs runs (s)"
for ranks in 64 128; do
  printf "%-58s %10s %8s\n" "ranks $ranks" - \
    "$(median_time "$collc" build allreduce/ring --ranks "$ranks" --emit msccl-xml --target msccl-legacy)"
done
