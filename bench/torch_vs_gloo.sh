#!/usr/bin/env bash
# torch.distributed's all_reduce through the collc backend against gloo (issue 35, item 4), side by side in one run:
# RUNS torchrun jobs per side alternating, per rank count, each timing float32 sums per size
# (bench/torch_allreduce.py); then per size the medians of the time and busbw and the ratios collc / gloo. Goals: busbw
# ratio >= 1.5 from 1 MB, time ratio <= 1.2 at 8 B, on 2 and 4 ranks.
#
# Usage: bench/torch_vs_gloo.sh
# Env knobs: RUNS [5]  RANKS ["2 4"]  SIZES [8,64,512,4096,32768,262144,1048576,4194304,16777216]  ITERS [2000]
#            WARMUP [50]  COLLC_TORCH_PYTHON [/opt/collc-torch/bin/python, else python3]
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-5}
sizes=${SIZES:-8,64,512,4096,32768,262144,1048576,4194304,16777216}
python=${COLLC_TORCH_PYTHON:-$([ -x /opt/collc-torch/bin/python ] && echo /opt/collc-torch/bin/python || echo python3)}
work=$(mktemp -d "${TMPDIR:-/tmp}/torch_vs_gloo.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The release extension, with the package's Python, as a package folder of its own.
cargo build --release -p collc-python >&2
mkdir -p "$work/pkg/collc"
cp python/collc/*.py "$work/pkg/collc/"
cp target/release/lib_collc.so "$work/pkg/collc/_collc.abi3.so"
echo "# $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"

# median DIR SIDE K -> "bytes median" of column K (2: time_us, 4: busbw) over DIR/SIDE.*.txt, per size
median() {
  awk -v k="$3" 'NF == 4 && $1 ~ /^[0-9]+$/ {print $1, $k}' "$1/$2".*.txt | sort -k1,1n -k2,2g | awk '
    function flush() { if (n) { print size, (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 } n = 0 }
    $1 != size { flush(); size = $1 } { v[++n] = $2 } END { flush() }'
}

for ranks in ${RANKS:-2 4}; do
  echo "== all_reduce float32 sum, $ranks ranks: $runs torchrun jobs per side (collc, gloo), alternating ..." >&2
  for r in $(seq "$runs"); do
    for backend in collc gloo; do
      PYTHONPATH="$work/pkg" OMP_NUM_THREADS=1 "$python" -m torch.distributed.run --standalone --nproc-per-node "$ranks" \
        bench/torch_allreduce.py "$backend" "$sizes" "${ITERS:-2000}" "${WARMUP:-50}" 2>"$work/err" \
        >"$work/${backend}_$ranks.$r.txt" || { cat "$work/err" >&2; exit 1; }
    done
  done
  echo "== all_reduce float32 sum, $ranks ranks, medians of $runs jobs"
  join <(median "$work" "collc_$ranks" 2) <(median "$work" "gloo_$ranks" 2) |
    join - <(median "$work" "collc_$ranks" 4) | join - <(median "$work" "gloo_$ranks" 4) |
    awk 'BEGIN { printf "%11s%12s%12s%10s%13s%13s%10s\n", "bytes", "collc_us", "gloo_us", "time_x", "collc_busbw", "gloo_busbw", "busbw_x" }
         { printf "%11s%12s%12s%10.2f%13s%13s%10.2f\n", $1, $2, $3, $2 / $3, $4, $5, ($5 > 0 ? $4 / $5 : 0) }'
done
