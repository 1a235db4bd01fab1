"""PPO's clipped update over one batch, the one PPO, MAPPO's agents and HPPO's two levels all run
(CleanRL's ppo.py: advantage normalisation per minibatch, the clipped objective, optional value
clipping, entropy bonus, the global grad-norm clip, an optional target-KL stop). The policy is
evaluated by a closure, which may add loss terms of its own (PPO's: a signal's auxiliary loss, the
reward streams' value heads, whose parameters join the clip)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from reflectrl.errors import NonFiniteError


@dataclass(frozen=True)
class ClipKnobs:
    """The knobs of one clipped update (a trainer's config has them under these names)."""

    update_epochs: int
    num_minibatches: int
    clip_coef: float
    clip_vloss: bool
    norm_adv: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    target_kl: float | None

    @classmethod
    def of(cls, config, **changes) -> ClipKnobs:
        return cls(**{name: changes.get(name, getattr(config, name)) for name in cls.__dataclass_fields__})


def clipped_update(flat: torch.Tensor | list[torch.Tensor], optimizer: torch.optim.Optimizer, evaluate, b: dict,
                   k: ClipKnobs, generator: torch.Generator, global_step: int, grad_norm=None) -> dict:
    """Epochs of minibatch steps over rows of `b` (a dict of tensors with the rows first: "logprobs",
    "advantages", "returns", "values", optionally "weights"; a row may hold several steps, e.g. one per
    agent). `evaluate(idx)` gives (logprob, entropy, value) of rows idx, with gradients into `flat`
    (the policy's one flat parameter, whose gradient is clipped as a whole), or (logprob, entropy, value,
    extra losses) whose terms join the loss in order. `flat` may be several flat parameters clipped
    together, with `grad_norm()` their global norm. Returns PPO's metrics."""
    flats = list(flat) if isinstance(flat, (list, tuple)) else [flat]
    n = b["advantages"].shape[0]
    mb_size = n // k.num_minibatches
    weights = b.get("weights")
    grad = flats[0].grad
    logratios = torch.empty(b["advantages"].shape)
    clipfracs = []
    for epoch in range(k.update_epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, mb_size):
            idx = order[start:start + mb_size]
            newlogprob, entropy, newvalue, *extras = evaluate(idx)
            logratio = newlogprob - b["logprobs"][idx]
            ratio = logratio.exp()
            logratios[start:start + mb_size] = logratio.detach()
            mb_adv = b["advantages"][idx]
            if k.norm_adv:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            if weights is not None:
                mb_adv = mb_adv * weights[idx]
            pg_loss = torch.max(-mb_adv * ratio,
                                -mb_adv * torch.clamp(ratio, 1 - k.clip_coef, 1 + k.clip_coef)).mean()
            returns, values = b["returns"][idx], b["values"][idx]
            if k.clip_vloss:
                v_unclipped = (newvalue - returns).square()
                v_clipped = values + torch.clamp(newvalue - values, -k.clip_coef, k.clip_coef)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - returns).square()).mean()
            else:
                v_loss = 0.5 * (newvalue - returns).square().mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - k.ent_coef * entropy_loss + k.vf_coef * v_loss
            for term in (extras[0] if extras else ()):
                loss = loss + term
            if not torch.isfinite(loss).all():
                raise NonFiniteError("loss", global_step)
            for f in flats:
                f.grad.zero_()
            loss.backward()
            norm = torch.linalg.vector_norm(grad) if grad_norm is None else grad_norm()
            if not torch.isfinite(norm).all():
                raise NonFiniteError("gradient", global_step)
            scale = torch.clamp(k.max_grad_norm / (norm + 1e-6), max=1.0)
            for f in flats:
                f.grad.mul_(scale)
            optimizer.step()
        ratios = logratios.exp()
        old_approx_kl = (-logratios).mean()
        approx_kl = ((ratios - 1) - logratios).mean()
        clipfracs.append(((ratios - 1.0).abs() > k.clip_coef).float().mean())
        if k.target_kl is not None and approx_kl > k.target_kl:
            break
    return update_metrics(pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfracs, b["values"],
                          b["returns"], epoch + 1)


# the names update_metrics gives
UPDATE_METRICS = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac",
                  "explained_variance", "update_epochs_done")


def update_metrics(pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfracs, values, returns,
                   epochs_done: int) -> dict:
    """PPO's metrics of an update (CleanRL's names): its last minibatch's losses, the last epoch's KL
    estimates, the mean clip fraction, and how much of the returns' variance the old values explain."""
    y_pred, y_true = values.numpy(), returns.numpy()
    var_y = np.var(y_true)
    return {
        "policy_loss": pg_loss.item(),
        "value_loss": v_loss.item(),
        "entropy": entropy_loss.item(),
        "old_approx_kl": old_approx_kl.item(),
        "approx_kl": approx_kl.item(),
        "clipfrac": torch.stack(clipfracs).mean().item(),
        "explained_variance": float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y),
        "update_epochs_done": epochs_done,
    }
