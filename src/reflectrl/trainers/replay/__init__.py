"""The replay trainers: DQN and SAC (dqn.py, sac.py) on one loop (base.py) and buffer (buffer.py);
config.py (knobs), resolve.py (resolve, eval policies); their registrations (this file imports no torch)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "dqn", "control", ("transition",), frozenset({"features", "next_obs"}),
    "DQN on Gymnasium envs with discrete actions (CleanRL's dqn.py / dqn_atari.py)",
    entry="reflectrl.trainers.replay.dqn:DQNTrainer", config="reflectrl.trainers.replay.config:DQNConfig",
    resolve="reflectrl.trainers.replay.resolve:resolve_dqn",
    load_policy="reflectrl.trainers.replay.resolve:load_dqn_policy"))
register_trainer(TrainerSpec(
    "sac", "control", ("transition",), frozenset({"next_obs"}),
    "SAC on Gymnasium envs with continuous actions (CleanRL's sac_continuous_action.py)",
    entry="reflectrl.trainers.replay.sac:SACTrainer", config="reflectrl.trainers.replay.config:SACConfig",
    resolve="reflectrl.trainers.replay.resolve:resolve_sac",
    load_policy="reflectrl.trainers.replay.resolve:load_sac_policy"))
