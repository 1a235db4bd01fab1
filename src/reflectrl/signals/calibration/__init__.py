"""The calibration signal's knobs (their defaults and checks) and its registry entry; the signal itself
is CalibrationBonus in signals/calibration/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal
from reflectrl.signals.schedule import check_schedule

MODES = ("miscalibration", "uncertainty")
ENSEMBLE_TARGETS = ("normalized", "raw")
INPUTS = ("obs_action", "obs_action_features", "features_action")
CLIPS = ("relative", "absolute", "none")
TARGETS = ("denormalized", "seed")


@checked_once
@dataclass
class CalibrationConfig:
    RENAMED: ClassVar[dict[str, str]] = {"reflection_epochs": "epochs"}  # old knob names still accepted, with a warning

    mode: str = "miscalibration"
    """miscalibration (the seed's bonus, -alpha x error^2) or uncertainty (+alpha x the disagreement of an
    ensemble of heads: acts before the first reward)"""
    alpha: float = 0.05
    """bonus strength (0: the run equals --algo ppo bit for bit)"""
    ensemble: int = 5
    """mode=uncertainty: the number of reflection heads, each its own initialisation and bootstrap mask"""
    bootstrap: float = 0.5
    """mode=uncertainty: each row's chance of being in a head's fit, drawn anew every iteration"""
    ensemble_target: str = "normalized"
    """mode=uncertainty: what the heads predict: normalized (the advantages at unit variance, as the seed's head) or
    raw (the advantages as they are: ~0 before the first reward, so the heads agree where the agent has been)"""
    schedule: str = "constant"
    """decay of alpha over the run: constant, linear or exponential (signals/schedule.py)"""
    schedule_steps: int = 0
    """the env step by which the decayed bonus is gone (exponential: 1% left); 0: the run's whole length"""
    beta: float = 1.0
    """weight of the clipped bonus in the reward"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """reflection net widths (ReLU, near-zero output init)"""
    inputs: str = "obs_action"
    """obs_action, obs_action_features or features_action (the actor's last hidden layer; on CNN-read images, always)"""
    shared_trunk: bool = False
    """also train the actor's trunk on the calibration loss (auxiliary loss)"""
    shared_trunk_coef: float = 0.5
    """weight of that auxiliary loss"""
    epochs: int = 5
    """epochs of the reflection net's fit per iteration"""
    minibatch_size: int = 512
    """minibatch size of that fit"""
    lr_multiplier: float = 4.0
    """the reflection net's learning rate, in multiples of the policy's"""
    clip: str = "relative"
    """relative (k x mean |r|), absolute (clip_value) or none"""
    clip_k: float = 3.0
    """k of the relative clip"""
    clip_value: float = 1.0
    """bound of the absolute clip"""
    max_ratio: float = float("inf")
    """bonus budget: scale the term so mean |beta b| <= this x mean |r| per batch (inf: none)"""
    adaptive: bool = False
    """scale alpha by the current calibration loss (1 = knows nothing), capped"""
    adaptive_max: float = 2.0
    """cap of that scale"""
    bonus_target: str = "denormalized"
    """denormalized (f de-normalised vs the raw advantage, SPEC DECISION) or seed (raw f, as the seed writes it)"""
    recompute_advantages: bool = True
    """recompute GAE on r + bonus; false: add the bonus to each step's advantage"""
    snapshots: int = 5
    """predicted-vs-actual samples kept for the calibration picture"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"calibration.{msg}")

        for name in ("alpha", "beta", "lr_multiplier", "clip_k", "clip_value", "adaptive_max", "shared_trunk_coef"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                bad(f"{name}={value}: must be a finite number >= 0")
        if math.isnan(self.max_ratio) or self.max_ratio <= 0:
            bad(f"max_ratio={self.max_ratio}: must be > 0 (inf for no budget)")
        if self.lr_multiplier == 0:
            bad("lr_multiplier=0: must be > 0 (the reflection net would never learn)")
        for name in ("epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.snapshots < 0:
            bad(f"snapshots={self.snapshots}: must be >= 0")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64,64")
        if self.ensemble < 2:
            bad(f"ensemble={self.ensemble}: needs at least 2 heads (their disagreement is the bonus)")
        if not 0.0 < self.bootstrap <= 1.0:
            bad(f"bootstrap={self.bootstrap}: must be in (0, 1] (1: every head fits every row)")
        check_schedule("calibration", self.schedule, self.schedule_steps)
        if self.mode == "uncertainty" and self.shared_trunk:
            bad("shared_trunk=true trains the actor's trunk on the seed's calibration loss; mode=uncertainty has "
                "no such loss: leave shared_trunk=false")
        for name, allowed in (("mode", MODES), ("inputs", INPUTS), ("clip", CLIPS), ("bonus_target", TARGETS),
                              ("ensemble_target", ENSEMBLE_TARGETS)):
            if getattr(self, name) not in allowed:
                bad(f"{name}='{getattr(self, name)}': use one of {', '.join(allowed)}")
        if self.shared_trunk and self.inputs == "obs_action":
            bad("shared_trunk=true needs the actor's features among the inputs: "
                "set calibration.inputs=features_action or obs_action_features")


def _check_on_grpo(cfg: CalibrationConfig) -> None:
    if cfg.inputs != "obs_action":
        raise UserError("calibration.inputs: an LLM turn's input is its hidden state; leave inputs=obs_action")


def _check_on_replay(cfg: CalibrationConfig) -> None:
    if not cfg.recompute_advantages:
        raise UserError("calibration.recompute_advantages=false adds the bonus to the policy's advantage, and a "
                        "replay trainer's loss has no advantage: leave it true (the bonus joins the TD target)")


def _wants(cfg: CalibrationConfig) -> set[str]:
    wants = {"features"} if cfg.inputs != "obs_action" else set()
    return wants | ({"feature_grad"} if cfg.shared_trunk else set())


SPEC = register_signal(SignalSpec(
    name="calibration", config=CalibrationConfig, factory="reflectrl.signals.calibration.torch:CalibrationBonus",
    jax="reflectrl.signals.calibration.jax:Calibration",
    jax_torch_only=lambda c: [(c.shared_trunk, "calibration.shared_trunk",
                                 "its auxiliary loss trains the actor's trunk inside the torch PPO update")],
    step_kinds=("env_step", "turn", "transition"),
    summary="seed 000's calibration bonus (--algo refgrpo; the RefGRPO paper's own method is the verbal verdict, "
            "grpo+verdict): a reflection head fit to the advantages; its miscalibration is a reward",
    wants=_wants,
    aliases={"control": "refgrpo", "llm": "refgrpo"}, neutral="alpha=0",
    step_checks={"turn": _check_on_grpo, "transition": _check_on_replay},
    on_finish={"env_step": "reflectrl.signals.calibration.plot:plot_at_finish"},
))
