#!/usr/bin/env bash
# A full-page screenshot of a report (report.html or compare.html) at a given width, with
# headless Chromium, so that the report's look is checked by eye before a release:
#   bash benchmarks/screenshot.sh runs/default/report.html [out.png] [width]
# Chromium comes from Debian's package, installed here if absent (needs root and apt).
set -euo pipefail
page="${1:?usage: screenshot.sh REPORT.html [OUT.png] [WIDTH]}"
out="${2:-${page%.html}.png}"
width="${3:-1280}"
if ! command -v chromium >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
# a tall window: Chromium's headless screenshot is of the window, not the whole page
height=$(python3 - "$page" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
rows = text.count("<tr>") + text.count("<p>") + text.count("<li>")
images = len(re.findall(r"<img ", text))
print(max(2000, 60 * rows + 1000 * images))
PY
)
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size="${width},${height}" --screenshot="$out" "file://$(realpath "$page")" \
    2>/dev/null
echo "wrote: $out (${width} x ${height} px)"
