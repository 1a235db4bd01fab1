"""The divergence signal's knobs (their defaults and checks) and its registry entry; the signal itself
is DivergenceReweighting in signals/divergence/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal

MEASURES = ("kl", "logp_gap")
REFERENCES = ("solution", "answer")
BOUNDARIES = ("spike", "entropy", "both")
WEIGHTINGS = ("smooth", "step")
TEACHER_SCHEDULES = ("every", "initial")
NEVER = 2 ** 62  # teacher_schedule=initial: the trainer's refresh interval that never comes


@checked_once
@dataclass
class DivergenceConfig:
    measure: str = "kl"
    """kl: KL(student || teacher) per token; logp_gap: log p_student - log p_teacher of the sampled token"""
    reference: str = "solution"
    """what the teacher reads: the task's worked solution, or only its answer"""
    teacher_refresh: int = 0
    """0: the current policy is the teacher; K: a copy frozen every K steps"""
    teacher_schedule: str = "every"
    """every: as teacher_refresh says; initial: the policy of the first step, never refreshed (teacher_refresh=0)"""
    threshold: float = 2.0
    """a spike of d (or of the entropy): x_t > running mean + threshold x running std of the earlier tokens"""
    min_history: int = 2
    """earlier completion tokens needed before a spike can be called"""
    floor: float = 0.1
    """a departure: a spike of d with d_t at least this (nats)"""
    entropy_min: float = 0.0
    """and the student's entropy at least this (nats); 0: divergence alone marks departures"""
    max_segments: int = 4
    """segments per completion at most: departures open them; 1 with boundary=spike: one to the end"""
    boundary: str = "spike"
    """what ends a segment: spike (the next departure, which opens the next one), entropy (an entropy spike), both"""
    entropy_floor: float = 0.5
    """an entropy boundary (boundary=entropy or both) needs the student's entropy at least this (nats)"""
    weights: str = "smooth"
    """smooth: a segment's mean divergence, soft-clipped into [w_min, w_max]; step: its first token's, clipped"""
    strength: float = 1.0
    """w = (d / mean d)^strength, then clipped; 0: every w = 1 (GRPO bit for bit)"""
    w_min: float = 0.5
    """lower bound of the weights"""
    w_max: float = 2.0
    """upper bound of the weights"""
    renormalize: bool = False
    """rescale the weights to mean 1 per completion"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"divergence.{msg}")

        for name, allowed in (("measure", MEASURES), ("reference", REFERENCES), ("boundary", BOUNDARIES),
                              ("weights", WEIGHTINGS), ("teacher_schedule", TEACHER_SCHEDULES)):
            if getattr(self, name) not in allowed:
                bad(f"{name}='{getattr(self, name)}': use one of {', '.join(allowed)}")
        for name in ("teacher_refresh", "min_history"):
            if getattr(self, name) < 0:
                bad(f"{name}={getattr(self, name)}: must be >= 0")
        if self.max_segments < 1:
            bad(f"max_segments={self.max_segments}: must be >= 1")
        if self.teacher_schedule == "initial" and self.teacher_refresh:
            bad(f"teacher_refresh={self.teacher_refresh}: teacher_schedule=initial never refreshes; leave it 0")
        for name in ("threshold", "floor", "entropy_min", "entropy_floor", "strength"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                bad(f"{name}={value}: must be a finite number >= 0")
        if not (0 < self.w_min <= 1 <= self.w_max) or not math.isfinite(self.w_max):
            bad(f"w_min={self.w_min}, w_max={self.w_max}: need 0 < w_min <= 1 <= w_max < inf")

    def refresh_interval(self) -> int:
        """The refresh argument of Batch.teacher_fn: 0 the current policy, K a copy frozen every K steps
        (teacher_schedule=initial: a copy never refreshed)."""
        return NEVER if self.teacher_schedule == "initial" else self.teacher_refresh


SPEC = register_signal(SignalSpec(
    name="divergence", config=DivergenceConfig, factory="reflectrl.signals.divergence.torch:DivergenceReweighting",
    step_kinds=("token",),
    summary="the GEAR paper's segments: where a ground-truth-conditioned teacher's divergence from the student "
            "spikes, a segment opens that runs to the next boundary (spike or entropy) and takes one weight",
    wants=frozenset({"teacher"}), neutral="strength=0",
    refusals={"env_step": "the divergence signal compares the policy's next-token distributions with its own, "
              "conditioned on the task's reference: it needs a language model and a reference (llm train)",
              "transition": "the divergence signal works on a language model's tokens (llm train)"},
))
