"""MAPPO's knobs (`--algo mappo`: bare names, or mappo.NAME); every default once.

Defaults follow CleanRL's ppo.py where MAPPO (Yu et al. 2022) has no reason to differ, and
MAPPO's MPE settings where it does (learning rate 7e-4, a centralised critic, parameter
sharing with the agent's one-hot id appended to its observation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.errors import UserError

CRITICS = ("central", "local")


@dataclass
class MAPPOConfig:
    """MAPPO's knobs: independent PPO per agent, shared or separate weights, a central or local critic."""

    num_envs: int = 8
    """parallel copies of the multi-agent env"""
    num_steps: int = 128
    """steps per env per rollout (each step is one joint step of every agent)"""
    num_minibatches: int = 4
    """minibatches per epoch (of joint steps, each with every agent's step)"""
    update_epochs: int = 4
    """epochs over each rollout"""
    learning_rate: float = 7e-4
    """Adam step size (MAPPO's on MPE)"""
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
    share_parameters: bool = True
    """one actor and one critic for every agent, each reading its one-hot agent id too (false: one per agent)"""
    critic: str = "central"
    """central (reads every agent's observation, concatenated: MAPPO) or local (its own agent's: IPPO)"""

    @property
    def batch_size(self) -> int:
        """Env steps (joint steps) per rollout."""
        return self.num_envs * self.num_steps

    def validate(self, total_steps: int) -> None:
        for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs"):
            if getattr(self, name) < 1:
                raise UserError(f"mappo.{name}={getattr(self, name)}: must be a positive integer")
        if self.batch_size % self.num_minibatches:
            raise UserError(f"mappo: a rollout's num_envs*num_steps={self.batch_size} joint steps do not divide into "
                            f"num_minibatches={self.num_minibatches}; pick num_minibatches that divides it")
        if self.batch_size > total_steps:
            raise UserError(f"--total-steps {total_steps} is smaller than one rollout (mappo.num_envs*num_steps="
                            f"{self.batch_size}); raise --total-steps or lower num_steps")
        for name in ("learning_rate", "gamma", "gae_lambda", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"mappo.{name}={getattr(self, name)} must be a finite number")
        if not 0.0 < self.gamma <= 1.0:
            raise UserError(f"mappo.gamma={self.gamma}: must be in (0, 1]")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise UserError(f"mappo.gae_lambda={self.gae_lambda}: must be in [0, 1]")
        for name in ("learning_rate", "clip_coef", "max_grad_norm"):
            if getattr(self, name) <= 0:
                raise UserError(f"mappo.{name}={getattr(self, name)}: must be > 0")
        for name in ("ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise UserError(f"mappo.{name}={getattr(self, name)}: must be >= 0")
        if self.target_kl is not None and (not math.isfinite(self.target_kl) or self.target_kl <= 0):
            raise UserError(f"mappo.target_kl={self.target_kl}: must be a positive number, or none to disable")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            raise UserError(f"mappo.hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64,64")
        if self.critic not in CRITICS:
            raise UserError(f"mappo.critic='{self.critic}': use one of {', '.join(CRITICS)}")
