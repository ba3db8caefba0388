#!/usr/bin/env bash
# A long run of the verifier's differential fuzzer (tests/integration/differential.rs; tests/README.md).
#
#   bench/fuzz_verifier.sh [CASES] [SEED]      # defaults: 30000 cases, seed 0xC011C0DE
#   RELEASE=1 bench/fuzz_verifier.sh 200000    # faster, but without the debug build's checks of unsafe preconditions
#
# The report (tried, accepted, per generator and mutation kind, every class of wrong schedule with a shrunk .sched
# example) goes to stdout and to fuzz_verifier-SEED-CASES.log in the current directory. Exit status: the test's.
set -euo pipefail
cases=${1:-30000}
seed=${2:-0xC011C0DE}
cd "$(dirname "$0")/.."
profile=()
[[ "${RELEASE:-0}" == 1 ]] && profile=(--release)
log="fuzz_verifier-${seed}-${cases}.log"
echo "differential fuzz: $cases cases, seed $seed${profile[*]:+, release}; report in $log" >&2
start=$(date +%s)
set +e
COLLC_FUZZ_CASES="$cases" COLLC_FUZZ_SEED="$seed" COLLC_FUZZ_SHRINK_SECS="${COLLC_FUZZ_SHRINK_SECS:-60}" \
  cargo test -p collc-tests "${profile[@]}" --test integration differential -- --nocapture 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "differential fuzz: exit $status after $(( $(date +%s) - start )) s" >&2
exit "$status"
