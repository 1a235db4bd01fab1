"""HPPO's knobs (`--algo hppo`: bare names, or hppo.NAME); every default once.

The on-policy knobs (trainers/onpolicy/config.py) are PPO's defaults for discrete actions (config.DISCRETE_DEFAULTS,
CleanRL's ppo.py), so `hppo` and flat `ppo` differ by the hierarchy alone; the high level has its own
(`high_*`) where a value is about its time scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from reflectrl.errors import UserError
from reflectrl.trainers.onpolicy.config import OnPolicyConfig

GOAL_KINDS = ("relative", "absolute")
SHAPED_LEVELS = ("both", "high", "low")


@dataclass
class HPPOConfig(OnPolicyConfig):
    """HPPO's knobs: a sub-goal policy over regions of the grid, a goal-conditioned PPO that reaches them. The
    on-policy knobs (trainers/onpolicy/config.py) are the low level's, and the high level's where it has no
    `high_` one."""

    SECTION: ClassVar[str] = "hppo"

    num_steps: int = 128
    """low-level steps per env per rollout (one low-level update per rollout)"""
    ent_coef: float = 0.01
    """the low level's entropy bonus"""
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
    def high_batch_size(self) -> int:
        """Sub-goal decisions per high-level update."""
        return self.num_envs * self.high_num_steps

    @property
    def high_discount(self) -> float:
        return self.gamma ** self.horizon if self.high_gamma is None else self.high_gamma

    def validate(self, total_steps: int) -> None:
        super().validate(total_steps)

        def bad(msg):
            raise UserError(f"hppo.{msg}")

        for name in ("horizon", "goal_region", "goal_reach", "high_num_steps", "high_num_minibatches",
                     "high_update_epochs"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.high_batch_size % self.high_num_minibatches:
            bad(f"high_num_minibatches={self.high_num_minibatches} does not divide a high-level batch's "
                f"num_envs*high_num_steps={self.high_batch_size} decisions; pick one that divides it")
        for name, rows, parts in (("num_minibatches", self.batch_size, self.num_minibatches),
                                  ("high_num_minibatches", self.high_batch_size, self.high_num_minibatches)):
            if rows // parts < 2:
                bad(f"{name}={parts}: a minibatch of {rows // parts} row cannot normalise advantages; "
                    "use fewer minibatches or more steps")
        for name in ("goal_reward", "low_env_reward", "high_ent_coef"):
            if not math.isfinite(getattr(self, name)):
                bad(f"{name}={getattr(self, name)} must be a finite number")
        if self.high_gamma is not None and not (math.isfinite(self.high_gamma) and 0.0 < self.high_gamma <= 1.0):
            bad(f"high_gamma={self.high_gamma}: must be in (0, 1], or none for gamma ** horizon")
        for name in ("high_ent_coef", "low_env_reward"):
            if getattr(self, name) < 0:
                bad(f"{name}={getattr(self, name)}: must be >= 0")
        if self.goal_reward <= 0:
            bad(f"goal_reward={self.goal_reward}: must be > 0 (the low level learns from it)")
        if self.goals not in GOAL_KINDS:
            bad(f"goals='{self.goals}': use one of {', '.join(GOAL_KINDS)}")
        if self.shaped_levels not in SHAPED_LEVELS:
            bad(f"shaped_levels='{self.shaped_levels}': use one of {', '.join(SHAPED_LEVELS)}")
