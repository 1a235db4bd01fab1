"""PPO for Gymnasium environments (discrete and continuous actions)."""

from reflectrl.control.gae import compute_gae
from reflectrl.control.policies import ActorCritic
from reflectrl.control.ppo import PPOTrainer

__all__ = ["compute_gae", "ActorCritic", "PPOTrainer"]
