"""Tuned vs tuned: sweep PPO and each seed method with the same number of trials, then re-run
every winner on fresh seeds in one `reflectrl compare` (one report, one PPO baseline).

    python examples/experiments/tuned_vs_tuned.py --env MiniGrid-DoorKey-8x8-v0 --total-steps 1000000 \
        --trials 8 --rerun-seeds 10 --set backend=envpool --out bench/results/tuned-doorkey8

Each sweep tunes --trial-seeds seeds per trial (seeds 1..K) and runs with --rerun-seeds 0; the
re-run uses seeds K+1..K+M, none of which the search saw (the winner's curse). Every entry's
search covers PPO's base knobs (learning_rate, ent_coef) as well as its own signal's main knobs,
with the same trial budget (issue 40: tuned vs tuned done right); --own-knobs-only is the earlier
protocol (PPO tunes the base knobs, each method only its own, over PPO's defaults). On
backend=jax shaping's modes are direct and potential (advice is torch-only). Sweeps run two at
a time (one process each); everything resumes: re-run the same command after a stop. An algo given
twice (a signal's seed form and its exploration form, e.g. ppo+calibration and
ppo+calibration[mode=uncertainty]) carries its winner's knobs in its own brackets in the re-run
(its label there lists them), since --set ALGO.KNOB would reach both.

The searches' table (per entry: trials done and pruned, trials that earned any reward, the best
trial's AUC, final return and knobs) goes to OUT/searches.md once the sweeps end; --searches-table
prints it for the sweeps finished so far and runs nothing.

    python examples/experiments/tuned_vs_tuned.py --env navix:Navix-DoorKey-Random-8x8-v0 --total-steps 1000000 \
        --algos ppo,ppo+count,ppo+calibration,ppo+shaping,ppo+gear --trials 12 --trial-seeds 2 \
        --rerun-seeds 10 --set backend=jax num_envs=16 --out runs/x40/tuned-jax-doorkey8
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BASE = ["learning_rate=loguniform(1e-4,1e-3)", "ent_coef=loguniform(1e-3,5e-2)"]
COUNT = ["count.beta=loguniform(1e-3,0.1)", "count.schedule=choice(constant,linear)"]
RND = ["rnd.int_coef=loguniform(0.1,3)", "rnd.schedule=choice(constant,linear,exponential)"]
SPACES = {
    "ppo": BASE,
    "ppo+count": COUNT,
    "ppo+calibration": ["calibration.alpha=loguniform(1e-3,0.5)", "calibration.clip_k=uniform(1,5)"],
    "ppo+shaping": ["shaping.mode=choice(direct,potential,advice)", "shaping.eta=loguniform(0.02,0.5)"],
    "ppo+gear": ["gear.temperature=loguniform(0.5,8)", "gear.top_frac=uniform(0.1,0.5)"],
    # issue 42: the exploration baselines and the signals' exploration forms (an entry with brackets is
    # swept as its algo with the bracket's knobs fixed, and re-run under its own label)
    "ppo+rnd": RND,
    "ppo+calibration[mode=uncertainty]": ["calibration.alpha=loguniform(0.01,2)",
                                          "calibration.ensemble_target=choice(normalized,raw)",
                                          "calibration.schedule=choice(constant,linear)"],
    "ppo+count+shaping[mode=potential;distill=total]": [*COUNT, "shaping.scale=loguniform(0.02,0.5)"],
    "ppo+rnd+gear[advantage=total]": [*RND, "gear.temperature=loguniform(0.5,8)"],
    # issue 59: the exploration forms on the tuned count bonus
    "ppo+count+calibration[mode=uncertainty]": [*COUNT, "calibration.alpha=loguniform(0.01,2)",
                                                "calibration.schedule=choice(constant,linear)"],
    "ppo+count+gear[advantage=total]": [*COUNT, "gear.temperature=loguniform(0.5,8)"],
}


def reflectrl() -> list[str]:
    return [sys.executable, "-m", "reflectrl"]


def space(algo: str, args) -> list[str]:
    """The knobs an entry's search tunes: its own, and PPO's base knobs unless --own-knobs-only."""
    own = list(SPACES[algo])
    if "backend=jax" in args.set:  # the JAX backend has no advice mode
        own = [k.replace("choice(direct,potential,advice)", "choice(direct,potential)") for k in own]
    if algo == "ppo" or args.own_knobs_only:
        return own
    return [*BASE, *own]


def entry_of(label: str):
    """(the algo a sweep runs, the knobs the entry's brackets fix) of an --algos label."""
    from reflectrl.experiments.spec import parse_entry

    entry = parse_entry(label)
    return entry.algo, list(entry.overrides)


def sweep(algo: str, args) -> Path:
    name, fixed = entry_of(algo)
    out = sweep_dir(algo, args)
    cmd = [*reflectrl(), "sweep", "--env", args.env, "--algo", name, "--space", *space(algo, args),
           "--trials", str(args.trials), "--seeds", str(args.trial_seeds), "--total-steps", str(args.total_steps),
           "--rerun-seeds", "0", "--workers", "1", "--out", str(out)]
    if args.wrapper:
        cmd += ["--wrapper", args.wrapper]
    if args.set or fixed:
        cmd += ["--set", *args.set, *fixed]
    print("$", " ".join(cmd), flush=True)
    log = out.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"the sweep of {algo} failed (exit {code}); see {log}")
    return out


def sweep_dir(algo: str, args) -> Path:
    from reflectrl.experiments.spec import _slug

    return Path(args.out) / "sweeps" / _slug(algo.replace("+", "_"))


def searches_table(algos: list[str], args) -> str:
    """Markdown: one row per entry's search, read from its trials.csv and best.json."""
    lines = ["| entry | trials done (pruned; failed) | trials with a reward (AUC > 0) | best trial's AUC "
             f"({args.trial_seeds} seed{'s' if args.trial_seeds > 1 else ''}) | its final return | its knobs |",
             "|---|---|---|---|---|---|"]
    for algo in algos:
        where = sweep_dir(algo, args)
        table, best = where / "report" / "trials.csv", where / "best.json"
        if not table.exists() or not best.exists():
            lines.append(f"| {algo} | not finished | | | | |")
            continue
        rows = list(csv.DictReader(table.open()))
        states = [r["state"] for r in rows]
        scored = [r for r in rows if r["auc"] not in ("", None)]
        rewarded = sum(float(r["auc"]) > 0 for r in scored)
        top = json.loads(best.read_text())
        knobs = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in top["knobs"].items())
        lines.append(f"| {algo} | {states.count('complete') + states.count('pruned')}/{args.trials} "
                     f"({states.count('pruned')}; {states.count('fail')}) | {rewarded} of {len(scored)} | "
                     f"{top['auc']:.3f} | {top['final']:.3f} | {knobs} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--total-steps", type=int, required=True)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--trial-seeds", type=int, default=1, help="seeds per trial (1..K; default 1)")
    parser.add_argument("--own-knobs-only", action="store_true",
                        help="the earlier protocol: each method tunes only its own knobs over PPO's defaults")
    parser.add_argument("--rerun-seeds", type=int, default=10)
    parser.add_argument("--algos", default=",".join(SPACES), help="comma-separated, from: " + ", ".join(SPACES))
    parser.add_argument("--wrapper", default=None, help="reward wrapper for every run: sparse or delayed:K")
    parser.add_argument("--set", nargs="+", default=[], help="fixed knobs for every run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--searches-table", action="store_true",
                        help="print the searches' table for the sweeps finished so far; run nothing")
    args = parser.parse_args()
    algos = args.algos.split(",")
    unknown = [a for a in algos if a not in SPACES]
    if unknown or "ppo" not in algos:
        raise SystemExit(f"--algos: give ppo and any of {', '.join(SPACES)} (unknown: {', '.join(unknown) or '-'})")
    names = [entry_of(a)[0] for a in algos]
    # the re-run's --set ALGO.KNOB reaches every entry of an algo: an algo given twice (its seed form and its
    # exploration form) carries its winner's knobs in its own brackets instead, and is labelled so
    shared = {n for n in names if names.count(n) > 1}

    if args.searches_table:
        print(searches_table(algos, args), end="")
        return

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        dirs = dict(zip(algos, pool.map(lambda a: sweep(a, args), algos)))
    (Path(args.out) / "searches.md").write_text(searches_table(algos, args))

    sets, labels = list(args.set), []
    for algo, where in dirs.items():
        best = json.loads((where / "best.json").read_text())
        print(f"{algo}: best trial {best['trial']} ({best['objective']} {best['value']:.4g}): "
              + ", ".join(best["set"]), flush=True)
        name, fixed = entry_of(algo)
        if name in shared:
            labels.append(f"{name}[{';'.join([*fixed, *best['set']])}]")
        else:
            labels.append(algo)
            sets += [f"{name}.{item}" for item in best["set"]]
    cmd = [*reflectrl(), "compare", "--env", args.env, "--algos", ",".join(labels), "--seeds", str(args.rerun_seeds),
           "--first-seed", str(args.trial_seeds + 1), "--total-steps", str(args.total_steps),
           "--workers", str(args.workers), "--no-progress", "--out", str(Path(args.out) / "rerun"), "--set", *sets]
    if args.wrapper:
        cmd += ["--wrapper", args.wrapper]
    print("$", " ".join(cmd), flush=True)
    raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
