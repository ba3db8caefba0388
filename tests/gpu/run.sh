#!/usr/bin/env bash
# The GPU checks of the cuda transport (issue 23), under 5 minutes on one H200, on a release binary built beforehand
# with `cargo build --release --features cuda` (the GPU machine reaches no package registry: this builds nothing).
#  1. the matrix: every library algorithm x every dtype x every op, 2, 4 and 8 ranks sharing GPU 0 as threads,
#     in and out of place, each row checked against the collective's definition (`collc run -c 1`, `#wrong`);
#  1b. users' operators (`--ops`, compiled into the kernels by NVRTC): absmax on ring allreduce and reducescatter,
#     horner on naive allreduce, every row checked;
#  2. the same with 2 ranks as processes (COLLC_RANK/COLLC_WORLD_SIZE, collc's own launch convention) sharing GPU 0
#     through CUDA IPC (without MPS the GPU time-slices the two processes' kernels: slow, so smaller sizes);
#  3. across hosts: the same call from 2 and from 4 rank processes on GPU 0 split into two "hosts" (COLLC_HOSTID),
#     every library allreduce and one algorithm of each other collective, the hosts joined through each process's
#     network proxy over the loopback (torchrun's environment);
#  4. `collc gpu bench`: the copy kernel against cuMemcpyDtoD at 256 MB, the 8-byte allreduce against an empty
#     launch, and the 8-rank allreduce at 256 MB against the HBM bound, measured in the same run.
# It reports which CUDA libraries the binary loaded and exits non-zero on any wrong element or failed run.
#
# Usage: tests/gpu/run.sh [COLLC_BIN]      (default target/release/collc)
# Prepare (here, where cargo and NVRTC are): cargo build --release -p collc --features cuda &&
#   target/release/collc gpu ptx --output target/collc-kernels.ptx    (then carry both)
# Env: RANKS ["2 4 8"]  SIZES ["-b 8 -e 1M -f 128"]  IPC_SIZES ["-b 8 -e 64K -f 64"]  BENCH_BYTES [256M]
#      HOSTS_SIZES ["-b 8 -e 64K -f 64"]  HOSTS_ALGOS [every library allreduce and one of each collective]
#      ALGOS [every library algorithm]
#      TRANSPORT [cuda]: `twin` runs the matrix on the CPU twin instead (to try the script without a GPU)
set -uo pipefail
# The binary's path is resolved where the script was called from, then everything runs from the repository root.
if [ -n "${1:-${COLLC_BIN:-}}" ]; then
  collc=$(realpath "${1:-${COLLC_BIN:-}}")
fi
cd "$(dirname "$0")/../.."
. tests/matrix.sh
collc=${collc:-$(realpath target/release/collc)}
ranks_list=${RANKS:-2 4 8}
read -r -a sizes <<<"${SIZES:--b 8 -e 1M -f 128}"
read -r -a ipc_sizes <<<"${IPC_SIZES:--b 8 -e 64K -f 64}"
read -r -a hosts_sizes <<<"${HOSTS_SIZES:--b 8 -e 64K -f 64}"
export COLLC_CUDA_GPUS=1 COLLC_TIMEOUT=${COLLC_TIMEOUT:-30}
# NVRTC from the CUDA toolkit when the loader does not find it on its own; the driver's libcuda.so.1 is the system's.
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc.so.1[23]'; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$dir/libnvrtc.so.13" ] || [ -e "$dir/libnvrtc.so.12" ] && export LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}"
  done
fi
# Without NVRTC there, the kernels' PTX made beforehand by the same binary (`collc gpu ptx --output
# target/collc-kernels.ptx`, carried along) is loaded instead.
nvrtc_found() {
  ldconfig -p 2>/dev/null | grep -q 'libnvrtc.so.1[23]' && return 0
  local dir
  local path=${LD_LIBRARY_PATH:-}
  for dir in ${path//:/ }; do
    ls "$dir"/libnvrtc.so.1[23] >/dev/null 2>&1 && return 0
  done
  return 1
}
if [ -z "${COLLC_CUDA_PTX:-}" ] && [ -f target/collc-kernels.ptx ] && ! nvrtc_found; then
  export COLLC_CUDA_PTX=$PWD/target/collc-kernels.ptx
  echo "NVRTC not found: loading the carried PTX $COLLC_CUDA_PTX"
fi
started=$(date +%s)
fail=0
transport=${TRANSPORT:-cuda}
if [ "$transport" = cuda ]; then
  echo "== collc gpu info"
  "$collc" gpu info || { echo "FAIL: no usable GPU (see above)"; exit 1; }
fi

echo "== 1. matrix over $transport: ranks {$ranks_list} sharing GPU 0 as threads, every dtype and op, ${sizes[*]}"
algos=${ALGOS:-$("$collc" list | awk 'NR > 1 && $1 !~ /^#/ && $2 ~ /\// {print $2}')}
[ -n "$algos" ] || { echo "FAIL: collc list gave no algorithms"; exit 1; }
ALGOS=$algos matrix "$collc" "$transport" "$ranks_list" "${sizes[@]}" || fail=1

# Users' operators are compiled into the kernels by NVRTC at run time (a module per operator): not from carried PTX.
if [ -z "${COLLC_CUDA_PTX:-}" ]; then
  echo "== 1b. users' operators over $transport: absmax (every algorithm may reorder it), horner (rank order only)"
  ops=$(mktemp /tmp/collc-ops.XXXXXX.coll)
  printf 'op absmax(a, b) = max(abs(a), abs(b))\nop horner(a, b) = a * 2 + b\n' >"$ops"
  # The CUDA driver for the CPU has its kernels built in: it refuses kernels compiled with an operator, and must
  # say so on every rank, naming the operator.
  cpu_driver=0
  if [ "$transport" = cuda ] && grep -q 'kernels/cuda/host_driver.cpp' <<<"$("$collc" gpu info 2>/dev/null)"; then
    cpu_driver=1
  fi
  for case in "allreduce/ring absmax all" "reducescatter/ring absmax all" "allreduce/naive horner int32"; do
    read -r algo op dtype <<<"$case"
    out=$("$collc" run "$algo" --transport "$transport" --ranks 4 --ops "$ops" -o "$op" -d "$dtype" "${sizes[@]}" \
      -n 2 -w 1 -c 1 2>&1)
    if [ $cpu_driver = 1 ]; then
      refused=$(grep -c "the kernels compiled with the operator \`$op\`): CUDA_ERROR_NOT_SUPPORTED" <<<"$out")
      if [ "$refused" = 4 ]; then
        echo "ok   $algo -o $op -d $dtype: refused on every rank by the CPU driver, naming the operator"
      else
        echo "FAIL $algo -o $op -d $dtype: the CPU driver's refusal, on every rank, expected"; tail -5 <<<"$out"; fail=1
      fi
    elif grep -q '# Out of bounds values : 0 OK' <<<"$out"; then
      echo "ok   $algo -o $op -d $dtype"
    else
      echo "FAIL $algo -o $op -d $dtype"; tail -5 <<<"$out"; fail=1
    fi
  done
  rm -f "$ops"
else
  echo "== 1b. users' operators: skipped (COLLC_CUDA_PTX: no NVRTC to compile them)"
fi

if [ "$transport" = cuda ]; then
  echo "== 2. matrix over cuda: 2 ranks as processes sharing GPU 0 through CUDA IPC, every dtype and op, ${ipc_sizes[*]}"
  ipc_runs=0 ipc_fail=0
  for algo in $algos; do
    job=gpuipc$$_$ipc_runs
    pids=()
    for r in 0 1; do
      COLLC_RANK=$r COLLC_WORLD_SIZE=2 COLLC_JOB=$job timeout 120 "$collc" run "$algo" --transport cuda -d all -o all \
        "${ipc_sizes[@]}" -n 1 -w 1 -c 1 >"/tmp/$job.$r" 2>&1 &
      pids+=($!)
    done
    codes=()
    for pid in "${pids[@]}"; do
      wait "$pid"
      codes+=($?)
    done
    ipc_runs=$((ipc_runs + 1))
    if grep -q 'does not compile for' "/tmp/$job.0"; then
      :
    elif [ "${codes[0]}" -ne 0 ] || [ "${codes[1]}" -ne 0 ] || ! grep -q 'Out of bounds values : 0 OK' "/tmp/$job.0"; then
      fail=1 ipc_fail=$((ipc_fail + 1))
      echo "FAIL: $algo as 2 processes (exit ${codes[*]}):"
      grep -hE 'error|Out of bounds' "/tmp/$job.0" "/tmp/$job.1" | head -5
    fi
    rm -f "/tmp/$job.0" "/tmp/$job.1"
  done
  echo "ipc matrix: $ipc_runs runs, $ipc_fail failed"
fi

if [ "$transport" = cuda ]; then
  # Two hosts on this machine: ranks told apart by COLLC_HOSTID (NCCL_HOSTID's role), joined by a torchrun
  # environment over the loopback. Connections within a "host" use CUDA IPC, between them the network proxy (the
  # device posts into host-mapped records that each process's proxy thread sends over TCP).
  echo "== 3. across hosts: 2 hosts x 1 and 2 hosts x 2 rank processes on GPU 0, ${hosts_sizes[*]}"
  hosts_algos=${HOSTS_ALGOS:-$(grep -E '^allreduce/' <<<"$algos")
allgather/ring reducescatter/ring broadcast/binomial reduce/binomial gather/binomial scatter/binomial
alltoall/pairwise sendrecv/direct}
  hosts_runs=0 hosts_fail=0
  for placement in "0 1" "0 0 1 1"; do
    read -r -a hosts_of <<<"$placement"
    world=${#hosts_of[@]}
    for algo in $hosts_algos; do
      job=gpuhosts$$_$hosts_runs
      port=$((29600 + hosts_runs % 300))
      pids=()
      for r in $(seq 0 $((world - 1))); do
        RANK=$r WORLD_SIZE=$world LOCAL_WORLD_SIZE=$((world / 2)) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          TORCHELASTIC_RUN_ID=$job COLLC_JOB_TOKEN=gpu-hosts-token-$$-0123456789 COLLC_HOSTID=host${hosts_of[$r]} \
          timeout 300 "$collc" run "$algo" --transport cuda "${hosts_sizes[@]}" -n 1 -w 1 -c 1 >"/tmp/$job.$r" 2>&1 &
        pids+=($!)
      done
      codes=() failed=0
      for pid in "${pids[@]}"; do
        wait "$pid"
        code=$?
        codes+=($code)
        [ $code -eq 0 ] || failed=1
      done
      hosts_runs=$((hosts_runs + 1))
      if grep -q 'does not compile for' "/tmp/$job.0"; then
        :
      elif [ $failed -ne 0 ] || ! grep -q 'Out of bounds values : 0 OK' "/tmp/$job.0"; then
        fail=1 hosts_fail=$((hosts_fail + 1))
        echo "FAIL: $algo on hosts {$placement} (exit ${codes[*]}):"
        grep -hE 'error|Out of bounds' /tmp/"$job".* | head -5
      fi
      rm -f /tmp/"$job".*
    done
  done
  echo "hosts matrix: $hosts_runs runs, $hosts_fail failed"
fi

if [ "$transport" = cuda ]; then
  echo "== 4. collc gpu bench --bytes ${BENCH_BYTES:-256M} --ranks 8"
  "$collc" gpu bench --bytes "${BENCH_BYTES:-256M}" --ranks 8 || fail=1
fi
echo "== done in $(($(date +%s) - started)) s: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
