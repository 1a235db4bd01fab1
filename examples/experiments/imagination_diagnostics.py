"""Per-entry diagnostics of a shaping experiment (imagination: docs/imagination.md): for each entry, the
median over seeds of each run's mean over its last 30 iterations of the shaping, label-fit, world-model
and cost metrics, as a markdown table.

    python examples/experiments/imagination_diagnostics.py bench/results/imagine-grid12-5s
"""
import glob
import json
import statistics
import sys
from collections import defaultdict

KEYS = ["shaping_mean", "label_r2", "label_r2_heldout", "model_error", "model_reward_error", "imagined_share",
        "signal_time_fraction", "steps_per_second"]
per = defaultdict(lambda: defaultdict(list))
for d in sorted(glob.glob(sys.argv[1] + "/runs/*/*/seed*/")):
    entry = d.split("/")[-3]
    rows = [json.loads(line) for line in open(d + "metrics.jsonl")]
    for k in KEYS:
        v = [r[k] for r in rows[-30:] if r.get(k) is not None]
        if v:
            per[entry][k].append(sum(v) / len(v))
print("| entry | " + " | ".join(KEYS) + " |")
print("|---|" + "---|" * len(KEYS))
for entry, vals in per.items():
    cells = [f"{statistics.median(vals[k]):.4g}" if vals.get(k) else "" for k in KEYS]
    print(f"| `{entry}` | " + " | ".join(cells) + " |")
