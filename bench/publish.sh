#!/usr/bin/env bash
# Copy an experiment's report (Markdown, PNGs, stats.json, runs.csv, provenance.json) into
# docs/results/NAME so the figures live in the repository; the run directories themselves stay out of git.
#   bash bench/publish.sh bench/results/EXPERIMENT NAME
set -euo pipefail
exp="$1"; name="$2"
.venv/bin/reflectrl report "$exp" >/dev/null
mkdir -p "docs/results/$name"
cp "$exp/report/report.md" "$exp/report/stats.json" "$exp/report/runs.csv" "$exp/report/provenance.json" \
  "$exp"/report/*.png "docs/results/$name/"
echo "docs/results/$name"
