"""The verdict signal's knobs (their defaults and checks) and its registry entry; the signal itself
is VerdictBonus in signals/verdict/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal

# the schedules of a stated reflection's coefficient (signals/base.py: scheduled)
SCHEDULES = ("constant", "step", "linear")


@checked_once
@dataclass
class VerdictConfig:
    coef: float = 0.1
    """c: the bonus for a verdict that agrees with the outcome (0: the run is plain GRPO bit for bit)"""
    schedule: str = "step"
    """constant, step (c, then 0 from `until` on) or linear (c down to 0 at `until`)"""
    until: float = 0.667
    """the schedule's breakpoint, as a fraction of the run's steps"""

    def validate(self) -> None:
        check_schedule("verdict", self.coef, self.schedule, self.until)


def check_schedule(name: str, coef: float, schedule: str, until: float) -> None:
    if not math.isfinite(coef) or coef < 0:
        raise UserError(f"{name}.coef={coef}: must be a finite number >= 0")
    if schedule not in SCHEDULES:
        raise UserError(f"{name}.schedule='{schedule}': use one of {', '.join(SCHEDULES)}")
    if not 0 <= until <= 1:
        raise UserError(f"{name}.until={until}: must be a fraction of the run in [0, 1]")


SPEC = register_signal(SignalSpec(
    name="verdict", config=VerdictConfig, factory="reflectrl.signals.verdict.torch:VerdictBonus",
    step_kinds=("turn",),
    summary="the RefGRPO paper's verbal verdict: c * 1[stated 'solved'/'not solved' == outcome] joins the reward",
    neutral="coef=0", task_options={"reflect": "verdict"},
    refusals={k: "it rewards a stated verdict, which only a language-model task's output has"
              for k in ("env_step", "transition")},
))
