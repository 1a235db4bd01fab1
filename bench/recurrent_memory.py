"""Memory check: PPO with a recurrent policy (policy=gru, lstm) against the feed-forward one (mlp) on a task
that needs memory, CartPole-v1 with its velocities hidden (--wrapper mask_velocity, sb3-contrib's
MaskVelocityWrapper): the pole's angle and the cart's position alone do not say where they are going.

Every (policy, seed) is an ordinary `reflectrl train` run directory under --out, a few at a time; running the
script again skips finished runs and resumes interrupted ones. It prints each seed's final return (the mean
true episodic return of the training episodes in the last 5% of the steps, as bench/learning.py), each
policy's IQM, and the IQM difference of each recurrent policy minus mlp with its 95% stratified-bootstrap CI
(reflectrl.report.stats, what `reflectrl report` uses), and writes them to OUT/summary.md.

    python bench/recurrent_memory.py --out bench/results/recurrent_memory [--policies mlp,gru,lstm]
                                     [--seeds 5] [--total-steps 100000] [--parallel 1] [--summary-only]

The knobs are the same for every policy: the SB3 zoo's for RecurrentPPO on CartPoleNoVel-v1 (learning rate
1e-3 annealed, gamma 0.98, GAE lambda 0.8, no entropy bonus), with 16 envs x 32 steps, 2 minibatches (8 envs'
32-step sequences each for a recurrent policy) and 8 epochs: short sequences of many envs, since a CPU's
recurrent update costs by the sequence's length (nn.GRU has no fused CPU kernel; nn.LSTM's oneDNN one helps
on long stretches without an episode start).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from _jobs import run_jobs  # bench/_jobs.py, beside this script

ENV, WRAPPER = "CartPole-v1", "mask_velocity"
KNOBS = ["num_envs=16", "num_steps=32", "num_minibatches=2", "update_epochs=8", "learning_rate=1e-3",
         "gamma=0.98", "gae_lambda=0.8", "ent_coef=0.0"]
TAIL = 0.05  # the share of the steps, at the end, whose training episodes make the final return


def command(run: Path, policy: str, seed: int, total_steps: int) -> list[str]:
    if run.exists():
        return [sys.executable, "-m", "reflectrl", "train", "--resume", str(run), "--no-progress"]
    return [sys.executable, "-m", "reflectrl", "train", "--algo", "ppo", "--env", ENV, "--wrapper", WRAPPER,
            "--seed", str(seed), "--total-steps", str(total_steps), "--out", str(run), "--no-progress",
            "--set", f"policy={policy}", *KNOBS]


def run_all(out: Path, policies: list[str], seeds: int, total_steps: int, parallel: int) -> None:
    jobs = []
    for seed in range(1, seeds + 1):  # seed by seed, so that a cut-short bench has every policy's first seeds
        for policy in policies:
            run = out / policy / f"seed{seed}"
            if (run / "run.json").exists() and json.loads((run / "run.json").read_text()).get("status") == "finished":
                continue
            jobs.append(command(run, policy, seed, total_steps))
    run_jobs(jobs, parallel, shown_from=3)


def final_return(run: Path, total_steps: int) -> float | None:
    """The mean true episodic return of the training episodes in the run's last TAIL of steps."""
    steps, returns = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("episodic_return") is not None:
            steps.append(row["global_step"])
            returns.append(row["episodic_return"])
    if not steps or json.loads((run / "run.json").read_text()).get("status") != "finished":
        return None
    steps, returns = np.array(steps), np.array(returns)
    return float(returns[steps >= steps[-1] - TAIL * total_steps].mean())


def minutes(run: Path) -> float:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sum(row["global_step"] - before for row, before in
               zip(rows, [0] + [r["global_step"] for r in rows[:-1]])) / np.median(
        [r["steps_per_second"] for r in rows]) / 60


def summarise(out: Path, policies: list[str], seeds: int, total_steps: int) -> str:
    from reflectrl.report import stats

    finals: dict[str, list[float]] = {}
    lines = [f"{ENV} with --wrapper {WRAPPER}, {total_steps:,} steps, --set {' '.join(KNOBS)}", "",
             "| policy | " + " | ".join(f"seed {s}" for s in range(1, seeds + 1)) + " | IQM | minutes per run |",
             "|---|" + "---|" * (seeds + 2)]
    for policy in policies:
        runs = [out / policy / f"seed{s}" for s in range(1, seeds + 1)]
        values = [final_return(run, total_steps) if (run / "metrics.jsonl").exists() else None for run in runs]
        done = [v for v in values if v is not None]
        finals[policy] = done
        took = [minutes(run) for run, v in zip(runs, values) if v is not None]
        lines.append(f"| {policy} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in values) +
                     f" | {stats.iqm(np.array(done)[:, None]) if done else float('nan'):.1f} | "
                     f"{np.mean(took) if took else float('nan'):.1f} |")
    lines.append("")
    for policy in policies:
        if policy == "mlp" or len(finals.get(policy, [])) < 2 or len(finals.get("mlp", [])) < 2:
            continue
        point, lo, hi = stats.interval([np.array(finals[policy])[:, None], np.array(finals["mlp"])[:, None]],
                                       stats.iqm_difference)
        lines.append(f"IQM difference {policy} - mlp: {point:+.1f}, 95% CI [{lo:+.1f}, {hi:+.1f}] "
                     f"({len(finals[policy])} and {len(finals['mlp'])} seeds)")
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/recurrent_memory")
    parser.add_argument("--policies", default="mlp,gru,lstm")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--total-steps", type=int, default=100_000)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        run_all(out, policies, args.seeds, args.total_steps, args.parallel)
    print(summarise(out, policies, args.seeds, args.total_steps))


if __name__ == "__main__":
    main()
