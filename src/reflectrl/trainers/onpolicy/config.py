"""The knobs of a clipped on-policy learner that PPO, MAPPO and HPPO share (CleanRL's ppo.py names and
defaults), with their checks; trainers/onpolicy/update.py's update reads them (ClipKnobs.of). A trainer's
config subclasses it, re-declaring a field where its default differs (PPO's are None: resolved per env),
and names its section in `SECTION` for the error messages ("" for bare names)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from reflectrl.config import EnvSettings
from reflectrl.errors import UserError


@dataclass
class OnPolicyConfig:
    SECTION: ClassVar[str] = ""

    num_envs: int = 4
    """parallel envs"""
    num_steps: int = 128
    """steps per env per rollout"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """epochs over each rollout"""
    learning_rate: float = 2.5e-4
    """Adam step size"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over training"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE's lambda"""
    clip_coef: float = 0.2
    """PPO's clip range for the ratio (and for the value, with clip_vloss)"""
    clip_vloss: bool = True
    """clip the value loss as CleanRL does"""
    ent_coef: float = 0.01
    """entropy bonus weight"""
    vf_coef: float = 0.5
    """value loss weight"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update once the approximate KL exceeds this (none: never)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """actor and critic MLP widths (tanh), e.g. 64,64"""

    @property
    def batch_size(self) -> int:
        """Env steps per rollout."""
        return self.num_envs * self.num_steps

    def env_settings(self) -> EnvSettings:
        """The envs as built for it: the env's own observations and rewards (PPO's normalise by knob)."""
        return EnvSettings(self.num_envs, False, False, 10.0, 10.0, self.gamma, "mlp")

    def validate(self, total_steps: int) -> None:
        """The shared knobs' checks, one line each naming SECTION.KNOB and the fix."""
        section = self.SECTION
        key = (lambda name: f"{section}.{name}") if section else (lambda name: name)
        for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs"):
            if getattr(self, name) < 1:
                raise UserError(f"{key(name)}={getattr(self, name)}: must be a positive integer")
        if self.batch_size % self.num_minibatches:
            raise UserError(f"{section + ': ' if section else ''}a batch of num_envs*num_steps={self.batch_size} steps "
                            f"does not divide into num_minibatches={self.num_minibatches}; pick num_minibatches that "
                            "divides it")
        if self.batch_size > total_steps:
            raise UserError(f"--total-steps {total_steps} is smaller than one batch ({key('num_envs')}*num_steps="
                            f"{self.batch_size}); raise --total-steps or lower num_steps")
        for name in ("learning_rate", "gamma", "gae_lambda", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"{key(name)}={getattr(self, name)} must be a finite number")
        if not 0.0 < self.gamma <= 1.0:
            raise UserError(f"{key('gamma')}={self.gamma}: must be in (0, 1]")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise UserError(f"{key('gae_lambda')}={self.gae_lambda}: must be in [0, 1]")
        for name in ("learning_rate", "clip_coef", "max_grad_norm"):
            if getattr(self, name) <= 0:
                raise UserError(f"{key(name)}={getattr(self, name)}: must be > 0")
        for name in ("ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise UserError(f"{key(name)}={getattr(self, name)}: must be >= 0")
        if self.target_kl is not None and (not math.isfinite(self.target_kl) or self.target_kl <= 0):
            raise UserError(f"{key('target_kl')}={self.target_kl}: must be a positive number, or none to disable")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            raise UserError(f"{key('hidden_sizes')}={self.hidden_sizes}: give positive layer widths, e.g. 64,64")
