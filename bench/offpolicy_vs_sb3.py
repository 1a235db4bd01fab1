"""reflectrl's DQN and SAC against Stable-Baselines3's on the same work, in one script.

Matched settings (CleanRL's hyperparameters on both sides, 1 torch thread, CPU):
* DQN on CartPole-v1: MLP 120-84 ReLU, lr 2.5e-4, buffer 10k, batch 128, learning_starts
  10k, a gradient step every 10 env steps, hard target copy every 500, epsilon 1 -> 0.05 over
  half of training; the Huber loss on both (SB3's DQN has no MSE option) and no gradient
  clip (SB3's max_grad_norm set to 1e9).
* SAC on Hopper-v5 / HalfCheetah-v5: MLP 256-256 ReLU actor and twin critics, batch 256,
  tau 0.005, learning_starts 5k, automatic entropy tuning, a Q-step per env step; SB3
  updates the actor every step, CleanRL's SAC twice every second step (the same work).
  SB3 has one learning rate: 3e-4 for both sides here (q_lr=3e-4 on ours).

`--mode speed`: env steps per second of each, `--repeats` times interleaved, the best run
counting (shared machines); prints the ratio reflectrl / SB3. In process by default (the
training call timed); `--whole-process` times whole processes instead (issue 61): `reflectrl
train` as a user runs it (start-up, training, metrics log, TensorBoard, final checkpoint)
against a fresh Python that imports SB3, builds the same model and learns (nothing written),
with each side's least CPU seconds beside the wall rates; `--before-src DIR` adds a third side,
`reflectrl train` run from another checkout's src/ (before/after figures in one script).
`--mode learn`: `--seeds` seeds of each at `--steps`; each trained policy is evaluated
deterministically (greedy) on the same 10 episode seeds; prints per-run scores, the means
and the difference with a bootstrap CI.

    python bench/offpolicy_vs_sb3.py --mode speed --algo dqn --steps 50000
    python bench/offpolicy_vs_sb3.py --mode speed --whole-process --algo dqn --steps 30000 --learning-starts 1000
    python bench/offpolicy_vs_sb3.py --mode speed --whole-process --algo sac --env Pendulum-v1 --steps 6000 \
        --learning-starts 1000
    python bench/offpolicy_vs_sb3.py --mode learn --algo dqn --steps 500000 --seeds 3 --json FILE
    python bench/offpolicy_vs_sb3.py --mode learn --algo dqn --steps 500000 --seeds 3 --dqn-loss mse --only reflectrl
    python bench/offpolicy_vs_sb3.py --mode learn --algo sac --env Hopper-v5 --steps 50000 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import gymnasium as gym
import numpy as np
import torch

EVAL_SEEDS = list(range(10_000, 10_010))


def evaluate(act, env_id: str) -> float:
    """Mean return of `act(obs) -> action` over the 10 fixed evaluation episodes."""
    env = gym.make(env_id)
    returns = []
    for seed in EVAL_SEEDS:
        obs, _ = env.reset(seed=seed)
        done, total = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(act(obs))
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns))


DQN_LOSS = "huber"  # --dqn-loss


def our_overrides(algo: str, learning_starts: int | None) -> list[str]:
    overrides = [f"loss={DQN_LOSS}"] if algo == "dqn" else ["q_lr=3e-4"]
    if learning_starts is not None:
        overrides.append(f"learning_starts={learning_starts}")
    return overrides


def ours(algo: str, env_id: str, steps: int, seed: int, learning_starts: int | None):
    from reflectrl.registry import trainer_class
    from reflectrl.trainers.resolve import new_run_config

    overrides = our_overrides(algo, learning_starts)
    cfg = new_run_config(algo=algo, env_id=env_id, seed=seed, total_steps=steps, overrides=overrides)
    trainer = trainer_class(algo)(cfg)
    start = time.perf_counter()
    trainer.train(progress=False)
    elapsed = time.perf_counter() - start
    trainer.close()
    policy = trainer.policy_module

    def act(obs):
        with torch.no_grad():
            a = policy.deterministic_action(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))[0].numpy()
        return int(a) if algo == "dqn" else a

    return trainer.global_step / elapsed, act


def sb3(algo: str, env_id: str, steps: int, seed: int, learning_starts: int | None):
    from stable_baselines3 import DQN, SAC

    torch.set_num_threads(1)
    env = gym.make(env_id)
    if algo == "dqn":
        model = DQN("MlpPolicy", env, learning_rate=2.5e-4, buffer_size=10_000,
                    learning_starts=10_000 if learning_starts is None else learning_starts, batch_size=128,
                    gamma=0.99, train_freq=10, gradient_steps=1, target_update_interval=500,
                    exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.05,
                    max_grad_norm=1e9, policy_kwargs=dict(net_arch=[120, 84]), device="cpu", seed=seed, verbose=0)
    else:
        model = SAC("MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000,
                    learning_starts=5_000 if learning_starts is None else learning_starts, batch_size=256,
                    tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
                    policy_kwargs=dict(net_arch=[256, 256]), device="cpu", seed=seed, verbose=0)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    elapsed = time.perf_counter() - start

    def act(obs):
        a, _ = model.predict(obs, deterministic=True)
        return int(a) if algo == "dqn" else a

    return steps / elapsed, act


def process_ours(algo: str, env_id: str, steps: int, seed: int, learning_starts: int | None,
                 src: str | None = None):
    """Steps per wall second of a whole `reflectrl train` process (no policy to evaluate); `src`: run
    the reflectrl package found there instead (another checkout's src/, for before/after figures)."""
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "reflectrl", "train", "--algo", algo, "--env", env_id, "--total-steps",
               str(steps), "--out", f"{tmp}/run", "--no-progress", "--seed", str(seed),
               "--set", *our_overrides(algo, learning_starts)]
        env = dict(os.environ, PYTHONPATH=src) if src else None
        return timed_process(cmd, env, steps, "before" if src else "reflectrl"), None


CPU_SECONDS: dict[str, list[float]] = {}  # --whole-process: each side's processes' CPU seconds (user + sys)


def timed_process(cmd: list[str], env: dict | None, steps: int, side: str) -> float:
    """Run a process; steps per wall second, and its CPU seconds noted in CPU_SECONDS (a loaded
    machine stretches the wall time more than the CPU time)."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_SECONDS.setdefault(side, []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return steps / wall


def process_sb3(algo: str, env_id: str, steps: int, seed: int, learning_starts: int | None):
    """Steps per wall second of a fresh Python process running SB3's model on the same work."""
    import sys

    cmd = [sys.executable, __file__, "--sb3-child", algo, env_id, str(steps), str(seed),
           "none" if learning_starts is None else str(learning_starts)]
    return timed_process(cmd, None, steps, "sb3"), None


def bootstrap_diff(a, b, reps=50_000, seed=0):
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    diffs = rng.choice(a, (reps, len(a))).mean(1) - rng.choice(b, (reps, len(b))).mean(1)
    return float(a.mean() - b.mean()), float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("speed", "learn"), default="speed")
    parser.add_argument("--algo", choices=("dqn", "sac"), default="dqn")
    parser.add_argument("--env", default=None, help="default: CartPole-v1 for dqn, HalfCheetah-v5 for sac")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--learning-starts", type=int, default=None, help="default: CleanRL's")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--dqn-loss", choices=("huber", "mse"), default="huber",
                        help="our DQN's loss: huber matches SB3's; mse is CleanRL's (whose published scores use it)")
    parser.add_argument("--only", choices=("reflectrl", "sb3"), default=None, help="run one side only")
    parser.add_argument("--whole-process", action="store_true",
                        help="--mode speed: time whole processes on both sides (start-up and ending included)")
    parser.add_argument("--before-src", default=None,
                        help="--whole-process: also time the reflectrl package in this src/ folder (another "
                             "checkout's, e.g. `git worktree add /tmp/before HEAD~3`), as a third side 'before'")
    parser.add_argument("--sb3-child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DQN_LOSS
    DQN_LOSS = args.dqn_loss
    torch.set_num_threads(1)
    if args.sb3_child:
        algo, env_id, steps, seed, starts = args.sb3_child
        sb3(algo, env_id, int(steps), int(seed), None if starts == "none" else int(starts))
        return
    if args.whole_process and args.mode != "speed":
        parser.error("--whole-process times --mode speed only")
    pairs = (("reflectrl", process_ours), ("sb3", process_sb3)) if args.whole_process else \
        (("reflectrl", ours), ("sb3", sb3))
    sides = [(n, f) for n, f in pairs if args.only in (None, n)]
    if args.before_src:
        if not args.whole_process:
            parser.error("--before-src needs --whole-process")
        src = os.path.abspath(args.before_src)
        sides.insert(1, ("before", lambda *a: process_ours(*a, src=src)))
    env_id = args.env or ("CartPole-v1" if args.algo == "dqn" else "HalfCheetah-v5")
    steps = args.steps or (50_000 if args.algo == "dqn" else 10_000)
    out = {"algo": args.algo, "env": env_id, "steps": steps, "mode": args.mode, "dqn_loss": args.dqn_loss,
           "learning_starts": args.learning_starts, "whole_process": args.whole_process,
           "machine": platform.processor()
           or platform.machine(), "torch": torch.__version__}
    if args.mode == "speed":
        best = {name: 0.0 for name, _ in sides}
        for r in range(args.repeats):
            for name, fn in sides:
                sps, _ = fn(args.algo, env_id, steps, 1, args.learning_starts)
                best[name] = max(best[name], sps)
                print(f"repeat {r + 1} {name:9s} {sps:8.1f} env steps/s", flush=True)
        out.update(best)
        where = "whole processes" if args.whole_process else "in process"
        print(f"{args.algo} on {env_id}, {steps:,} steps, {where}: "
              + ", ".join(f"{name} {sps:.1f}/s" for name, sps in best.items()))
        if CPU_SECONDS:
            cpu = out["cpu_seconds_least"] = {name: min(v) for name, v in CPU_SECONDS.items()}
            print("least CPU seconds per process (user + sys): "
                  + ", ".join(f"{name} {sec:.1f}" for name, sec in cpu.items()))
        if best.get("sb3"):
            for name in best:
                if name != "sb3":
                    ratio = out["ratio" if name == "reflectrl" else f"ratio_{name}"] = best[name] / best["sb3"]
                    text = f"{name} / SB3: {ratio:.2f}x wall"
                    if CPU_SECONDS:
                        text += f", {cpu['sb3'] / cpu[name]:.2f}x in CPU seconds"
                    print(text)
    else:
        scores: dict[str, list[float]] = {"reflectrl": [], "sb3": []}
        for seed in range(1, args.seeds + 1):
            for name, fn in sides:
                sps, act = fn(args.algo, env_id, steps, seed, args.learning_starts)
                score = evaluate(act, env_id)
                scores[name].append(score)
                print(f"seed {seed} {name:9s} greedy return {score:9.2f} ({sps:.0f} steps/s)", flush=True)
        scores = {k: v for k, v in scores.items() if v}
        out.update(scores=scores)
        for name, s in scores.items():
            print(f"{name:9s} mean {np.mean(s):9.2f} +- {np.std(s):.2f} over {len(s)} seeds: {s}")
        if len(scores) == 2:
            # [mean, lo, hi]; "diff" is the old name of the field
            diff = out["diff_mean_ci95"] = out["diff"] = bootstrap_diff(scores["reflectrl"], scores["sb3"])
            print(f"reflectrl - SB3: {diff[0]:+.2f} [95% bootstrap CI {diff[1]:+.2f}, {diff[2]:+.2f}]")
    if args.json:
        import datetime
        import shlex
        import sys

        from reflectrl.report.provenance import git_state, machine, versions

        # where and from what code the numbers came (issue 40): a results folder holds several of these files
        out["provenance"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "command": shlex.join([sys.executable, *sys.argv]), "git": git_state(),
                             "versions": versions(), "machine": machine(),
                             "statistics": {"bootstrap": "percentile CI of the difference of seed means",
                                            "bootstrap_reps": 50_000, "bootstrap_seed": 0}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
