"""IMPALA: actors (actor.py) in a pool (pool.py) feeding one V-trace learner (trainer.py); config.py; its
registration (this file imports no torch or Ray)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "impala", "control", ("env_step",), frozenset({"features", "next_obs", "state_keys", "value_stream"}),
    "IMPALA on Ray: actors step envs in parallel, one learner applies V-trace (Espeholt et al. 2018)",
    entry="reflectrl.trainers.impala.trainer:IMPALATrainer", config="reflectrl.trainers.impala.config:IMPALAConfig",
    resolve="reflectrl.trainers.impala.config:resolve", load_policy="reflectrl.trainers.resolve:load_actor_critic"))
