"""The toy's knobs: the on-policy kit's (its checks and env settings included), smaller defaults."""

from dataclasses import dataclass
from typing import ClassVar

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
