#!/usr/bin/env bash
# The host data path against its roofline, side by side in one run (issue 34): for each rank count, RUNS runs
# alternating between
#   - roofline: bench/roofline_allreduce.c, a hand-written one-shot allreduce of threads that read each other's
#     inputs in place (the least memory traffic an allreduce of threads can do);
#   - collc over threads (its per-size choice), collc's allreduce/one_shot over threads, and collc over shm
#     (processes, its buffers from the arena the ranks read in place), each `collc run allreduce`, and shm again
#     with COLLC_P2P_DIRECT_DISABLE=1 (every message through the FIFOs: the protocol before single copy);
#   - OpenMPI's MPI_Allreduce over shared memory (bench/mpi_allreduce.c, `--mca btl self,vader`);
# then per size the medians of the out-of-place time and busbw, and the ratios of collc's busbw to the roofline's
# and to MPI's. Goals (issue 34): 2 ranks, 64 KiB to 16 MiB: collc >= 0.90 of the roofline and >= 2x MPI.
# Needs a C compiler, and Open MPI (installed with apt when missing; SKIP_MPI=1 runs without it).
#
# Usage: bench/host_roofline.sh
# Env knobs: RUNS [5]  RANKS ["2 4 8"]  SIZES_B [8]  SIZES_E [256M]  FACTOR [4]  ITERS [20]  WARMUP [3]
#            COLLC_BIN [target/release/collc, built]  SKIP_MPI [0]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

runs=${RUNS:-5}
ranks_list=${RANKS:-2 4 8}
flags=(-b "${SIZES_B:-8}" -e "${SIZES_E:-256M}" -f "${FACTOR:-4}" -n "${ITERS:-20}" -w "${WARMUP:-3}" -c 0)
work=$(mktemp -d "${TMPDIR:-/tmp}/host_roofline.XXXXXX")
trap 'rm -rf "$work"' EXIT

cc -O3 -march=native -pthread -o "$work/roofline" bench/roofline_allreduce.c
mpi_ok=0
if [ "${SKIP_MPI:-0}" != 1 ]; then
  if ! command -v mpicc >/dev/null 2>&1; then
    echo "mpicc not found: installing openmpi-bin libopenmpi-dev" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >&2
  fi
  mpicc -O2 -o "$work/mpi_allreduce" bench/mpi_allreduce.c && mpi_ok=1
fi
collc=$(collc_bin)


for p in $ranks_list; do
  sides="roof threads one_shot shm shm_fifo"
  [ $mpi_ok = 1 ] && sides="$sides mpi"
  echo "== $p ranks: $runs runs per side ($sides), alternating ..." >&2
  for r in $(seq "$runs"); do
    "$work/roofline" -t "$p" "${flags[@]}" >"$work/roof_$p.$r.txt"
    "$collc" run allreduce --transport threads --ranks "$p" "${flags[@]}" >"$work/threads_$p.$r.txt"
    "$collc" run allreduce/one_shot --transport threads --ranks "$p" "${flags[@]}" >"$work/one_shot_$p.$r.txt"
    "$collc" run allreduce --transport shm --ranks "$p" "${flags[@]}" >"$work/shm_$p.$r.txt"
    COLLC_P2P_DIRECT_DISABLE=1 "$collc" run allreduce --transport shm --ranks "$p" "${flags[@]}" >"$work/shm_fifo_$p.$r.txt"
    if [ $mpi_ok = 1 ]; then
      mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np "$p" "$work/mpi_allreduce" "${flags[@]}" \
        >"$work/mpi_$p.$r.txt" 2>/dev/null
    fi
  done
  grep -E '^#   sizes' "$work/threads_$p.1.txt" | sed 's/^#  /  collc threads selected:/' || true
  echo "== allreduce, $p ranks, out of place, medians of $runs runs: time (us), busbw (GB/s), busbw ratios"
  names=(roof threads one_shot shm shm_fifo)
  [ $mpi_ok = 1 ] && names+=(mpi)
  column "$work" "roof_$p" 6 >"$work/table"
  header="bytes"
  for s in "${names[@]}"; do
    for k in 6 8; do
      [ "$s$k" = roof6 ] || { join "$work/table" <(column "$work" "${s}_$p" $k) >"$work/next" && mv "$work/next" "$work/table"; }
    done
    header="$header ${s}_us ${s}_GBps"
  done
  # Columns: bytes, then (time, busbw) per side in the order of `names`.
  awk -v header="$header" -v mpi=$mpi_ok '
    BEGIN { n = split(header, h, " "); for (i = 1; i <= n; i++) printf "%13s", h[i]
            printf "%13s%13s%13s%13s", "thr/roof", "1shot/roof", "shm/roof", "shm/fifo"; if (mpi) printf "%13s", "thr/mpi"
            printf "\n" }
    { for (i = 1; i <= NF; i++) printf "%13s", $i
      printf "%13.2f%13.2f%13.2f%13.2f", $5 / $3, $7 / $3, $9 / $3, $9 / $11; if (mpi) printf "%13.2f", $5 / $13
      printf "\n" }' \
    "$work/table"
done
