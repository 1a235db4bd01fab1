"""MAPPO's knobs (`--algo mappo`: bare names, or mappo.NAME); every default once.

Defaults follow CleanRL's ppo.py where MAPPO (Yu et al. 2022) has no reason to differ, and
MAPPO's MPE settings where it does (learning rate 7e-4, a centralised critic, parameter
sharing with the agent's one-hot id appended to its observation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from reflectrl.errors import UserError
from reflectrl.trainers.onpolicy.config import OnPolicyConfig

CRITICS = ("central", "local")


@dataclass
class MAPPOConfig(OnPolicyConfig):
    """MAPPO's knobs: independent PPO per agent, shared or separate weights, a central or local critic."""

    SECTION: ClassVar[str] = "mappo"

    num_envs: int = 8
    """parallel copies of the multi-agent env"""
    num_steps: int = 128
    """steps per env per rollout (each step is one joint step of every agent)"""
    num_minibatches: int = 4
    """minibatches per epoch (of joint steps, each with every agent's step)"""
    learning_rate: float = 7e-4
    """Adam step size (MAPPO's on MPE)"""
    share_parameters: bool = True
    """one actor and one critic for every agent, each reading its one-hot agent id too (false: one per agent)"""
    critic: str = "central"
    """central (reads every agent's observation, concatenated: MAPPO) or local (its own agent's: IPPO)"""

    @property
    def batch_size(self) -> int:
        """Env steps (joint steps) per rollout."""
        return self.num_envs * self.num_steps

    def validate(self, total_steps: int) -> None:
        super().validate(total_steps)
        if self.critic not in CRITICS:
            raise UserError(f"mappo.critic='{self.critic}': use one of {', '.join(CRITICS)}")
