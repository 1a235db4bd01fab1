"""The confidence signal's knobs (their defaults and checks) and its registry entry; the signal itself
is ConfidenceReward in signals/confidence/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

from dataclasses import dataclass

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal
from reflectrl.signals.verdict import check_schedule

SCORES = ("brier", "log")


@checked_once
@dataclass
class ConfidenceConfig:
    coef: float = 1.0
    """weight of the scoring rule in the reward (0: the run is plain GRPO bit for bit)"""
    score: str = "brier"
    """brier (-(q - y)^2) or log (the log score of the clipped q)"""
    log_eps: float = 0.01
    """the log score's clip: q is read as at least this and at most 1 - this"""
    schedule: str = "constant"
    """constant, step or linear (as verdict.schedule)"""
    until: float = 0.667
    """the schedule's breakpoint, as a fraction of the run's steps"""

    def validate(self) -> None:
        check_schedule("confidence", self.coef, self.schedule, self.until)
        if self.score not in SCORES:
            raise UserError(f"confidence.score='{self.score}': use one of {', '.join(SCORES)}")
        if not 0 < self.log_eps < 0.5:
            raise UserError(f"confidence.log_eps={self.log_eps}: must be in (0, 0.5)")


SPEC = register_signal(SignalSpec(
    name="confidence", config=ConfidenceConfig, factory="reflectrl.signals.confidence.torch:ConfidenceReward",
    step_kinds=("turn",),
    summary="RLCR's stated confidence scored by a proper scoring rule (Brier or log) joins the reward",
    neutral="coef=0", task_options={"reflect": "confidence"},
    refusals={k: "it scores a stated confidence, which only a language-model task's output has"
              for k in ("env_step", "transition")},
))
