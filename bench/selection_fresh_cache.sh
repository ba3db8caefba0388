#!/usr/bin/env bash
# How often the runtime's choice of algorithm is within 10% of the measured fastest, from a fresh calibration cache
# (issue #31's goal: >= 80% of sizes at 2, 4 and 8 ranks). For each rank count, a fresh $XDG_CACHE_HOME (so the
# first use calibrates this host and caches it), then `collc run COLLECTIVE --compare`, which times every candidate
# at every size and prints, per size, the measured fastest beside the choice, and the count within 10%.
#
#   bench/selection_fresh_cache.sh                     # allreduce, 2 4 8 ranks, -b 8 -e 32M -f 4, threads
#   RANKS="2 4" COLLECTIVE=allgather SIZES="-b 8 -e 8M -f 8" TRANSPORT=shm bench/selection_fresh_cache.sh
#   LEARN=1 bench/selection_fresh_cache.sh            # then --compare again on the same cache: the choice now goes by
#                                                     # the first run's timings (merged into the cache), timed afresh
#
# Prints each rank count's comparison lines and a summary; the raw tables stay in a temporary directory (printed).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks_list=${RANKS:-2 4 8}
collective=${COLLECTIVE:-allreduce}
sizes=${SIZES:--b 8 -e 32M -f 4}
transport=${TRANSPORT:-threads}
iters=${ITERS:-20}
cargo build --release -p collc >&2
work=$(mktemp -d)
echo "# $collective --compare $sizes -n $iters over $transport, a fresh calibration cache per rank count; tables in $work"
for n in $ranks_list; do
  cache="$work/cache-$n"
  mkdir -p "$cache"
  # shellcheck disable=SC2086
  XDG_CACHE_HOME="$cache" target/release/collc run "$collective" --ranks "$n" --transport "$transport" --compare \
    $sizes -n "$iters" -w 5 -c 0 > "$work/ranks-$n.txt"
  echo "== $n ranks"
  sed -n '/# compared out of place/,$p' "$work/ranks-$n.txt" | grep -v '^#$'
  if [ -n "${LEARN:-}" ]; then
    # shellcheck disable=SC2086
    XDG_CACHE_HOME="$cache" target/release/collc run "$collective" --ranks "$n" --transport "$transport" --compare \
      $sizes -n "$iters" -w 5 -c 0 > "$work/learned-$n.txt"
    echo "== $n ranks, again, choosing by the first run's timings"
    sed -n '/# compared out of place/,$p' "$work/learned-$n.txt" | grep -v '^#$'
  fi
done
echo "== summary"
for n in $ranks_list; do
  line=$(grep "within 10% of the measured fastest" "$work/ranks-$n.txt" || echo "no summary line")
  echo "$n ranks: ${line#\# }"
  if [ -n "${LEARN:-}" ]; then
    line=$(grep "within 10% of the measured fastest" "$work/learned-$n.txt" || echo "no summary line")
    echo "$n ranks, after learning: ${line#\# }"
  fi
done
