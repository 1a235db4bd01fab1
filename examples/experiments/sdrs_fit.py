"""How much of its soft labels could an SDRS shaper learn, given more optimisation?

    python examples/experiments/sdrs_fit.py RUN_DIR [--steps 16,200,1000] [--lrs 1.25e-4,1e-3]

Reloads a finished (or checkpointed) `--algo sdrs` run, rebuilds the distillation set the
run's last fit saw (its buffer of recent rollouts, GAE labels from the updated critic,
normalised), and fits fresh shapers of the run's mode and size to 3/4 of it at a grid of
step counts and learning rates, printing each one's R^2 on the held-out quarter next to the
run's own shaper. A run whose `label_r2` stays near 0 while a longer fit here reaches a
clearly positive R^2 is under-optimised (raise `lr_multiplier` or `epochs`); if no fit gets
far above 0, the labels are mostly noise that (s, a, s') cannot predict.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn import functional as F


def distillation_set(run_dir: Path):
    from reflectrl.config import RunConfig
    from reflectrl.estimators import compute_gae
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    cfg = RunConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    if cfg.algo != "sdrs":
        raise SystemExit(f"{run_dir} is a '{cfg.algo}' run; give an --algo sdrs run")
    trainer = PPOTrainer(cfg)
    trainer.load_state_dict(torch.load(run_dir / "checkpoint.pt", weights_only=False))
    p = cfg.ppo
    gae = lambda *args: compute_gae(*args, p.gamma, p.gae_lambda)  # noqa: E731
    keys = ("obs", "actions", "next_obs", "terminations", "labels")
    data = dict(zip(keys, trainer.signal.distillation_set(trainer.agent.value, gae)))
    trainer.close()
    return trainer.signal, data


def r2(model, data, idx) -> float:
    with torch.no_grad():
        pred = model(data["obs"][idx], data["actions"][idx], data["next_obs"][idx], data["terminations"][idx])
        return 1 - F.mse_loss(pred, data["labels"][idx]).item() / data["labels"][idx].var().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--steps", default="16,200,1000")
    ap.add_argument("--lrs", default="1.25e-4,1e-3")
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from reflectrl.signals.shaping.torch import RewardShaper

    signal, data = distillation_set(args.run)
    n = len(data["labels"])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    train, held = perm[: n * 3 // 4], perm[n * 3 // 4:]
    print(f"{args.run}: mode={signal.cfg.mode}, {n} transitions in the distillation set")
    print(f"  the run's own shaper: R^2 {r2(signal.shaper, data, held):.3f} (held-out quarter)")
    c = signal.cfg
    for lr in (float(x) for x in args.lrs.split(",")):
        for steps in (int(x) for x in args.steps.split(",")):
            torch.manual_seed(0)
            model = RewardShaper(data["obs"].shape[1], data["actions"].shape[1], c.hidden_sizes, c.mode, c.eta,
                                 signal.shaper.gamma, c.hard_clip)
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            for _ in range(steps):
                i = train[torch.randint(len(train), (args.batch,))]
                loss = F.mse_loss(model(data["obs"][i], data["actions"][i], data["next_obs"][i],
                                        data["terminations"][i]), data["labels"][i])
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(f"  fresh shaper, lr {lr:g}, {steps:5d} steps: held-out R^2 {r2(model, data, held):.3f}")


if __name__ == "__main__":
    main()
