"""The toy's knobs: the on-policy kit's, smaller defaults."""

from dataclasses import dataclass
from typing import ClassVar

from reflectrl.config import EnvSettings
from reflectrl.trainers.onpolicy.config import OnPolicyConfig


@dataclass
class ToyConfig(OnPolicyConfig):
    SECTION: ClassVar[str] = "toy"

    num_envs: int = 2
    """parallel envs"""
    num_steps: int = 32
    """steps per env per rollout"""
    num_minibatches: int = 2
    """minibatches per epoch"""
    update_epochs: int = 1
    """epochs over each rollout"""

    def env_settings(self) -> EnvSettings:
        return EnvSettings(self.num_envs, False, False, 10.0, 10.0, self.gamma, "mlp")
