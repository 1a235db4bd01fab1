"""The lagrangian signal's knobs (their defaults and checks) and its registry entry; the signal itself
is Lagrangian in signals/lagrangian/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal


@checked_once
@dataclass
class LagrangianConfig:
    lambda_init: float = 0.001
    """the Lagrange multiplier's start (OmniSafe's lagrangian_multiplier_init)"""
    lambda_lr: float = 0.035
    """the multiplier's Adam learning rate (OmniSafe's lambda_lr)"""
    lambda_max: float = float("inf")
    """the multiplier's upper bound (OmniSafe's lagrangian_upper_bound; inf: none; 0: the run equals --algo ppo)"""
    critic_epochs: int = 10
    """epochs of the cost critic's fit per iteration"""
    critic_minibatch_size: int = 256
    """minibatch size of the cost critic's fit"""
    critic_lr_multiplier: float = 1.0
    """the cost critic's learning rate, in multiples of the policy's"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """the cost critic's widths"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"lagrangian.{msg}")

        for name in ("lambda_init", "lambda_lr"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                bad(f"{name}={value}: must be a finite number >= 0")
        if math.isnan(self.lambda_max) or self.lambda_max < 0:
            bad(f"lambda_max={self.lambda_max}: must be >= 0 (inf for no bound; 0: PPO bit for bit)")
        if not math.isfinite(self.critic_lr_multiplier) or self.critic_lr_multiplier <= 0:
            bad(f"critic_lr_multiplier={self.critic_lr_multiplier}: must be a finite number > 0")
        for name in ("critic_epochs", "critic_minibatch_size"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64,64")


SPEC = register_signal(SignalSpec(
    name="lagrangian", config=LagrangianConfig, factory="reflectrl.signals.lagrangian.torch:Lagrangian",
    step_kinds=("env_step",),
    summary="PPO-Lagrangian (OmniSafe's PPOLag): a cost critic and a Lagrange multiplier keep the expected "
            "episode cost below cost_limit",
    wants=frozenset({"next_obs", "costs"}), aliases={"control": "ppo_lag"}, neutral="lambda_max=0",
    refusals={"transition": "a Lagrangian advantage needs on-policy trajectories (use --algo ppo_lag)"},
))
