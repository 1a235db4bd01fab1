"""examples/experiments/vs_baseline.py: several runs.csv files read as one experiment, duplicates refused."""

import csv
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "experiments" / "vs_baseline.py"
FIELDS = ["env", "algo", "seed", "status", "final", "auc"]


def write(path: Path, rows: list[tuple]) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        w.writerows(rows)
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_parts_read_as_one_experiment(tmp_path):
    base = write(tmp_path / "a.csv", [("e", "ppo", s, "finished", 0.1 * s, 0.0) for s in range(1, 7)])
    # the variant ends 1.0 above the baseline on every seed; one unfinished run is left out
    part = write(tmp_path / "b.csv", [("e", "ppo+x", s, "finished", 0.1 * s + 1.0, 0.0) for s in range(1, 7)]
                 + [("e", "ppo+x", 7, "stopped", "", "")])
    out = tmp_path / "t.md"
    res = run(base, part, "--pairs", "ppo+x:ppo", "--metric", "final", "--summary", "--out", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "1 unfinished run(s) left out" in text
    assert "| ppo+x | ppo | 6 / 6 | +1.000" in text and "**better**" in text
    assert "| ppo+x | 6 |" in text and "1: 1.1, 2: 1.2" in text  # every seed's value, by seed


def test_a_run_finished_in_two_files_is_refused(tmp_path):
    a = write(tmp_path / "a.csv", [("e", "ppo", 1, "finished", 0.5, 0.1)])
    b = write(tmp_path / "b.csv", [("e", "ppo", 1, "finished", 0.4, 0.1)])
    res = run(a, b, "--pairs", "ppo:ppo")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "e/ppo/1 is finished in both" in res.stderr


def test_pairs_that_cannot_inform_are_untestable_and_outside_holm(tmp_path):
    # MiniGrid's fixed reference: 0 to 1; both entries at 0 on every seed, and a third that solves every seed
    rows = [("MiniGrid-Empty-5x5-v0", a, s, "finished", v, v) for s in range(1, 7)
            for a, v in (("ppo", 0.0), ("ppo+x", 0.0), ("ppo+y", 0.5 + 0.05 * s))]
    res = run(write(tmp_path / "a.csv", rows), "--pairs", "ppo+x:ppo,ppo+y:ppo", "--metric", "final")
    assert res.returncode == 0, res.stderr
    assert "| ppo+x | ppo | 6 / 6 | +0.000 [+0.000, +0.000] | | | | **untestable: both at the floor** |" in res.stdout
    assert "Holm over the 2 one-sided tests" in res.stdout and "of the env's fixed reference range" in res.stdout
    assert "| ppo+y | ppo |" in res.stdout and "**better**" in res.stdout
