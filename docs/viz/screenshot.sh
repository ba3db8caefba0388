#!/usr/bin/env bash
# The pictures README.md shows: `collc viz` of ring and tree allreduce at 4 ranks as SVG, and a PNG screenshot of
# the stepping HTML page taken by headless chromium (`apt-get install -y chromium`, as .ci/run does).
#
#   docs/viz/screenshot.sh            # builds the release binary if needed
#   COLLC=target/debug/collc docs/viz/screenshot.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

collc=${COLLC:-target/release/collc}
if [ -z "${COLLC:-}" ]; then
  cargo build --release -p collc
fi
chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chromium" ]; then
  echo "screenshot.sh: no chromium on PATH; run .ci/run or apt-get install -y chromium" >&2
  exit 2
fi

"$collc" viz allreduce/ring --ranks 4 --output docs/viz/allreduce_ring.svg
"$collc" viz allreduce/tree --ranks 4 --pipeline 1 --output docs/viz/allreduce_tree.svg

page=$(mktemp --suffix=.html)
trap 'rm -f "$page"' EXIT
"$collc" viz allreduce/ring --ranks 4 --output "$page"
# `#step=3`: the page as it stands after step 3, that column highlighted and the first sums stored.
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,1020 \
  --screenshot="$PWD/docs/viz/allreduce_ring_page.png" "file://$page#step=3" 2>/dev/null
echo "wrote docs/viz/allreduce_ring.svg, docs/viz/allreduce_tree.svg, docs/viz/allreduce_ring_page.png"
