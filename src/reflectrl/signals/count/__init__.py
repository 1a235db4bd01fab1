"""The count signal's knobs (their defaults and checks) and its registry entry; the signal itself
is CountBonus in signals/count/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal
from reflectrl.signals.schedule import check_schedule


@checked_once
@dataclass
class CountConfig:
    beta: float = 0.01
    """bonus scale: beta / sqrt(visits of the state reached) (0: the run equals --algo ppo bit for bit)"""
    episodic: bool = True
    """count within each episode (reset at its start); false: over all of training"""
    schedule: str = "constant"
    """decay of beta over the run: constant, linear or exponential (signals/schedule.py)"""
    schedule_steps: int = 0
    """the env step by which the decayed bonus is gone (exponential: 1% left); 0: the run's whole length"""

    def validate(self) -> None:
        if not math.isfinite(self.beta) or self.beta < 0:
            raise UserError(f"count.beta={self.beta}: must be a finite number >= 0")
        check_schedule("count", self.schedule, self.schedule_steps)


SPEC = register_signal(SignalSpec(
    name="count", config=CountConfig, factory="reflectrl.signals.count.torch:CountBonus",
    jax="reflectrl.signals.count.jax:Count",
    step_kinds=("env_step",),
    summary="episodic count bonus beta / sqrt(N_episode(s)) on the state key (the exploration baseline)",
    wants=frozenset({"state_keys"}), neutral="beta=0",
    refusals={"transition": "the episodic count is a function of the episode so far, and a replay trainer's "
              "signals see transitions sampled out of their episodes at learning time (docs/offpolicy.md); "
              "use ppo+count"},
))
