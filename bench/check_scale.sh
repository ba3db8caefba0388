#!/usr/bin/env bash
# Verification scale benchmark: `collc check allreduce/ring` (both placements) at growing rank counts, release
# build, several runs each, median seconds (wall, and CPU: user + system) and peak memory. Goal on a 2-core machine:
# p=1024 < 1 s, p=4096 < 10 s. To compare two builds, use bench/check_ab.sh (alternating launches).
#
# The peer: MSCCLang's Python compiler (microsoft/msccl-tools) compiling and checking its ring AllReduce
# (examples/mscclang/simple/allreduce_ring.py P 1, in place only). It is not installed by this script: point
# MSCCL_TOOLS at a checkout and MSCCL_PYTHON at a Python that has its requirements, and it runs side by side for
# p <= MSCCL_MAX_RANKS (default 128). Without it, the ratio column uses the published numbers of REFERENCE.md
# section 6 (2.3 s at 64 ranks, 33.7 s at 128).
#
# The slowest run is printed beside the median: on this VM the first launch after the machine sat idle for a while
# (45 s in a test) is about 1 s slower at p = 4096, its system time 4.3-4.8 s against 1.8-1.9 s (fresh pages cost
# more to fault in then: a guess is that the guest hands its free memory back to the host, whose balloon device
# offers free page reporting here, and takes it back one fault at a time).
#
# BASE=BIN puts another build beside this one: each of its launches alternates with one of this build's (so a slow
# spell of the machine hits both alike), and two more columns give its median and this build's ratio to it.
#
# Usage: [BASE=BIN] bench/check_scale.sh [RUNS] [RANKS...]     e.g. BASE=/tmp/collc-old bench/check_scale.sh 5 1024 4096
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
ranks=${*:-64 128 256 1024 4096}
limit_s=${LIMIT_S:-300}
cargo build --release -p collc >/dev/null 2>&1
bin=target/release/collc

declare -A msccl=([64]=2.3 [128]=33.7)
msccl_time() {  # seconds MSCCLang takes for p ranks, measured once
  local p=$1
  [ -n "${MSCCL_TOOLS:-}" ] && [ "$p" -le "${MSCCL_MAX_RANKS:-128}" ] || return 1
  /usr/bin/time -f '%e' -o /tmp/msccl_time.$$ timeout "$limit_s" "${MSCCL_PYTHON:-python3}" \
    "$MSCCL_TOOLS/examples/mscclang/simple/allreduce_ring.py" "$p" 1 >/dev/null 2>&1 || return 1
  cat /tmp/msccl_time.$$
}
base=${BASE:-}
check() {  # one launch of binary $1 at $2 ranks: prints "wall user sys KB"
  { /usr/bin/time -f '%e %U %S %M' timeout "$limit_s" "$1" check allreduce/ring --ranks "$2" --quiet \
      --max-slots 100000000000 --max-transfers 200000000 >/dev/null; } 2>&1 | tail -1
}
printf '%-6s %-10s %-10s %-10s %-14s %-12s %-12s %-12s %-12s %s\n' ranks "median s" "slowest s" "CPU s" "peak MiB" \
  instructions "base s" "vs base" "MSCCLang s" "ratio"
for p in $ranks; do
  times=()
  cpus=()
  base_times=()
  peak=0
  summary=""
  for _ in $(seq "$runs"); do
    if [ -n "$base" ]; then
      read -r base_secs _ <<<"$(check "$base" "$p")"
      base_times+=("$base_secs")
    fi
    out=$( { /usr/bin/time -f '%e %U %S %M' timeout "$limit_s" "$bin" check allreduce/ring --ranks "$p" --quiet \
             --max-slots 100000000000 --max-transfers 200000000; } 2>&1 ) || { echo "p=$p: failed or over ${limit_s}s"; break; }
    read -r secs user sys kb <<<"$(echo "$out" | tail -1)"
    summary=$(echo "$out" | grep -m1 verified || true)
    times+=("$secs")
    cpus+=("$(awk -v u="$user" -v s="$sys" 'BEGIN {print u + s}')")
    (( kb > peak )) && peak=$kb
  done
  [ ${#times[@]} -eq 0 ] && continue
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  slowest=$(printf '%s\n' "${times[@]}" | sort -g | tail -1)
  cpu=$(printf '%s\n' "${cpus[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  peer="-"
  if measured=$(msccl_time "$p"); then
    peer="$measured"
  elif [ -n "${msccl[$p]:-}" ]; then
    peer="${msccl[$p]} (pub.)"
  fi
  base_median="-"
  vs_base="-"
  if [ ${#base_times[@]} -gt 0 ]; then
    base_median=$(printf '%s\n' "${base_times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    vs_base=$(awk -v t="$median" -v b="$base_median" 'BEGIN {printf "%.3f", t / (b > 0.005 ? b : 0.005)}')
  fi
  ratio="-"
  [ "$peer" != "-" ] && ratio=$(awk -v m="${peer%% *}" -v t="$median" 'BEGIN {printf "%.0fx faster", m / (t > 0.005 ? t : 0.005)}')
  instrs=$("$bin" build allreduce/ring --ranks "$p" --max-slots 100000000000 --max-transfers 200000000 2>/dev/null | grep -c '^  #' || true)
  printf '%-6s %-10s %-10s %-10s %-14s %-12s %-12s %-12s %-12s %s\n' "$p" "$median" "$slowest" "$cpu" "$((peak / 1024))" \
    "$instrs" "$base_median" "$vs_base" "$peer" "$ratio"
done
rm -f /tmp/msccl_time.$$
