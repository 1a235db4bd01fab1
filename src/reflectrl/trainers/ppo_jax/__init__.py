"""The JAX backend (`--set backend=jax`): PPO and the signals compiled end to end and vectorised
over seeds (docs/jax.md), registered as the form of `ppo` that trains on backend=jax (its knobs are
PPO's, PPOConfig). Importing this package imports no JAX; its modules do: resolve.py (what backend=jax
runs and refuses), ppo.py (the compiled program), trainer.py (the host loop, one run or a group of
seeds), evaluate.py (eval of its runs)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "ppo", "control", backends=("jax",),
    summary="PPO compiled end to end with JAX and vectorised over seeds (--set backend=jax; docs/jax.md)",
    entry="reflectrl.trainers.ppo_jax.trainer:JaxTrainer", resolve="reflectrl.trainers.ppo_jax.resolve:resolve",
    check="reflectrl.trainers.ppo_jax.resolve:check", evaluate="reflectrl.trainers.ppo_jax.evaluate:evaluate_run",
    train_group="reflectrl.trainers.ppo_jax.trainer:train_group", groups_seeds=True, callbacks=False))
