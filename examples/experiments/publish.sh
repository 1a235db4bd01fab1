#!/usr/bin/env bash
# Copy an experiment's report (Markdown, PNGs, stats.json, runs.csv, provenance.json) into
# docs/results/NAME so the figures live in the repository; the run directories themselves stay out of git.
# Every figure goes in as WebP (docs/ keeps its images under 6 MB, tests/test_docs_size.py), with report.md's
# links following them: the tall diagnostics and exploration figures at 60% size, quality 55; the others
# (curves_*, final_*, any other PNG copied) at full size, lossless or quality 80 (the smaller), kept as PNG where
# neither WebP is smaller (the report's PNGs are paletted, and a lossy WebP of a plain plot is often larger).
#   bash examples/experiments/publish.sh bench/results/EXPERIMENT NAME [--text-only]
# --text-only: no figures (the report's image lines dropped, with a line saying so), for secondary experiments
# once docs/ is near its image budget.
set -euo pipefail
exp="$1"; name="$2"; mode="${3:-}"
.venv/bin/reflectrl report "$exp" >/dev/null
mkdir -p "docs/results/$name"
if [ "$mode" = "--text-only" ]; then
  cp "$exp/report/stats.json" "$exp/report/runs.csv" "$exp/report/provenance.json" "docs/results/$name/"
  .venv/bin/python - "$exp/report/report.md" "docs/results/$name/report.md" <<'PY'
import re
import sys

text = open(sys.argv[1]).read()
lines = [line for line in text.splitlines() if not re.match(r"^\s*!\[.*\]\(.*\.(png|webp|gif)\)\s*$", line)]
text = re.sub(r"!\[[^\]]*\]\([^)]*\.(png|webp|gif)\)", "", "\n".join(lines) + "\n")
text = text.replace("\n## Results", "\n(Figures not published, to keep docs/ under its image budget: `reflectrl report` "
                    "on the experiment draws them.)\n\n## Results", 1)
open(sys.argv[2], "w").write(text)
PY
  echo "docs/results/$name"
  exit 0
fi
cp "$exp/report/report.md" "$exp/report/stats.json" "$exp/report/runs.csv" "$exp/report/provenance.json" \
  "$exp"/report/*.png "docs/results/$name/"
.venv/bin/python - "docs/results/$name" <<'PY'
import sys
from pathlib import Path

from PIL import Image

folder = Path(sys.argv[1])
report = folder / "report.md"
text = report.read_text()
for png in sorted(folder.glob("*.png")):
    webp = png.with_suffix(".webp")
    if png.name.startswith(("diagnostics_", "exploration_")):
        image = Image.open(png).convert("RGB")
        image = image.resize((int(image.width * 0.6), int(image.height * 0.6)), Image.LANCZOS)
        image.save(webp, "WEBP", quality=55, method=6)
    else:
        image = Image.open(png)
        image.load()
        rgba = image.convert("RGBA")
        transparent = rgba.getchannel("A").getextrema()[0] < 255
        image = rgba if transparent else image.convert("RGB")
        sizes = {}
        for kind, options in (("lossless", {"lossless": True}), ("lossy", {"quality": 80})):
            image.save(webp, "WEBP", method=6, **options)
            sizes[kind] = webp.stat().st_size
        if min(sizes.values()) >= png.stat().st_size:
            webp.unlink()  # no smaller: the PNG stays, and so does its link
            continue
        if sizes["lossless"] <= sizes["lossy"]:
            image.save(webp, "WEBP", method=6, lossless=True)
    text = text.replace(f"]({png.name})", f"]({webp.name})")
    png.unlink()
report.write_text(text)
PY
echo "docs/results/$name"
