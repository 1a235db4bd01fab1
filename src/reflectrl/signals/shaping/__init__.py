"""The shaping signal's knobs (their defaults and checks) and its registry entry; the signal itself
is SelfDistilledShaping in signals/shaping/torch.py. Imports no torch (specs/__init__.py says why)."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import ClassVar

from reflectrl.config import checked_once
from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal

MODES = ("direct", "potential", "bootstrap", "advice", "off")
DISTILLS = ("extrinsic", "total")
ENCODERS = ("policy", "cnn")


@checked_once
@dataclass
class ShapingConfig:
    RENAMED: ClassVar[dict[str, str]] = {"map_snapshots": "snapshots"}  # old knob names still accepted, with a warning

    mode: str = "direct"
    """direct (F(s,a,s'), eta tanh), potential (gamma Phi(s') - Phi(s)), bootstrap (Phi = value_scale V), advice
    (Phi learns the value of -F) or off (the ablation: PPO bit for bit)"""
    eta: float = 0.1
    """output scale: f = eta tanh(F_raw)"""
    value_scale: float = 0.5
    """mode=bootstrap: the potential is this x the critic's value"""
    hard_clip: float = float("inf")
    """clip f to +-this (inf: no clip)"""
    scale: float = 0.1
    """the soft labels' scale (normalised advantages times this)"""
    buffer_rollouts: int = 4
    """rollouts in the distillation buffer"""
    update_every: int = 5
    """distil after every N-th policy update"""
    tau: float = 0.005
    """Polyak rate of the target shaper"""
    lr_multiplier: float = 0.5
    """the shaper's learning rate, in multiples of the policy's"""
    epochs: int = 4
    """epochs of each distillation"""
    minibatch_size: int = 512
    """minibatch size of the distillation"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """shaper widths"""
    encoder: str = "policy"
    """what F reads of an image: policy (the policy CNN's features, else the observation) or cnn (its own CNN)"""
    warmup_steps: int = 0
    """env steps with no shaping at the start"""
    ramp_steps: int = 0
    """env steps of the linear ramp of the shaping weight after the warm-up"""
    prior: str = ""
    """module:function, a heuristic h(s, a, s') fit before the first update (empty: none)"""
    prior_epochs: int = 50
    """epochs of the prior's fit"""
    warn_ratio: float = 0.3
    """warn when mean |f| exceeds this share of mean |r|"""
    snapshots: int = 10
    """reward-map snapshots kept over training (grid world, MiniGrid)"""
    imagined_fraction: float = 0.0
    """share of the distillation set imagined by a learned world model from real states (seed 002 section 6.2;
    0: none; vector observations only)"""
    imagined_horizon: int = 3
    """steps of each imagined rollout"""
    model_ensemble: int = 5
    """world-model ensemble members"""
    model_hidden_sizes: tuple[int, ...] = (128, 128)
    """widths of each world-model member"""
    model_steps: int = 100
    """Adam steps of the world model's fit before each distillation"""
    model_buffer: int = 50_000
    """real transitions the world model is fit on (the most recent)"""
    model_lr: float = 1e-3
    """the world model's learning rate"""
    safety_beta: float = 0.0
    """f = f + safety_beta f_safety, F_safety distilled from the constraint critic's negated cost advantages
    (seed 002 section 6.3); > 0 needs a cost channel (info["cost"]); 0: no safety term"""
    labels: str = "auto"
    """whose advantage F is distilled from: own (the batch's rewards and critic), team (a multi-agent trainer's team
    reward and value: seed 002 section 4.3, --algo mappo+shaping) or auto (team where the trainer has one, else own)"""

    distill: str = "extrinsic"
    """the critic whose advantages F is distilled from: extrinsic (the trainer's) or total (plus the reward
    streams' advantages: RND's)"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"shaping.{msg}")

        if self.mode not in MODES:
            bad(f"mode='{self.mode}': use one of {', '.join(MODES)}")
        if self.encoder not in ENCODERS:
            bad(f"encoder='{self.encoder}': use one of {', '.join(ENCODERS)}")
        for name in ("eta", "scale", "lr_multiplier", "warn_ratio", "value_scale"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                bad(f"{name}={value}: must be a finite number > 0")
        if self.mode in ("bootstrap", "advice") and self.encoder == "cnn":
            bad(f"encoder=cnn: mode={self.mode} reads the policy's features (bootstrap: its critic); "
                "use shaping.encoder=policy")
        if self.mode == "bootstrap" and self.prior:
            bad("prior: mode=bootstrap distils no shaper for a prior to start; drop the prior or use another mode")
        if math.isnan(self.hard_clip) or self.hard_clip <= 0:
            bad(f"hard_clip={self.hard_clip}: must be > 0 (inf for no clip)")
        if not 0 < self.tau <= 1:
            bad(f"tau={self.tau}: must be in (0, 1]")
        for name in ("buffer_rollouts", "update_every", "epochs", "minibatch_size", "prior_epochs"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        for name in ("warmup_steps", "ramp_steps", "snapshots"):
            if getattr(self, name) < 0:
                bad(f"{name}={getattr(self, name)}: must be >= 0")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64,64")
        if self.prior:
            load_prior(self.prior)
        if not (math.isfinite(self.imagined_fraction) and 0 <= self.imagined_fraction < 1):
            bad(f"imagined_fraction={self.imagined_fraction}: must be in [0, 1) (0: no imagination)")
        if self.imagined_fraction > 0 and self.mode not in ("direct", "potential"):
            bad(f"imagined_fraction={self.imagined_fraction}: imagined labels train the distilled F; "
                f"mode={self.mode} distils none: use mode=direct or potential")
        if self.imagined_fraction > 0 and self.encoder == "cnn":
            bad("imagined_fraction: the world model reads vector observations; use shaping.encoder=policy")
        for name in ("imagined_horizon", "model_ensemble", "model_steps", "model_buffer"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if not math.isfinite(self.model_lr) or self.model_lr <= 0:
            bad(f"model_lr={self.model_lr}: must be a finite number > 0")
        if not self.model_hidden_sizes or any(h < 1 for h in self.model_hidden_sizes):
            bad(f"model_hidden_sizes={self.model_hidden_sizes}: give positive layer widths, e.g. 128,128")
        if not math.isfinite(self.safety_beta) or self.safety_beta < 0:
            bad(f"safety_beta={self.safety_beta}: must be a finite number >= 0")
        if self.safety_beta > 0 and self.mode not in ("direct", "potential"):
            bad(f"safety_beta={self.safety_beta}: the safety term pairs a distilled F_safety with F; "
                f"mode={self.mode} distils none: use mode=direct or potential")
        if self.safety_beta > 0 and self.encoder == "cnn":
            bad("safety_beta: the constraint critic reads the policy's features of images; use shaping.encoder=policy")
        if self.distill not in DISTILLS:
            bad(f"distill='{self.distill}': use one of {', '.join(DISTILLS)}")
        if self.distill == "total" and self.mode in ("bootstrap", "off"):
            bad(f"distill=total: mode={self.mode} distils nothing; use mode=potential, direct or advice")
        if self.labels not in ("auto", "own", "team"):
            bad(f"labels='{self.labels}': use one of auto, own, team (team: --algo mappo+shaping)")


def load_prior(spec: str):
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise UserError(f"shaping.prior='{spec}': write it as module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise UserError(f"shaping.prior='{spec}': cannot import it ({type(err).__name__}: {err})") from None
    if not callable(fn):
        raise UserError(f"shaping.prior='{spec}' is not a function")
    return fn


def _check_encoder(cfg: ShapingConfig, run) -> None:
    """shaping.encoder=cnn needs a policy that reads images with a CNN (checked before a run starts)."""
    encoder = getattr(getattr(run, "knobs", None), "encoder", None)  # the run's trainer's, where it has one
    if cfg.encoder == "cnn" and encoder == "mlp":  # ("auto" is not resolved yet)
        raise UserError(f"shaping.encoder=cnn: the policy's encoder is {encoder}, so it reads no images; "
                        "it needs a CNN policy on images (Atari, or MiniGrid with --set encoder=cnn), "
                        "or use shaping.encoder=policy")


SPEC = register_signal(SignalSpec(
    name="shaping", config=ShapingConfig, factory="reflectrl.signals.shaping.torch:SelfDistilledShaping",
    jax="reflectrl.signals.shaping.jax:Shaping",
    jax_torch_only=lambda c: [(c.mode in ("bootstrap", "advice"), f"shaping.mode={c.mode}", ""),
                              (bool(c.prior), "shaping.prior", ""),
                              (c.safety_beta > 0, "shaping.safety_beta", ""),
                              (c.imagined_fraction > 0, "shaping.imagined_fraction", ""),
                              (c.encoder == "cnn", "shaping.encoder=cnn", ""),
                              (c.labels == "team", "shaping.labels=team", "")],
    step_kinds=("env_step", "transition"),
    summary="SDRS: a shaper (or potential) distilled from the agent's own advantages adds a dense reward",
    wants=lambda cfg: ({"next_obs"} | ({"costs"} if cfg.safety_beta > 0 else set())
                       | ({"policy"} if cfg.imagined_fraction > 0 else set())
                       | ({"team"} if cfg.labels == "team" else set())), aliases={"control": "sdrs"},
    neutral="mode=off", run_check=_check_encoder,
))
