"""Final success of every finished run of a `reflectrl compare` experiment on goal tasks
(MiniGrid, the built-in grid world), where an episode succeeds when its true return is
positive (the goal reached; both pay only there).

Each run's last checkpoint is loaded into its own trainer (same env backend, same number of
envs, fresh episodes) and its policy runs as it ran in training (sampled actions, no
update) until every env has finished `--episodes-per-env` episodes; the first that many of
each env count, so long failing episodes weigh as much as short successes. Per (env,
entry): every seed's success rate, and their IQM with a stratified-bootstrap 95% CI
(`--reps` resamples; with fewer than 5 seeds the interval is only the range of the seeds).

    python examples/experiments/final_success.py EXP_DIR [--env ID,ID] [--episodes-per-env 5] [--reps 10000]
                                                 [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections import defaultdict

import numpy as np
import torch


def run_success(run_path, episodes_per_env: int, seed: int = 12345) -> tuple[float, int, int]:
    """(success rate, episodes counted, env steps taken) of a run's final policy."""
    from reflectrl.config import RunConfig
    from reflectrl.runs import RunDir
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    run = RunDir.open(run_path, kind="control")
    cfg = RunConfig.from_dict(run.config())
    trainer = PPOTrainer(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EnvPool's envs restart their episodes: wanted here
        trainer.load_state_dict(run.load_checkpoint())
    envs, agent = trainer.envs, trainer.agent
    obs, _ = envs.reset(seed=seed)  # fresh episodes in every env
    obs = torch.as_tensor(obs, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    returns: list[list[float]] = [[] for _ in range(envs.num_envs)]
    steps = 0
    with torch.no_grad():
        while min(len(r) for r in returns) < episodes_per_env:
            action, _ = agent.act(obs, generator)
            obs, _, _, _, info = envs.step(action.numpy())
            obs = torch.as_tensor(obs, dtype=torch.float32)
            steps += envs.num_envs
            final = info.get("final_info", {})
            if "episode" in final:
                for i in np.flatnonzero(final["_episode"]):
                    returns[i].append(float(final["episode"]["r"][i]))
    trainer.close()
    counted = [r for per_env in returns for r in per_env[:episodes_per_env]]
    return float(np.mean([r > 0 for r in counted])), len(counted), steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exp_dir")
    parser.add_argument("--episodes-per-env", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10000, help="bootstrap resamples")
    parser.add_argument("--json", default=None, help="write the per-run and per-entry results here")
    parser.add_argument("--env", default=None, help="only these envs of the experiment (comma-separated)")
    args = parser.parse_args()
    from pathlib import Path

    from reflectrl.experiments.spec import read_spec
    from reflectrl.report import stats
    from reflectrl.runs.files import run_status

    torch.set_num_threads(1)
    root = Path(args.exp_dir)
    spec = read_spec(root)
    per_run, skipped = [], []
    only = set(args.env.split(",")) if args.env else None
    for run in spec.runs(root):
        if only is not None and run.env_id not in only:
            continue
        status = (run_status(run.path) or {}).get("status")
        if status != "finished":
            skipped.append(f"{run.env_id} {run.entry.label} seed {run.seed} ({status or 'not started'})")
            continue
        rate, n, steps = run_success(run.path, args.episodes_per_env)
        per_run.append({"env": run.env_id, "algo": run.entry.label, "seed": run.seed, "success": rate,
                        "episodes": n, "env_steps": steps})
        print(f"{run.env_id} {run.entry.label} seed {run.seed}: success {rate:.3f} over {n} episodes "
              f"({steps:,} env steps)", file=sys.stderr, flush=True)
    groups = defaultdict(list)
    for r in per_run:
        groups[(r["env"], r["algo"])].append(r["success"])
    table = []
    print("| env | entry | seeds | success per seed | IQM [95% CI] |")
    print("|---|---|---|---|---|")
    for (env_id, algo), values in groups.items():
        m = np.array([values], dtype=float).T
        point, lo, hi = stats.interval([m], stats.iqm, args.reps)
        mark = " †" if len(values) < 5 else ""
        table.append({"env": env_id, "algo": algo, "seeds": len(values), "success": values,
                      "iqm": point, "ci": [lo, hi]})
        print(f"| {env_id} | {algo} | {len(values)} | {', '.join(f'{v:.2f}' for v in values)} | "
              f"{point:.2f} [{lo:.2f}, {hi:.2f}]{mark} |")
    if skipped:
        print(f"\nnot counted (unfinished): {'; '.join(skipped)}")
    if any(len(v) < 5 for v in groups.values()):
        print("† fewer than 5 seeds: the interval is the range of the seeds' bootstrap, not a reliable 95% CI")
    if args.json:
        out = {"experiment": str(root), "episodes_per_env": args.episodes_per_env, "reps": args.reps,
               "runs": per_run, "table": table, "unfinished": skipped}
        Path(args.json).write_text(json.dumps(out, indent=2, default=lambda x: None if math.isnan(x) else x) + "\n")


if __name__ == "__main__":
    main()
