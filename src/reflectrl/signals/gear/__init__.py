"""The gear signal's knobs (their defaults and checks) and its registry entry; the signal itself
is GEARReweighting in signals/gear/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.config import checked_once, passed, remember_valid
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal

HEADS = ("linear", "mlp")
DISTILL_ON = ("winners", "all")
RETURN_KINDS = ("discounted", "trajectory")
DIFF_SCALES = ("standardize", "value_std", "none")
INPUTS = ("auto", "features", "obs")
ADVANTAGES = ("extrinsic", "total", "intrinsic")
SELECTS = ("extrinsic", "total")


@checked_once
@dataclass
class GEARConfig:
    top_frac: float = 0.25
    """the winners' share of the batch's trajectories"""
    distill_on: str = "winners"
    """winners (the seed) or all"""
    return_kind: str = "discounted"
    """discounted reward-to-go, or the trajectory's return for every step"""
    head: str = "mlp"
    """mlp or linear value head"""
    hidden_sizes: tuple[int, ...] = (64,)
    """the head's widths (mlp)"""
    inputs: str = "auto"
    """auto (features where the trainer gives them, else obs), features (the actor's last hidden layer) or obs"""
    epochs: int = 4
    """epochs of the head's distillation"""
    minibatch_size: int = 512
    """minibatch size of the distillation"""
    lr_multiplier: float = 3.0
    """the head's learning rate, in multiples of the policy's"""
    temperature: float = 2.0
    """w = exp(diff / temperature); inf gives w = 1 (PPO bit for bit)"""
    warmup_steps: int = 0
    """steps (env steps; GRPO: optimisation steps) with w = 1 before reweighting starts"""
    temperature_start: float = float("inf")
    """the temperature when the ramp starts (inf: w = 1 there)"""
    temperature_steps: int = 0
    """steps after the warm-up over which 1/temperature ramps from 1/temperature_start (0: no ramp)"""
    diff_scale: str = "standardize"
    """standardize (DECISION), value_std, or none (the seed's literal form)"""
    w_min: float = 0.5
    """lower clip of the weights"""
    w_max: float = 2.0
    """upper clip of the weights"""
    renormalize: bool = False
    """rescale the weights to mean 1 per trajectory"""
    rank_groups: bool = False
    """GRPO: re-rank each group's completions by their mean reweighted advantage (seed 3.4)"""
    history: int = 0
    """past distillations whose winners are fit again with the current ones (seed 5.2; 0: none)"""
    target_ema: float = 1.0
    """the frozen head's step towards the fitted one after each distillation (1: a copy)"""
    advantage: str = "extrinsic"
    """the reward and baseline the head distils and the weights compare: extrinsic (the trainer's), total (plus
    the reward streams: RND's) or intrinsic (the streams alone)"""
    select: str = "extrinsic"
    """which reward's trajectory sums rank the winners: extrinsic (the trainer's) or total (plus the reward streams)"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"gear.{msg}")

        if self.history < 0:
            bad(f"history={self.history}: must be >= 0 (0: no history)")
        if not 0 < self.target_ema <= 1:
            bad(f"target_ema={self.target_ema}: must be in (0, 1] (1: copy the head)")

        if not 0 < self.top_frac <= 1:
            bad(f"top_frac={self.top_frac}: must be in (0, 1]")
        for name, allowed in (("distill_on", DISTILL_ON), ("return_kind", RETURN_KINDS), ("head", HEADS),
                              ("inputs", INPUTS), ("diff_scale", DIFF_SCALES), ("advantage", ADVANTAGES),
                              ("select", SELECTS)):
            if getattr(self, name) not in allowed:
                bad(f"{name}='{getattr(self, name)}': use one of {', '.join(allowed)}")
        for name in ("epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if not (math.isfinite(self.lr_multiplier) and self.lr_multiplier > 0):
            bad(f"lr_multiplier={self.lr_multiplier}: must be a finite number > 0")
        for name in ("temperature", "temperature_start"):
            if math.isnan(getattr(self, name)) or getattr(self, name) <= 0:
                bad(f"{name}={getattr(self, name)}: must be > 0 (inf turns reweighting off)")
        for name in ("warmup_steps", "temperature_steps"):
            if getattr(self, name) < 0:
                bad(f"{name}={getattr(self, name)}: must be >= 0")
        if not (0 < self.w_min <= 1 <= self.w_max) or not math.isfinite(self.w_max):
            bad(f"w_min={self.w_min}, w_max={self.w_max}: need 0 < w_min <= 1 <= w_max < inf")
        if self.head == "mlp" and (not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes)):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64")


def _wants(cfg: GEARConfig) -> set[str]:
    """The head reads the policy's features, except with inputs=obs; `auto` is resolved for the
    trainer before a run builds the signal (_resolve_inputs), and means features in a signal
    built by hand."""
    return set() if cfg.inputs == "obs" else {"features"}


def _resolve_inputs(cfg: GEARConfig, provides: frozenset) -> None:
    if cfg.inputs == "auto":
        valid = passed(cfg)
        cfg.inputs = "features" if "features" in provides else "obs"
        if valid:  # one allowed value for another: still valid, and not checked again
            remember_valid(cfg)


def _check_on_grpo(cfg: GEARConfig) -> None:
    if cfg.inputs == "obs":
        raise UserError("gear.inputs: the LLM value head reads the hidden states; leave inputs=features")


def _check_on_env_steps(cfg: GEARConfig) -> None:
    if cfg.rank_groups:
        raise UserError("gear.rank_groups=true ranks the completions of a prompt's group against each other: "
                        "it needs GRPO's groups (llm train --algo grpo+gear); a PPO batch has none")


SPEC = register_signal(SignalSpec(
    name="gear", config=GEARConfig, factory="reflectrl.signals.gear.torch:GEARReweighting",
    jax="reflectrl.signals.gear.jax:Gear",
    jax_torch_only=lambda c: [(c.history > 0, f"gear.history={c.history}", "the past winners' rows are a growing list"),
                              (c.rank_groups, "gear.rank_groups", "it ranks GRPO's groups; a PPO batch has none")],
    step_kinds=("env_step", "token"),
    summary="seed 003's GEAR: a value head distilled from the best trajectories reweights each step's advantage "
            "(the GEAR paper's own teacher-divergence segments are grpo+divergence)",
    wants=_wants, resolve=_resolve_inputs,
    aliases={"control": "gear", "llm": "gear"}, neutral="temperature=inf",
    step_checks={"token": _check_on_grpo, "env_step": _check_on_env_steps},
    refusals={"transition": "GEAR's weights share a trajectory's advantage out among its steps, and a replay "
              "trainer learns from single transitions sampled out of their trajectories, with no trajectory "
              "advantage to share (docs/offpolicy.md); use ppo+gear"},
))
