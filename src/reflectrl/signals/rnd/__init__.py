"""The rnd signal's knobs (their defaults and checks) and its registry entry; the signal itself
is RND in signals/rnd/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal
from reflectrl.signals.schedule import check_schedule


@checked_once
@dataclass
class RndConfig:
    int_coef: float = 1.0
    """weight of the intrinsic advantage (0: the run equals --algo ppo bit for bit)"""
    ext_coef: float = 2.0
    """weight of the extrinsic advantage while the intrinsic stream is on"""
    int_gamma: float = 0.99
    """discount of the intrinsic (non-episodic) stream"""
    update_proportion: float = 0.25
    """share of each minibatch's rows the predictor trains on"""
    epochs: int = 4
    """epochs of the predictor's training per iteration"""
    num_minibatches: int = 4
    """minibatches per epoch of that training"""
    lr_multiplier: float = 1.0
    """the predictor's learning rate, in multiples of the policy's"""
    max_grad_norm: float = 0.5
    """clip of the predictor's gradient norm"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """widths of the MLP nets' trunks (vector observations)"""
    embedding_dim: int = 128
    """width of the target's output (512 for the conv nets, as CleanRL)"""
    obs_clip: float = 5.0
    """clip of the normalised observations the nets read"""
    schedule: str = "constant"
    """decay of the intrinsic reward over the run: constant, linear or exponential (signals/schedule.py)"""
    schedule_steps: int = 0
    """the env step by which the decayed reward is gone (exponential: 1% left); 0: the run's whole length"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"rnd.{msg}")

        for name in ("int_coef", "ext_coef", "lr_multiplier", "max_grad_norm", "obs_clip"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                bad(f"{name}={value}: must be a finite number >= 0")
        for name in ("lr_multiplier", "max_grad_norm", "obs_clip"):
            if getattr(self, name) == 0:
                bad(f"{name}=0: must be > 0")
        if not 0.0 < self.int_gamma <= 1.0:
            bad(f"int_gamma={self.int_gamma}: must be in (0, 1]")
        if not 0.0 < self.update_proportion <= 1.0:
            bad(f"update_proportion={self.update_proportion}: must be in (0, 1]")
        for name in ("epochs", "num_minibatches", "embedding_dim"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 256,256")
        check_schedule("rnd", self.schedule, self.schedule_steps)


SPEC = register_signal(SignalSpec(
    name="rnd", config=RndConfig, factory="reflectrl.signals.rnd.torch:RND",
    jax="reflectrl.signals.rnd.jax:Rnd",
    step_kinds=("env_step",),
    summary="Random Network Distillation (Burda et al. 2018): a predictor's error on a fixed random net is an "
            "intrinsic reward, learnt on its own non-episodic value head",
    wants=frozenset({"next_obs", "value_stream"}), neutral="int_coef=0",
    refusals={"transition": "RND's intrinsic return is learnt by a value head of its own, non-episodic, beside "
              "the policy's, which a Q-learner does not have (docs/offpolicy.md); use ppo+rnd"},
))
