#!/usr/bin/env bash
# Allreduce bandwidth and latency: collc (`collc run allreduce --transport shm`, the algorithm its cost model
# selects per size, as MPI_Allreduce selects its own) against OpenMPI's MPI_Allreduce (bench/mpi_allreduce.c), side
# by side on the same sizes, at 2 ranks and at 4 ranks (4 is oversubscribed on a 2-core machine). Both print the
# nccl-tests all_reduce_perf table; this script parses the out-of-place columns of both, runs each side RUNS times
# (alternating collc and MPI), and reports per-size medians, the ratios collc/MPI, the algorithms collc selected,
# and the memory-bandwidth bound of an allreduce that reads each input and writes each output once in DRAM (ring,
# two_shot and the other ring-shaped algorithms selected at large sizes), measured with bench/membw.c.
# ALGO=allreduce/ring pins one algorithm instead. BASE_CMD adds a third side, another collc build (before/after a
# change), run alternating with the other two: a table of this build's times against it, and both latencies.
#
# Usage: bench/allreduce_vs_mpi.sh
# Env knobs (defaults in brackets):
#   SIZES_B [8] SIZES_E [256M] FACTOR [2] ITERS [20] WARMUP [5]   nccl-tests -b -e -f -n -w for both sides
#   LAT_ITERS [20000]   iterations of the separate 8-byte latency runs (2 ranks) the latency goal uses
#   RUNS [3]            runs per side and rank count; medians over them
#   RANKS ["2 4"]       rank counts to run (the goal lines refer to 2 and 4)
#   ALGO [allreduce]    `allreduce` = collc's per-size selection; `allreduce/NAME` pins one library algorithm
#   COLLC_CMD ["target/release/collc run {ALGO} --ranks {N} --transport shm"]  the collc side, without the size
#                       flags (the script appends -b -e -f -n -w -c 0); {N} and {ALGO} are replaced. When it is
#                       set, collc is not built (point it at any command that prints the nccl-tests table).
#   BASE_CMD [unset]    a second collc command line, as COLLC_CMD (e.g. "/tmp/old/collc run {ALGO} --ranks {N}
#                       --transport shm"): a before/after comparison in the same run
#   MPIRUN [mpirun]     MPI_ARGS ["--allow-run-as-root --oversubscribe --mca btl self,vader"]
#   DRAM_BYTES_FACTOR [2]  DRAM bytes per call = DRAM_BYTES_FACTOR * p * n (n bytes per rank)
#   RUN_TIMEOUT [1800]  seconds allowed for one run of either side
#   KEEP [0]            1 keeps the work directory (raw tables of every run) and prints its path
set -euo pipefail
cd "$(dirname "$0")/.."

sizes_b=${SIZES_B:-8}
sizes_e=${SIZES_E:-256M}
factor=${FACTOR:-2}
iters=${ITERS:-20}
warmup=${WARMUP:-5}
runs=${RUNS:-3}
ranks_list=${RANKS:-2 4}
algo=${ALGO:-allreduce}
dram_factor=${DRAM_BYTES_FACTOR:-2}
run_timeout=${RUN_TIMEOUT:-1800}
mpirun_bin=${MPIRUN:-mpirun}
mpi_args=${MPI_ARGS:---allow-run-as-root --oversubscribe --mca btl self,vader}
size_flags=(-b "$sizes_b" -e "$sizes_e" -f "$factor" -n "$iters" -w "$warmup" -c 0)

work=$(mktemp -d "${TMPDIR:-/tmp}/allreduce_vs_mpi.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
  echo "work directory (kept): $work"
else
  trap 'rm -rf "$work"' EXIT
fi

# --- tools ---------------------------------------------------------------------------------------------------
if ! command -v mpicc >/dev/null 2>&1; then
  echo "mpicc not found: installing openmpi-bin libopenmpi-dev" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y openmpi-bin libopenmpi-dev >&2
fi
mpicc -O2 -o "$work/mpi_allreduce" bench/mpi_allreduce.c
cc -O2 -o "$work/membw" bench/membw.c

if [ -z "${COLLC_CMD:-}" ]; then
  cargo build --release -p collc >&2
  collc_template="target/release/collc run {ALGO} --ranks {N} --transport shm"
else
  collc_template=$COLLC_CMD
fi

base_template=${BASE_CMD:-}
sides=(collc)
[ -n "$base_template" ] && sides+=(base)
sides+=(mpi)

read -r -a mpi_args_arr <<<"$mpi_args"
collc_cmd() {  # collc_cmd N [TEMPLATE] -> the collc command line for N ranks, as an array in $cmd
  local line=${2:-$collc_template}
  line=${line//\{N\}/$1}
  line=${line//\{ALGO\}/$algo}
  read -r -a cmd <<<"$line"
}
side_cmd() {  # side_cmd collc|base|mpi N -> the side's command line in $cmd
  case $1 in
    collc) collc_cmd "$2" ;;
    base) collc_cmd "$2" "$base_template" ;;
    *) cmd=("$mpirun_bin" "${mpi_args_arr[@]}" -np "$2" "$work/mpi_allreduce") ;;
  esac
}

# --- memory bandwidth ----------------------------------------------------------------------------------------
membw_out=$("$work/membw")
copy_gbps=$(awk '$1 == "copy_GBps" {print $2}' <<<"$membw_out")
traffic_gbps=$(awk '$1 == "traffic_GBps" {print $2}' <<<"$membw_out")
echo "memory: memcpy of 512 MiB best of 5: copy $copy_gbps GB/s, traffic (read + write) $traffic_gbps GB/s"
echo "sizes: -b $sizes_b -e $sizes_e -f $factor, -n $iters -w $warmup; $runs runs per side, alternating; medians"
echo "collc: $collc_template ${size_flags[*]}  ({N} = ranks, {ALGO} = $algo)"
[ -n "$base_template" ] && echo "base:  $base_template ${size_flags[*]}"
echo "MPI:   $mpirun_bin $mpi_args -np {N} mpi_allreduce ${size_flags[*]}  ($("$mpirun_bin" --version 2>/dev/null | head -1))"

failed=0
run_side() {  # run_side collc|base|mpi N RUN -> writes $work/<side>_<N>_<RUN>.txt; returns non-zero on failure
  local side=$1 n=$2 r=$3 out="$work/$1_$2_$3.txt" cmd=()
  side_cmd "$side" "$n"
  local rc=0
  timeout "$run_timeout" "${cmd[@]}" "${size_flags[@]}" >"$out" 2>"$out.err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "!! $side, $n ranks, run $r failed (exit status $rc$([ "$rc" = 124 ] && echo ", timeout ${run_timeout}s")):" \
         "${cmd[*]} ${size_flags[*]}" >&2
    tail -5 "$out.err" >&2
    failed=1
    rm -f "$out"
    return 1
  fi
}

# medians SIDE N -> lines "size median_time_us median_busbw" for the out-of-place columns over all runs of SIDE.
# busbw is recomputed from the time column (size / time * 2(p-1)/p), which keeps two significant digits at small
# sizes where the table's busbw column rounds to 0.00.
medians() {
  local side=$1 n=$2 files=()
  shopt -s nullglob
  files=("$work/${side}_${n}_"*.txt)
  shopt -u nullglob
  [ ${#files[@]} -eq 0 ] && return 0
  awk -v p="$n" '
    /^#/ || NF < 13 || $1 !~ /^[0-9]+$/ {next}
    { t = $6 + 0; bw = (t > 0) ? $1 / (t * 1e3) * 2 * (p - 1) / p : -1; print $1, t, bw }' "${files[@]}" |
    sort -k1,1n -k2,2g |
    awk '
      function flush(   k, mt, mb, nb, bs) {
        if (cnt == 0) return
        mt = (cnt % 2) ? t[(cnt + 1) / 2] : (t[cnt / 2] + t[cnt / 2 + 1]) / 2
        nb = 0
        for (k = 1; k <= cnt; k++) if (b[k] >= 0) bs[++nb] = b[k]
        # busbw values are already sorted descending because times are sorted ascending
        mb = (nb == 0) ? -1 : ((nb % 2) ? bs[(nb + 1) / 2] : (bs[nb / 2] + bs[nb / 2 + 1]) / 2)
        print size, mt, mb
        cnt = 0
      }
      $1 != size { flush(); size = $1 }
      { cnt++; t[cnt] = $2; b[cnt] = $3 }
      END { flush() }'
}

human() {  # bytes -> 8, 1K, 256M
  awk -v s="$1" 'BEGIN {
    u = "BKMGT"; i = 1
    while (s >= 1024 && s % 1024 == 0 && i < 5) { s /= 1024; i++ }
    printf "%d%s", s, (i == 1 ? "" : substr(u, i, 1)) }'
}

for n in $ranks_list; do
  echo
  echo "== $n ranks: running $runs x (${sides[*]}) ..." >&2
  for r in $(seq "$runs"); do
    for side in "${sides[@]}"; do run_side "$side" "$n" "$r" || true; done
  done
  medians collc "$n" >"$work/med_collc_$n"
  medians mpi "$n" >"$work/med_mpi_$n"
  # joined: size ct cb mt mb (-1 = missing)
  awk 'FILENAME == ARGV[1] {c[$1] = $2 " " $3; s[$1] = 1; next} {m[$1] = $2 " " $3; s[$1] = 1}
       END {for (k in s) print k, (k in c ? c[k] : "-1 -1"), (k in m ? m[k] : "-1 -1")}' \
    "$work/med_collc_$n" "$work/med_mpi_$n" | sort -k1,1n >"$work/joined_$n"

  first_run=$(ls "$work/collc_${n}_"*.txt 2>/dev/null | head -1 || true)
  [ -n "$first_run" ] && grep -E '^#   sizes' "$first_run" | sed "s/^#  /  collc selected, $n ranks:/" || true
  echo "== $n ranks, $algo, out of place, medians of $runs runs; bound = one DRAM read of each input and write" \
       "of each output (${dram_factor}*p*n bytes per call at $traffic_gbps GB/s)"
  awk -v p="$n" -v traffic="$traffic_gbps" -v f="$dram_factor" '
    function hs(s,   u, i) { u = "BKMGT"; i = 1; while (s >= 1024 && s % 1024 == 0 && i < 5) { s /= 1024; i++ }
                             return sprintf("%d%s", s, i == 1 ? "" : substr(u, i, 1)) }
    function num(x, fmt) { return x < 0 ? "-" : sprintf(fmt, x) }
    function ratio(a, b) { return (a < 0 || b <= 0) ? "-" : sprintf("%.2f", a / b) }
    BEGIN {
      # t_bound = f*p*n / traffic; busbw_bound = n / t_bound * 2(p-1)/p = traffic / (f*p) * 2(p-1)/p
      bound = traffic / (f * p) * 2 * (p - 1) / p
      printf "%8s %11s %11s %11s %11s %11s %11s %11s %9s\n", "size", "collc_us", "collc_busbw", "mpi_us",
             "mpi_busbw", "busbw_c/m", "time_c/m", "bound_busbw", "%bound"
    }
    { printf "%8s %11s %11s %11s %11s %11s %11s %11.2f %9s\n", hs($1), num($2, "%.2f"), num($3, "%.2f"),
             num($4, "%.2f"), num($5, "%.2f"), ratio($3, $5), ratio($2, $4), bound,
             ($3 < 0 || bound <= 0) ? "-" : sprintf("%.1f%%", 100 * $3 / bound) }' "$work/joined_$n"
  if [ -n "$base_template" ]; then
    medians base "$n" >"$work/med_base_$n"
    awk 'FILENAME == ARGV[1] {c[$1] = $2 " " $3; s[$1] = 1; next} {m[$1] = $2 " " $3; s[$1] = 1}
         END {for (k in s) print k, (k in c ? c[k] : "-1 -1"), (k in m ? m[k] : "-1 -1")}' \
      "$work/med_collc_$n" "$work/med_base_$n" | sort -k1,1n >"$work/vs_base_$n"
    echo "== $n ranks, this build (collc) against BASE_CMD (base), out of place, medians of $runs runs"
    awk '
      function hs(s,   u, i) { u = "BKMGT"; i = 1; while (s >= 1024 && s % 1024 == 0 && i < 5) { s /= 1024; i++ }
                               return sprintf("%d%s", s, i == 1 ? "" : substr(u, i, 1)) }
      function num(x, fmt) { return x < 0 ? "-" : sprintf(fmt, x) }
      BEGIN { printf "%8s %11s %11s %11s\n", "size", "collc_us", "base_us", "time_c/base" }
      { printf "%8s %11s %11s %11s\n", hs($1), num($2, "%.2f"), num($4, "%.2f"),
               ($2 < 0 || $4 <= 0) ? "-" : sprintf("%.2f", $2 / $4) }' "$work/vs_base_$n"
  fi
done

# --- latency ---------------------------------------------------------------------------------------------------
# The sweep's first row also pays for first-touch effects on both sides; the latency goal uses separate runs of
# 8-byte calls only, many iterations each, alternating sides, median over RUNS.
lat_iters=${LAT_ITERS:-20000}
latency() {  # latency collc|base|mpi N -> median 8-byte out-of-place time in us over RUNS runs
  local side=$1 n=$2 cmd=() times=()
  for r in $(seq "$runs"); do
    side_cmd "$side" "$n"
    times+=("$(timeout "$run_timeout" "${cmd[@]}" -b 8 -e 8 -n "$lat_iters" -w 1000 -c 0 2>/dev/null |
               awk '!/^#/ && $1 == 8 {print $6}')")
  done
  printf '%s\n' "${times[@]}" | awk 'NF' | sort -g | awk '{t[NR] = $1} END {if (NR) print (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2}'
}
lat_collc=""; lat_mpi=""; lat_base=""
if [[ " $ranks_list " == *" 2 "* ]]; then
  echo "== 2 ranks: 8-byte latency, $runs x $lat_iters iterations per side ..." >&2
  lat_collc=$(latency collc 2); lat_mpi=$(latency mpi 2)
  [ -n "$base_template" ] && lat_base=$(latency base 2)
fi

# --- goals ---------------------------------------------------------------------------------------------------
# pick FILE TARGET -> the row of FILE whose size is nearest TARGET in log scale (ties go to the larger size),
# among rows where both sides have data.
pick() {
  awk -v target="$2" '
    $1 <= 0 || $2 < 0 || $4 < 0 {next}
    { d = log($1 / target); if (d < 0) d = -d
      if (best == "" || d < bestd - 1e-9 || (d < bestd + 1e-9 && $1 > bestsize)) { best = $0; bestd = d; bestsize = $1 } }
    END { print best }' "$1"
}
at() {  # "at 1M" or "at 512K (nearest to 1M)"
  local got=$1 want=$2
  if [ "$got" = "$want" ]; then echo "at $(human "$got")"; else echo "at $(human "$got") (nearest to $(human "$want"))"; fi
}
echo
echo "== goals"
bound2=$(awk -v t="$traffic_gbps" -v f="$dram_factor" 'BEGIN {printf "%.2f", t / (f * 2) * 2 * (2 - 1) / 2}')
if [ -s "$work/joined_2" ]; then
  s=""
  read -r s ct cb mt mb <<<"$(pick "$work/joined_2" 1048576)" || true
  if [ -z "$s" ]; then
    echo "2 ranks: no size with results on both sides"
  else
    echo "2 ranks: busbw $(at "$s" 1048576) collc/MPI = $(awk -v a="$cb" -v b="$mb" 'BEGIN {printf (b > 0 ? "%.2f" : "-"), (b > 0 ? a / b : 0)}') (goal >= 1.5)"
    read -r s ct cb mt mb <<<"$(pick "$work/joined_2" 268435456)"
    echo "2 ranks: busbw $(at "$s" 268435456) collc/MPI = $(awk -v a="$cb" -v b="$mb" 'BEGIN {printf (b > 0 ? "%.2f" : "-"), (b > 0 ? a / b : 0)}') (goal >= 3)," \
         "= $(awk -v a="$cb" -v b="$bound2" 'BEGIN {printf "%.1f", 100 * a / b}')% of bound $bound2 GB/s (goal >= 50%)"
    read -r s ct cb mt mb <<<"$(pick "$work/joined_2" 8)"
    lat="8 B latency"
    [ "$s" = 8 ] || lat="latency $(at "$s" 8)"
    echo "2 ranks: $lat in the sweep collc/MPI = $(awk -v a="$ct" -v b="$mt" 'BEGIN {printf (b > 0 ? "%.2f" : "-"), (b > 0 ? a / b : 0)}')" \
         "($ct us / $mt us)"
    if [ -n "$lat_collc" ] && [ -n "$lat_mpi" ]; then
      echo "2 ranks: 8 B latency ($lat_iters iterations) collc/MPI = $(awk -v a="$lat_collc" -v b="$lat_mpi" 'BEGIN {printf "%.2f", a / b}')" \
           "($lat_collc us / $lat_mpi us) (goal <= 1.2)"
    fi
  fi
fi
if [ -s "$work/joined_4" ]; then
  worst=$(awk '$3 >= 0 && $5 > 0 { r = $3 / $5; if (w == "" || r < w) { w = r; ws = $1 } }
               END { if (w != "") print ws, w }' "$work/joined_4")
  if [ -n "$worst" ]; then
    read -r ws wr <<<"$worst"
    echo "4 ranks: worst busbw ratio collc/MPI = $(awk -v r="$wr" 'BEGIN {printf "%.2f", r}') at $(human "$ws") (goal >= 1.0)"
  else
    echo "4 ranks: no size with results on both sides"
  fi
fi
if [ -n "$base_template" ]; then
  for n in $ranks_list; do
    [ -s "$work/vs_base_$n" ] || continue
    awk -v n="$n" '$2 > 0 && $4 > 0 {print $2 / $4}' "$work/vs_base_$n" | sort -g |
      awk -v n="$n" '{r[NR] = $1} END {if (NR) printf "%s ranks: time collc/base over %d sizes: median %.2f, range %.2f-%.2f\n",
                       n, NR, (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2, r[1], r[NR]}'
  done
  if [ -n "$lat_collc" ] && [ -n "$lat_base" ]; then
    echo "2 ranks: 8 B latency ($lat_iters iterations) collc/base = $(awk -v a="$lat_collc" -v b="$lat_base" 'BEGIN {printf "%.2f", a / b}')" \
         "($lat_collc us / $lat_base us)"
  fi
fi
if [ "$failed" -ne 0 ]; then
  echo "some runs failed (see messages above)" >&2
  exit 1
fi
