"""Learning parity: reflectrl PPO against CleanRL's (and the SB3 zoo's) published numbers.

Runs each (env, seed) as an ordinary `reflectrl train` run directory, a few at a time, then
prints and writes a Markdown table and a learning-curve PNG per env. Running it again skips
finished runs and resumes interrupted ones.

    python bench/learning.py --out bench/results/learning [--envs cartpole,halfcheetah,lunarlander]
                             [--seeds 3] [--parallel 2] [--summary-only]

"Final return" is the mean true episodic return over the last 5% of training steps (training
episodes, as CleanRL's reported curves), averaged per seed; mean +- std over seeds. The
deterministic evaluation (20 episodes of the final policy) is what RL Zoo's numbers are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from _jobs import run_jobs  # bench/_jobs.py, beside this script

SUITE = {
    "cartpole": dict(env="CartPole-v1", steps=500_000, set=[], reference="CleanRL ppo.py: 490.04 +- 6.12",
                     ref_mean=490.04),
    "halfcheetah": dict(env="HalfCheetah-v5", steps=1_000_000, set=[],
                        reference="CleanRL ppo_continuous_action.py (v4): 2905.85 +- 1129.37", ref_mean=2905.85),
    # the SB3 zoo's tuned LunarLander settings
    "lunarlander": dict(env="LunarLander-v3", steps=1_000_000,
                        set=["num_envs=16", "num_steps=1024", "num_minibatches=256", "update_epochs=4",
                             "gae_lambda=0.98", "gamma=0.999", "ent_coef=0.01"],
                        reference="SB3 zoo PPO (tuned): 242", ref_mean=242.0),
}


def run_all(out: Path, names: list[str], seeds: int, parallel: int) -> None:
    jobs = []
    for name in names:
        spec = SUITE[name]
        for seed in range(1, seeds + 1):
            run = out / name / f"seed{seed}"
            status = {}
            if (run / "run.json").exists():
                status = json.loads((run / "run.json").read_text())
            if status.get("status") == "finished":
                continue
            if run.exists():
                cmd = [sys.executable, "-m", "reflectrl", "train", "--resume", str(run), "--no-progress"]
            else:
                cmd = [sys.executable, "-m", "reflectrl", "train", "--algo", "ppo", "--env", spec["env"],
                       "--seed", str(seed), "--total-steps", str(spec["steps"]), "--out", str(run), "--no-progress"]
                if spec["set"]:
                    cmd += ["--set", *spec["set"]]
            jobs.append(cmd)
    run_jobs(jobs, parallel, shown_from=2)


def curve(run: Path) -> tuple[np.ndarray, np.ndarray]:
    steps, rets = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("episodic_return") is not None:
            steps.append(row["global_step"])
            rets.append(row["episodic_return"])
    return np.array(steps), np.array(rets)


def summarise(out: Path, names: list[str], seeds: int) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reflectrl.evaluate import evaluate

    lines = ["| env | steps | seeds | final training return (mean +- std) | per seed | deterministic eval, 20 episodes "
             "(mean +- std over seeds) | sps (median) | reference |",
             "|---|---|---|---|---|---|---|---|"]
    for name in names:
        spec = SUITE[name]
        finals, sps, evals = [], [], []
        fig, ax = plt.subplots(figsize=(6, 4))
        for seed in range(1, seeds + 1):
            run = out / name / f"seed{seed}"
            if not (run / "metrics.jsonl").exists():
                continue
            steps, rets = curve(run)
            if len(steps) == 0:
                continue
            tail = steps >= steps[-1] - 0.05 * spec["steps"]
            finals.append(float(rets[tail].mean()))
            evals.append(evaluate(str(run), episodes=20, deterministic=True)["mean_return"])
            sps += [json.loads(x)["steps_per_second"] for x in (run / "metrics.jsonl").read_text().splitlines()]
            ax.plot(steps, rets, label=f"seed {seed}", alpha=0.8)
        if not finals:
            continue
        ax.axhline(spec["ref_mean"], color="k", ls="--", lw=1, label="reference mean")
        ax.set(title=f"PPO on {spec['env']}", xlabel="env steps", ylabel="episodic return (true)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        plt.close(fig)
        lines.append(f"| {spec['env']} | {spec['steps']:,} | {len(finals)} | "
                     f"{np.mean(finals):.2f} +- {np.std(finals):.2f} | "
                     f"{', '.join(f'{f:.1f}' for f in finals)} | {np.mean(evals):.2f} +- {np.std(evals):.2f} "
                     f"({', '.join(f'{e:.1f}' for e in evals)}) | {np.median(sps):.0f} | {spec['reference']} |")
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/learning")
    parser.add_argument("--envs", default=",".join(SUITE))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"unknown env {unknown}; choose from {list(SUITE)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        run_all(out, names, args.seeds, args.parallel)
    print(summarise(out, names, args.seeds))


if __name__ == "__main__":
    main()
