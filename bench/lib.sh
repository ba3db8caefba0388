# What the bench scripts share; sourced, not run. Each function is described where it is defined.

# collc_bin [FEATURES] -> the collc binary to time: $COLLC_BIN, else target/release/collc built with FEATURES
collc_bin() {
  if [ -n "${COLLC_BIN:-}" ]; then
    realpath "$COLLC_BIN"
    return
  fi
  cargo build --release -p collc ${1:+--features "$1"} >&2
  realpath target/release/collc
}

# column DIR SIDE K -> "size median" of column K (6: time_us, 8: busbw) of the out-of-place columns of the
# nccl-tests tables in DIR/SIDE.*.txt, over its runs, per size
column() {
  awk -v k="$3" '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ {print $1, $k}' "$1/$2".*.txt | sort -k1,1n -k2,2g | awk '
    function flush() { if (n) { print size, (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 } n = 0 }
    $1 != size { flush(); size = $1 } { v[++n] = $2 } END { flush() }'
}
