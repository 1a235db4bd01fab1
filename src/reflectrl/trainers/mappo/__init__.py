"""MAPPO on PettingZoo parallel envs (seed 002 section 4.3): envs.py (adapter, resolve), config.py,
trainer.py; its registration (this file imports no torch or PettingZoo)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "mappo", "control", ("env_step",), frozenset({"next_obs", "team"}),
    "MAPPO on PettingZoo parallel envs (--env pettingzoo:MODULE): PPO per agent, shared weights, "
    "a centralised critic (Yu et al. 2022)",
    entry="reflectrl.trainers.mappo.trainer:MAPPOTrainer", config="reflectrl.trainers.mappo.config:MAPPOConfig",
    resolve="reflectrl.trainers.mappo.envs:resolve_multiagent",
    no_eval="is a multi-agent (mappo) run, which `reflectrl eval` does not evaluate yet; its metrics.jsonl "
            "holds the team's and each agent's returns over training", multiagent=True))
