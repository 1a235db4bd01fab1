"""HPPO's knobs (`--algo hppo`: bare names, or hppo.NAME); every default once.

The low level's PPO knobs are PPO's defaults for discrete actions (config.DISCRETE_DEFAULTS, CleanRL's
ppo.py), so `hppo` and flat `ppo` differ by the hierarchy alone; the high level's (`high_*`) default to
the same values where a value makes sense on its time scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.errors import UserError

GOAL_KINDS = ("relative", "absolute")
SHAPED_LEVELS = ("both", "high", "low")


@dataclass
class HPPOConfig:
    """HPPO's knobs: a sub-goal policy over regions of the grid, a goal-conditioned PPO that reaches them."""

    num_envs: int = 4
    """parallel envs"""
    num_steps: int = 128
    """low-level steps per env per rollout (one low-level update per rollout)"""
    num_minibatches: int = 4
    """the low level's minibatches per epoch"""
    update_epochs: int = 4
    """the low level's epochs over each rollout"""
    learning_rate: float = 2.5e-4
    """Adam step size of both levels"""
    anneal_lr: bool = True
    """decay both levels' learning rates linearly to 0 over training"""
    gamma: float = 0.99
    """the low level's discount per env step"""
    gae_lambda: float = 0.95
    """GAE's lambda at both levels"""
    clip_coef: float = 0.2
    """PPO's clip range (both levels)"""
    clip_vloss: bool = True
    """clip the value loss as CleanRL does (both levels)"""
    ent_coef: float = 0.01
    """the low level's entropy bonus"""
    vf_coef: float = 0.5
    """value loss weight (both levels)"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip (each level's)"""
    target_kl: float | None = None
    """stop an update's epochs once the approximate KL exceeds this (none: never; both levels)"""
    norm_adv: bool = True
    """normalise advantages per minibatch (both levels)"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """actor and critic MLP widths of both levels (tanh), e.g. 64,64"""
    horizon: int = 16
    """K: the most low-level steps one sub-goal is pursued for (it ends sooner when reached or the episode ends)"""
    goal_region: int = 3
    """the side, in cells, of the square regions the grid is cut into; a sub-goal is one region (1: a cell)"""
    goals: str = "relative"
    """relative: the high level picks one of the regions within goal_reach of the agent's (HIRO-style offsets);
    absolute: any region of the grid"""
    goal_reach: int = 1
    """goals=relative: how many regions away a sub-goal may be ((2 reach + 1)^2 - 1 choices)"""
    goal_reward: float = 1.0
    """the low level's reward on reaching its sub-goal (which ends its episode)"""
    low_env_reward: float = 1.0
    """the env's reward in the low level's, times this (FeUdal's worker: the env's reward and the sub-goal's; 0: the
    low level works for its sub-goals alone, and nothing pays the last steps from a goal region onto the env's goal)"""
    high_num_steps: int = 32
    """sub-goal decisions per env per high-level update"""
    high_num_minibatches: int = 4
    """the high level's minibatches per epoch"""
    high_update_epochs: int = 4
    """the high level's epochs over each of its batches"""
    high_gamma: float | None = None
    """the high level's discount per decision (none: gamma ** horizon)"""
    high_ent_coef: float = 0.01
    """the high level's entropy bonus"""
    shaped_levels: str = "both"
    """hppo+SIGNAL: the levels the signals run on, each with its own instance: both, high (F_high) or low (F_low)"""

    @property
    def batch_size(self) -> int:
        """Env steps per low-level rollout."""
        return self.num_envs * self.num_steps

    @property
    def high_batch_size(self) -> int:
        """Sub-goal decisions per high-level update."""
        return self.num_envs * self.high_num_steps

    @property
    def high_discount(self) -> float:
        return self.gamma ** self.horizon if self.high_gamma is None else self.high_gamma

    def validate(self, total_steps: int) -> None:
        def bad(msg):
            raise UserError(f"hppo.{msg}")

        for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "horizon", "goal_region",
                     "goal_reach", "high_num_steps", "high_num_minibatches", "high_update_epochs"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.batch_size % self.num_minibatches:
            bad(f"num_minibatches={self.num_minibatches} does not divide a rollout's num_envs*num_steps="
                f"{self.batch_size} steps; pick one that divides it")
        if self.high_batch_size % self.high_num_minibatches:
            bad(f"high_num_minibatches={self.high_num_minibatches} does not divide a high-level batch's "
                f"num_envs*high_num_steps={self.high_batch_size} decisions; pick one that divides it")
        for name, rows, parts in (("num_minibatches", self.batch_size, self.num_minibatches),
                                  ("high_num_minibatches", self.high_batch_size, self.high_num_minibatches)):
            if rows // parts < 2:
                bad(f"{name}={parts}: a minibatch of {rows // parts} row cannot normalise advantages; "
                    "use fewer minibatches or more steps")
        if self.batch_size > total_steps:
            raise UserError(f"--total-steps {total_steps} is smaller than one rollout (hppo.num_envs*num_steps="
                            f"{self.batch_size}); raise --total-steps or lower num_steps")
        for name in ("learning_rate", "gamma", "gae_lambda", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm",
                     "goal_reward", "low_env_reward", "high_ent_coef"):
            if not math.isfinite(getattr(self, name)):
                bad(f"{name}={getattr(self, name)} must be a finite number")
        if not 0.0 < self.gamma <= 1.0:
            bad(f"gamma={self.gamma}: must be in (0, 1]")
        if self.high_gamma is not None and not (math.isfinite(self.high_gamma) and 0.0 < self.high_gamma <= 1.0):
            bad(f"high_gamma={self.high_gamma}: must be in (0, 1], or none for gamma ** horizon")
        if not 0.0 <= self.gae_lambda <= 1.0:
            bad(f"gae_lambda={self.gae_lambda}: must be in [0, 1]")
        for name in ("learning_rate", "clip_coef", "max_grad_norm"):
            if getattr(self, name) <= 0:
                bad(f"{name}={getattr(self, name)}: must be > 0")
        for name in ("ent_coef", "vf_coef", "high_ent_coef", "low_env_reward"):
            if getattr(self, name) < 0:
                bad(f"{name}={getattr(self, name)}: must be >= 0")
        if self.goal_reward <= 0:
            bad(f"goal_reward={self.goal_reward}: must be > 0 (the low level learns from it)")
        if self.target_kl is not None and (not math.isfinite(self.target_kl) or self.target_kl <= 0):
            bad(f"target_kl={self.target_kl}: must be a positive number, or none to disable")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64,64")
        if self.goals not in GOAL_KINDS:
            bad(f"goals='{self.goals}': use one of {', '.join(GOAL_KINDS)}")
        if self.shaped_levels not in SHAPED_LEVELS:
            bad(f"shaped_levels='{self.shaped_levels}': use one of {', '.join(SHAPED_LEVELS)}")
