"""examples/experiments/tuned_vs_tuned.py --searches-table: the searches' table read from each sweep's files."""

import csv
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "experiments" / "tuned_vs_tuned.py"


def sweep(root: Path, slug: str, rows: list[tuple], best: dict) -> None:
    where = root / "sweeps" / slug
    (where / "report").mkdir(parents=True)
    with open(where / "report" / "trials.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["number", "state", "learning_rate", "objective", "final", "auc"])
        w.writerows(rows)
    (where / "best.json").write_text(json.dumps(best))


def test_searches_table_counts_trials_and_names_the_winner(tmp_path):
    sweep(tmp_path, "ppo", [(0, "complete", 1e-4, 0.0, 0.0, 0.0), (1, "complete", 3e-4, 0.2, 0.5, 0.2),
                            (2, "pruned", 5e-4, "", "", ""), (3, "fail", 7e-4, "", "", "")],
          {"trial": 1, "auc": 0.2, "final": 0.5, "knobs": {"learning_rate": 3e-4}})
    res = subprocess.run([sys.executable, str(SCRIPT), "--env", "e", "--total-steps", "1000", "--trials", "4",
                          "--trial-seeds", "2", "--algos", "ppo,ppo+count", "--out", str(tmp_path),
                          "--searches-table"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "best trial's AUC (2 seeds)" in lines[0]
    # 3 of 4 trials ran to an end or were pruned, 1 failed; of the 2 scored, 1 earned a reward
    assert lines[2] == "| ppo | 3/4 (1; 1) | 1 of 2 | 0.200 | 0.500 | learning_rate=0.0003 |"
    assert lines[3] == "| ppo+count | not finished | | | | |"
    assert not (tmp_path / "searches.md").exists()  # the table-only mode runs and writes nothing
