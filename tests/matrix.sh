# The runtime matrix as the device scripts run it (tests/gpu/run.sh, tests/ib/run.sh); sourced, not run.

# matrix COLLC TRANSPORT "RANK COUNTS" SIZE_FLAGS...: every algorithm of ALGOS (default: every library algorithm)
# at each rank count over TRANSPORT, every dtype and op, in and out of place, each row checked (`-c 1`); an
# algorithm whose `where` excludes a rank count is skipped. Prints each failure and a summary line; returns 1 when
# any run failed.
matrix() {
  local collc=$1 transport=$2 ranks=$3
  shift 3
  local algos=${ALGOS:-$("$collc" list | awk 'NR > 1 && $1 !~ /^#/ && $2 ~ /\// {print $2}')}
  [ -n "$algos" ] || { echo "FAIL: collc list gave no algorithms"; return 1; }
  local runs=0 rows=0 failed=0 n algo out rc
  for n in $ranks; do
    for algo in $algos; do
      out=$("$collc" run "$algo" --ranks "$n" --transport "$transport" -d all -o all "$@" -n 2 -w 1 -c 1 2>&1)
      rc=$?
      if [ $rc -ne 0 ] && grep -q 'does not compile for' <<<"$out"; then
        continue # the algorithm's `where` excludes this rank count
      fi
      runs=$((runs + 1))
      rows=$((rows + $(grep -cE '^ +[0-9]+ +[0-9]+ ' <<<"$out")))
      if [ $rc -ne 0 ] || ! grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
        failed=1
        echo "FAIL: $algo --ranks $n (exit $rc):"
        grep -E 'error|FAILED|Out of bounds' <<<"$out" | head -5
      fi
    done
  done
  echo "matrix: $runs runs, $rows rows, $([ $failed -eq 0 ] && echo '0 wrong' || echo 'FAILURES above')"
  return $failed
}
