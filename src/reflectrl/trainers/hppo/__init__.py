"""Two-level PPO (seed 002 section 6.1): goals.py (goal space, resolve), config.py, trainer.py; its
registration (this file imports no torch)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "hppo", "control", ("env_step",), frozenset({"features", "next_obs", "state_keys"}),
    "two-level PPO on grids (the grid world, MiniGrid): a sub-goal policy over regions and a goal-conditioned "
    "one that reaches them; a signal runs at each level (seed 002 section 6.1)",
    entry="reflectrl.trainers.hppo.trainer:HPPOTrainer", config="reflectrl.trainers.hppo.config:HPPOConfig",
    resolve="reflectrl.trainers.hppo.goals:resolve", load_policy="reflectrl.trainers.hppo.trainer:load_policy"))
