#!/usr/bin/env bash
# The cost model against the machine: for every allreduce algorithm of the library, the time `collc cost` predicts
# on a topology calibrated here (`collc cost --calibrate`) and the time `collc run --transport shm` measures, at
# 8 B..64 MiB, side by side in one script. Per size it prints the predicted winner (what `collc run allreduce`
# selects), the measured winner, and how much slower the selected algorithm measured than the measured best.
# Goal: the selected algorithm is the measured fastest or within 10% of it at >= 90% of sizes.
#
# Usage: bench/model_vs_measured.sh
# Env knobs (defaults in brackets):
#   RANKS ["2 4"]  SIZES_B [8]  SIZES_E [64M]  FACTOR [4]  ITERS [50]  WARMUP [5]
#   RUNS [5]       measured runs per algorithm and rank count, alternating algorithms; medians over them
#   TOPO []        a topology file to predict with instead of calibrating (`collc cost --calibrate` writes one)
#   ALGOS []       allreduce algorithms to compare (default: every allreduce/* of `collc list`)
#   KEEP [0]       1 keeps the work directory (raw JSON of every run) and prints its path
set -euo pipefail
cd "$(dirname "$0")/.."

ranks_list=${RANKS:-2 4}
sizes_b=${SIZES_B:-8}
sizes_e=${SIZES_E:-64M}
factor=${FACTOR:-4}
iters=${ITERS:-50}
warmup=${WARMUP:-5}
runs=${RUNS:-5}

cargo build --release -p collc >/dev/null 2>&1
bin=target/release/collc
work=$(mktemp -d "${TMPDIR:-/tmp}/model_vs_measured.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
  echo "# work directory: $work"
else
  trap 'rm -rf "$work"' EXIT
fi

topo=${TOPO:-}
if [ -z "$topo" ]; then
  topo=$work/calibrated.json
  "$bin" cost --calibrate --runs 5 -o "$topo" 2>&1 | grep '^# calibrated' || true
fi
echo "# topology: $(tr -d '\n ' <"$topo")"
algos=${ALGOS:-$("$bin" list | awk '{print $2}' | grep '^allreduce/' | sed 's|allreduce/||' | tr '\n' ' ')}
echo "# algorithms: $algos"

for p in $ranks_list; do
  for algo in $algos; do
    "$bin" cost "allreduce/$algo" --ranks "$p" --topo "$topo" --sizes "$sizes_b..$sizes_e" -f "$factor" \
      --format json >"$work/predicted-$p-$algo.json"
  done
  for run in $(seq "$runs"); do
    for algo in $algos; do
      "$bin" run "allreduce/$algo" --ranks "$p" --transport shm -b "$sizes_b" -e "$sizes_e" -f "$factor" \
        -n "$iters" -w "$warmup" -c 0 --format json >"$work/measured-$p-$algo-$run.json"
    done
  done
done

python3 - "$work" "$ranks_list" "$algos" "$runs" <<'PY'
import json, statistics, sys
work, ranks, algos, runs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
total = good = 0
for p in ranks:
    predicted = {a: {r["size"]: r["time_us"] for r in json.load(open(f"{work}/predicted-{p}-{a}.json"))["rows"]}
                 for a in algos}
    measured = {}
    for a in algos:
        samples = {}
        for run in range(1, runs + 1):
            for r in json.load(open(f"{work}/measured-{p}-{a}-{run}.json"))["rows"]:
                samples.setdefault(r["size"], []).append(r["out_of_place"]["time_us"])
        measured[a] = {size: statistics.median(ts) for size, ts in samples.items()}
    sizes = sorted(set.intersection(*(set(m) for m in measured.values())) & set(predicted[algos[0]]))
    print(f"\n# {p} ranks, shm: predicted and measured out-of-place time (us, median of {runs} runs)")
    print(f"# {'size':>10}  {'predicted winner':<20} {'pred us':>9}  {'measured winner':<20} {'meas us':>9}  "
          f"{'selected meas us':>16}  {'sel/best':>8}  ok")
    for size in sizes:
        pick = min(algos, key=lambda a: predicted[a][size])
        best = min(algos, key=lambda a: measured[a][size])
        ratio = measured[pick][size] / measured[best][size]
        ok = ratio <= 1.10
        total += 1
        good += ok
        print(f"  {size:>10}  {pick:<20} {predicted[pick][size]:>9.2f}  {best:<20} {measured[best][size]:>9.2f}  "
              f"{measured[pick][size]:>16.2f}  {ratio:>8.2f}  {'yes' if ok else 'NO'}")
    print(f"# every algorithm, measured / predicted time at each size:")
    print("# " + f"{'size':>10}" + "".join(f" {a[:14]:>14}" for a in algos))
    for size in sizes:
        print("  " + f"{size:>10}" + "".join(f" {measured[a][size] / predicted[a][size]:>14.2f}" for a in algos))
share = 100.0 * good / max(total, 1)
print(f"\n# goal: selected within 10% of the measured best at >= 90% of sizes: {good}/{total} = {share:.0f}% "
      f"({'met' if share >= 90 else 'missed'})")
PY
