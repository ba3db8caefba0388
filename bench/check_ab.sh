#!/usr/bin/env bash
# Side-by-side scale benchmark of two builds: `collc check allreduce/ring --ranks P` (both placements) with each
# binary in turn, RUNS times, reporting per binary the median wall time (and range), the median CPU time (user +
# system, steadier than wall time on a shared VM) and the median peak memory. Alternating the launches puts both
# builds through the same phases of the machine's speed, which moves by 1.4x from minute to minute here.
#
# Usage: bench/check_ab.sh RUNS RANKS BIN_A BIN_B     e.g. bench/check_ab.sh 10 1024 /tmp/collc-old target/release/collc
# A binary of a given commit: git worktree add /tmp/old COMMIT && (cd /tmp/old && cargo build --release -p collc)
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 RUNS RANKS BIN_A BIN_B" >&2; exit 2; }
runs=$1 ranks=$2 a=$3 b=$4
limit_s=${LIMIT_S:-300}
out=$(mktemp)
trap 'rm -f "$out" "$out.one"' EXIT
for _ in $(seq "$runs"); do
  for bin in "$a" "$b"; do
    /usr/bin/time -f "%e %U %S %M" -o "$out.one" timeout "$limit_s" "$bin" check allreduce/ring --ranks "$ranks" \
      --quiet --max-slots 100000000000 --max-transfers 200000000 >/dev/null 2>&1 || { echo "$bin failed" >&2; exit 1; }
    echo "$bin $(tail -1 "$out.one")" >>"$out"
  done
done
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%-40s %-22s %-14s %s\n' binary "wall s median (range)" "CPU s median" "peak MiB median"
for bin in "$a" "$b"; do
  rows=$(awk -v b="$bin" '$1 == b' "$out")
  wall=$(echo "$rows" | awk '{print $2}' | median)
  range=$(echo "$rows" | awk '{print $2}' | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}')
  cpu=$(echo "$rows" | awk '{print $3 + $4}' | median)
  peak=$(echo "$rows" | awk '{print $5 / 1024}' | median)
  printf '%-40s %-22s %-14s %.0f\n' "$bin" "$wall ($range)" "$cpu" "$peak"
done
