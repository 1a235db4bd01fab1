"""Where each run of a `reflectrl compare` experiment stands, finished or not, read from its
metrics (for an experiment still running: the report counts only finished runs).

Per (entry, seed): status, the last logged env step, the step of the first non-zero reward, the
distinct state keys visited so far, and the mean return of the episodes in its last 10 logged
iterations that had any. Markdown table on stdout.

    python examples/experiments/experiment_status.py EXP_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reflectrl.experiments.spec import read_spec
from reflectrl.runs.files import live_status, read_logged_rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    args = parser.parse_args()
    root = Path(args.root)
    spec = read_spec(root)
    print(f"{root}: {spec.total_steps:,} steps per run\n")
    print("| entry | seed | status | step | first reward at | states visited | return, last 10 iterations |")
    print("|---|---|---|---|---|---|---|")
    for run in spec.runs(root):
        status = live_status(run.path)
        rows = read_logged_rows(run.path) if (run.path / "metrics.jsonl").exists() else []
        last = rows[-1] if rows else {}
        returns = [r["episodic_return"] for r in rows if r.get("episodic_return") is not None][-10:]
        mean = f"{sum(returns) / len(returns):.3f}" if returns else "-"
        first = last.get("first_reward_step")
        print(f"| {run.entry.label} | {run.seed} | {status} | {last.get('global_step', 0):,} | "
              f"{first if first is not None else 'none yet'} | {last.get('unique_states_total', '-')} | {mean} |")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # piped into `head`: stop quietly, as the CLI does
        sys.stderr.close()
        raise SystemExit(0)
