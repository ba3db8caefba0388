#!/usr/bin/env bash
# Verification scale benchmark: `collc check allreduce/ring` (both placements) at growing rank counts, release
# build, several runs each, median seconds and peak memory. Goal on a 2-core machine: p=1024 < 1 s, p=4096 < 10 s.
# For scale (REFERENCE.md section 6): MSCCLang's Python compiler took 2.3 s at 64 ranks and 33.7 s at 128 ranks
# for the same algorithm on this kind of machine; the ratio column uses those published numbers.
#
# Usage: bench/check_scale.sh [RUNS] [RANKS...]     e.g. bench/check_scale.sh 3 64 128 256 1024 4096
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
ranks=${*:-64 128 256 1024 4096}
limit_s=${LIMIT_S:-300}
cargo build --release -p collc >/dev/null 2>&1
bin=target/release/collc

declare -A msccl=([64]=2.3 [128]=33.7)
printf '%-6s %-10s %-14s %-12s %s\n' ranks "median s" "peak MiB" instructions "vs MSCCLang"
for p in $ranks; do
  times=()
  peak=0
  summary=""
  for _ in $(seq "$runs"); do
    out=$( { /usr/bin/time -f '%e %M' timeout "$limit_s" "$bin" check allreduce/ring --ranks "$p" --quiet \
             --max-slots 100000000000 --max-transfers 200000000; } 2>&1 ) || { echo "p=$p: failed or over ${limit_s}s"; break; }
    read -r secs kb <<<"$(echo "$out" | tail -1)"
    summary=$(echo "$out" | grep -m1 verified || true)
    times+=("$secs")
    (( kb > peak )) && peak=$kb
  done
  [ ${#times[@]} -eq 0 ] && continue
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  ratio="-"
  [ -n "${msccl[$p]:-}" ] && ratio=$(awk -v m="${msccl[$p]}" -v t="$median" 'BEGIN {printf "%.0fx faster", m / (t > 0 ? t : 0.001)}')
  instrs=$("$bin" build allreduce/ring --ranks "$p" --max-slots 100000000000 --max-transfers 200000000 2>/dev/null | grep -c '^  #' || true)
  printf '%-6s %-10s %-14s %-12s %s\n' "$p" "$median" "$((peak / 1024))" "$instrs" "$ratio"
done
