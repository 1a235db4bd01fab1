"""Env-steps per second of reflectrl's PPO and Stable-Baselines3's PPO on the same work.

Matched settings: same number of envs, steps per rollout, epochs and minibatch size,
64-64 tanh actor and critic, orthogonal init, 1 torch thread, CPU; HalfCheetah with
observation and reward normalisation on both sides (VecNormalize for SB3). Each
framework runs `--repeats` times, interleaved, and the best time counts (the machines
are shared, so the least-disturbed run is the fairest). Prints a table and the ratios.

    python bench/throughput.py [--steps-scale 1.0] [--repeats 2] [--json FILE]
    python bench/throughput.py --whole-process [--repeats 3]

`--whole-process` times whole processes on both sides instead (issue 38): `reflectrl train`
as a user runs it (start-up, training, its metrics log, TensorBoard and final checkpoint)
against a fresh Python that imports SB3, builds the same PPO and learns (nothing written);
steps per second of wall time, best of interleaved repeats.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

CASES = [
    # env, n_envs, n_steps, epochs, minibatch size, total steps
    ("CartPole-v1", 4, 128, 4, 128, 65_536),
    ("HalfCheetah-v5", 1, 2048, 10, 64, 20_480),
]


def run_reflectrl(env_id, n_envs, n_steps, epochs, mb_size, total):
    from reflectrl.config import RunConfig
    from reflectrl.trainers.ppo.config import PPOConfig
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import resolve_config

    cfg = RunConfig(env_id=env_id, seed=1, total_steps=total, knobs=PPOConfig(
        num_envs=n_envs, num_steps=n_steps, update_epochs=epochs,
        num_minibatches=n_envs * n_steps // mb_size))
    resolve_config(cfg)
    trainer = PPOTrainer(cfg)
    start = time.perf_counter()
    trainer.train(progress=False)
    elapsed = time.perf_counter() - start
    trainer.close()
    return trainer.global_step / elapsed


def run_sb3(env_id, n_envs, n_steps, epochs, mb_size, total):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    continuous = env_id != "CartPole-v1"
    env = make_vec_env(env_id, n_envs=n_envs, seed=1)
    if continuous:
        env = VecNormalize(env, gamma=0.99)
    model = PPO(
        "MlpPolicy", env, n_steps=n_steps, batch_size=mb_size, n_epochs=epochs,
        learning_rate=3e-4 if continuous else 2.5e-4, ent_coef=0.0 if continuous else 0.01,
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
        device="cpu", seed=1, verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=total)
    elapsed = time.perf_counter() - start
    env.close()
    return model.num_timesteps / elapsed


def process_reflectrl(env_id, n_envs, n_steps, epochs, mb_size, total):
    """Steps per wall second of a whole `reflectrl train` process."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "reflectrl", "train", "--env", env_id, "--total-steps", str(total), "--out",
               f"{tmp}/run", "--no-progress", "--seed", "1", "--set", f"num_envs={n_envs}", f"num_steps={n_steps}",
               f"update_epochs={epochs}", f"num_minibatches={n_envs * n_steps // mb_size}"]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return total / (time.perf_counter() - start)


def process_sb3(env_id, n_envs, n_steps, epochs, mb_size, total):
    """Steps per wall second of a fresh Python process running SB3's PPO on the same work."""
    import subprocess
    import sys

    cmd = [sys.executable, __file__, "--sb3-child", env_id, str(n_envs), str(n_steps), str(epochs), str(mb_size),
           str(total)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return total / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply each case's total steps")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--whole-process", action="store_true", help="time whole processes on both sides")
    parser.add_argument("--sb3-child", nargs=6, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sb3_child:
        env_id, *numbers = args.sb3_child
        run_sb3(env_id, *(int(x) for x in numbers))
        return
    ours, theirs = (process_reflectrl, process_sb3) if args.whole_process else (run_reflectrl, run_sb3)

    results = []
    for env_id, n_envs, n_steps, epochs, mb, total in CASES:
        total = max(n_envs * n_steps, int(total * args.steps_scale) // (n_envs * n_steps) * (n_envs * n_steps))
        best = {"reflectrl": 0.0, "sb3": 0.0}
        for _ in range(args.repeats):
            best["reflectrl"] = max(best["reflectrl"], ours(env_id, n_envs, n_steps, epochs, mb, total))
            best["sb3"] = max(best["sb3"], theirs(env_id, n_envs, n_steps, epochs, mb, total))
        row = dict(env=env_id, num_envs=n_envs, num_steps=n_steps, epochs=epochs, minibatch=mb, total_steps=total,
                   reflectrl_sps=round(best["reflectrl"], 1), sb3_sps=round(best["sb3"], 1),
                   ratio=round(best["reflectrl"] / best["sb3"], 3))
        results.append(row)
        print(f"{env_id:16s} {n_envs}x{n_steps} epochs={epochs} mb={mb}: reflectrl {row['reflectrl_sps']:8.0f} steps/s"
              f"  sb3 {row['sb3_sps']:8.0f} steps/s  ratio {row['ratio']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.platform(), "torch": torch.__version__, "results": results,
                       "whole_process": args.whole_process, "repeats": args.repeats}, f, indent=2)


if __name__ == "__main__":
    main()
