"""Tuned vs tuned: sweep PPO and each seed method with the same number of trials, then re-run
every winner on fresh seeds in one `reflectrl compare` (one report, one PPO baseline).

    python bench/tuned_vs_tuned.py --env MiniGrid-DoorKey-8x8-v0 --total-steps 1000000 \
        --trials 8 --rerun-seeds 10 --set backend=envpool --out bench/results/tuned-doorkey8

Each sweep tunes one seed per trial (seed 1) and runs with --rerun-seeds 0; the re-run uses
seeds 2..M+1, none of which the search saw (the winner's curse). PPO's sweep tunes
learning_rate and ent_coef; each method's sweep tunes its own signal's main knobs over PPO's
defaults, with the same trial budget. Sweeps run two at a time (one process each); everything
resumes: re-run the same command after a stop.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SPACES = {
    "ppo": ["learning_rate=loguniform(1e-4,1e-3)", "ent_coef=loguniform(1e-3,5e-2)"],
    "ppo+calibration": ["calibration.alpha=loguniform(1e-3,0.5)", "calibration.clip_k=uniform(1,5)"],
    "ppo+shaping": ["shaping.mode=choice(direct,potential,advice)", "shaping.eta=loguniform(0.02,0.5)"],
    "ppo+gear": ["gear.temperature=loguniform(0.5,8)", "gear.top_frac=uniform(0.1,0.5)"],
}


def reflectrl() -> list[str]:
    return [sys.executable, "-m", "reflectrl"]


def sweep(algo: str, args) -> Path:
    out = Path(args.out) / "sweeps" / algo.replace("+", "_")
    cmd = [*reflectrl(), "sweep", "--env", args.env, "--algo", algo, "--space", *SPACES[algo],
           "--trials", str(args.trials), "--seeds", "1", "--total-steps", str(args.total_steps),
           "--rerun-seeds", "0", "--workers", "1", "--out", str(out)]
    if args.wrapper:
        cmd += ["--wrapper", args.wrapper]
    if args.set:
        cmd += ["--set", *args.set]
    print("$", " ".join(cmd), flush=True)
    log = out.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"the sweep of {algo} failed (exit {code}); see {log}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--total-steps", type=int, required=True)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rerun-seeds", type=int, default=10)
    parser.add_argument("--algos", default=",".join(SPACES), help="comma-separated, from: " + ", ".join(SPACES))
    parser.add_argument("--wrapper", default=None, help="reward wrapper for every run: sparse or delayed:K")
    parser.add_argument("--set", nargs="+", default=[], help="fixed knobs for every run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    algos = args.algos.split(",")
    unknown = [a for a in algos if a not in SPACES]
    if unknown or "ppo" not in algos:
        raise SystemExit(f"--algos: give ppo and any of {', '.join(SPACES)} (unknown: {', '.join(unknown) or '-'})")

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        dirs = dict(zip(algos, pool.map(lambda a: sweep(a, args), algos)))

    sets = list(args.set)
    for algo, where in dirs.items():
        best = json.loads((where / "best.json").read_text())
        print(f"{algo}: best trial {best['trial']} ({best['objective']} {best['value']:.4g}): "
              + ", ".join(best["set"]), flush=True)
        sets += [f"{algo}.{item}" for item in best["set"]]
    cmd = [*reflectrl(), "compare", "--env", args.env, "--algos", ",".join(algos), "--seeds", str(args.rerun_seeds),
           "--first-seed", "2", "--total-steps", str(args.total_steps), "--workers", str(args.workers),
           "--no-progress", "--out", str(Path(args.out) / "rerun"), "--set", *sets]
    if args.wrapper:
        cmd += ["--wrapper", args.wrapper]
    print("$", " ".join(cmd), flush=True)
    raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
