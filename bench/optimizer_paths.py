"""PPO's optimizer paths on one whole run: Adam fused (what the PPO trainer uses), foreach, and
the single-tensor loop, each with and without torch._dynamo's import (issue 38: "choose the
optimizer path that gives the fastest whole run, and show it").

Each variant is a fresh `python -c` process that builds PPO's trainer on CartPole-v1 (4 envs x
128 steps) and trains --steps env steps; the process's wall time counts (imports, start-up and
training), best of --repeats interleaved. `dynamo` imports torch._dynamo as stock torch's
optimizers do on their first step (reflectrl.torch_setup skips that import).

    python bench/optimizer_paths.py [--steps 65536] [--repeats 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

CHILD = """
import sys, torch
impl, dynamo, steps = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
torch.set_num_threads(1)
if dynamo:
    import torch._dynamo  # what stock torch.optim does on a first step
else:
    from reflectrl.torch_setup import optimizers_without_dynamo
    optimizers_without_dynamo()
from reflectrl.trainers.ppo.trainer import PPOTrainer
from reflectrl.trainers.resolve import new_run_config
cfg = new_run_config(env_id="CartPole-v1", seed=1, total_steps=steps, overrides=["num_envs=4", "num_steps=128"])
trainer = PPOTrainer(cfg)
group = trainer.optimizer.param_groups[0]
kind = {"fused": dict(fused=True), "foreach": dict(foreach=True), "single": dict(foreach=False)}[impl]
trainer.optimizer = torch.optim.Adam(group["params"], lr=group["lr"], eps=group["eps"], **kind)
trainer.train(progress=False)
trainer.close()
"""

VARIANTS = [("fused", "0"), ("foreach", "0"), ("single", "0"), ("fused", "1")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    best = {v: float("inf") for v in VARIANTS}
    for _ in range(args.repeats):
        for impl, dynamo in VARIANTS:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", CHILD, impl, dynamo, str(args.steps)], check=True,
                           capture_output=True)
            best[(impl, dynamo)] = min(best[(impl, dynamo)], time.perf_counter() - start)
    base = best[("fused", "0")]
    print(f"PPO CartPole-v1 4x128, {args.steps:,} steps, whole process, best of {args.repeats}:")
    for (impl, dynamo), seconds in best.items():
        label = f"Adam {impl}" + (" + torch._dynamo import" if dynamo == "1" else "")
        print(f"  {label:36} {seconds:6.2f} s  {args.steps / seconds:8,.0f} steps/s  x{seconds / base:.2f} of fused")


if __name__ == "__main__":
    main()
