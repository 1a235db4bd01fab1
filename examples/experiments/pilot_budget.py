"""Pilot: the budget at which an entry (tuned PPO) solves part of the seeds.

Issue 59's decisive comparisons sit where the baseline partly solves the task: for each budget
given, smallest first, this runs the entry on fresh seeds (one `reflectrl compare` per budget, in the
order given, resumable) and counts the seeds it solves ("solved": final return >= the env's fixed reference's
solved score, report/references.py; the one definition of docs/evidence.md). It stops at the
first budget whose solved fraction lies in --target (default 0.3-0.7), unless --all, and where the next
budget cannot help (a larger one after a fraction above the target, a smaller one after one below).

    python examples/experiments/pilot_budget.py --env navix:Navix-DoorKey-Random-8x8-v0 --algo ppo \
        --budgets 2000000,3000000 --seeds 10 --first-seed 101 \
        --set backend=jax num_envs=16 learning_rate=0.000747 ent_coef=0.0442 --out runs/pilot/doorkey8

Writes OUT/pilot.json and OUT/pilot.md (per budget: solved k/n, per-seed final returns, the
chosen budget and why), rewritten after every budget so a stop loses nothing finished.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from reflectrl.report.references import reference_for


def run_budget(args, budget: int, out: Path) -> list[dict]:
    """Run (or resume) one budget's compare and return its finished runs' rows."""
    cmd = [sys.executable, "-m", "reflectrl", "compare", "--env", args.env, "--algos", args.algo,
           "--seeds", str(args.seeds), "--first-seed", str(args.first_seed), "--total-steps", str(budget),
           "--out", str(out), "--no-progress"]
    if args.set:
        cmd += ["--set", *args.set]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False)
    runs_csv = out / "report" / "runs.csv"
    if not runs_csv.exists():
        sys.exit(f"pilot: {runs_csv} was not written (see the compare's output above)")
    with runs_csv.open() as f:
        return [row for row in csv.DictReader(f) if row["status"] == "finished"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", required=True)
    p.add_argument("--algo", default="ppo")
    p.add_argument("--budgets", required=True, help="comma-separated env steps, tried in this order")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=101, help="seeds no search and no re-run uses")
    p.add_argument("--target", default="0.3,0.7", help="solved fraction wanted: LOW,HIGH")
    p.add_argument("--all", action="store_true", help="run every budget, not only up to the first in target")
    p.add_argument("--set", nargs="+", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args()

    ref = reference_for(args.env)
    if ref is None or ref.solved is None:
        sys.exit(f"pilot: {args.env} has no fixed reference with a solved score (report/references.py); "
                 "add one there first")
    budgets = [int(float(b)) for b in args.budgets.split(",")]
    low, high = (float(x) for x in args.target.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, chosen, note = [], None, ""
    for k, budget in enumerate(budgets):
        runs = run_budget(args, budget, out / f"budget-{budget}")
        finals = {int(r["seed"]): float(r["final"]) for r in runs}
        solved = sum(v >= ref.solved for v in finals.values())
        frac = solved / len(finals) if finals else float("nan")
        rows.append({"budget": budget, "finished": len(finals), "solved": solved, "fraction": frac,
                     "finals": finals, "folder": str(out / f"budget-{budget}")})
        if chosen is None and low <= frac <= high:
            chosen = budget
        following = budgets[k + 1] if k + 1 < len(budgets) else None
        if following is not None and chosen is None and not args.all:
            if frac > high and following > budget:
                note = f"{budget:,} already solves more than the target: try budgets below it"
            elif frac < low and following < budget:
                note = f"{budget:,} solves less than the target: try budgets above it"
        write(out, args, ref.solved, rows, chosen, note)
        if (chosen is not None or note) and not args.all:
            break
    print((out / "pilot.md").read_text())


def write(out: Path, args, solved_score: float, rows: list[dict], chosen: int | None, note: str) -> None:
    data = {"env": args.env, "algo": args.algo, "set": args.set, "seeds": args.seeds, "first_seed": args.first_seed,
            "solved_score": solved_score, "target": args.target, "budgets": rows, "chosen_budget": chosen, "note": note}
    (out / "pilot.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# Pilot: {args.algo} on {args.env}", "",
             f"Knobs: `{' '.join(args.set) or '(defaults)'}`; "
             f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}; "
             f"solved: final return >= {solved_score:g}; target solved fraction {args.target}.", "",
             "| budget (env steps) | seeds solved | final return per seed |", "|---|---|---|"]
    for r in rows:
        finals = " ".join(f"{v:.2f}" for _, v in sorted(r["finals"].items()))
        lines.append(f"| {r['budget']:,} | {r['solved']}/{r['finished']} | {finals} |")
    verdict = f"Chosen budget: {chosen:,}" if chosen else f"No budget tried lands in the target yet. {note}".strip()
    lines += ["", verdict]
    (out / "pilot.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
