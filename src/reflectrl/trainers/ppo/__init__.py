"""PPO on Gymnasium envs: config.py (knobs, per-env defaults), resolve.py (resolve), trainer.py; its
registration (this file imports no torch: the parts are named by module path)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "ppo", "control", ("env_step",),
    frozenset({"features", "feature_grad", "next_obs", "state_keys", "value_stream", "costs", "policy"}),
    "PPO on Gymnasium envs (CleanRL's details)",
    entry="reflectrl.trainers.ppo.trainer:PPOTrainer", config="reflectrl.trainers.ppo.config:PPOConfig",
    resolve="reflectrl.trainers.ppo.resolve:resolve", load_policy="reflectrl.trainers.resolve:load_actor_critic"))
