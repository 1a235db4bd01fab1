"""Training a control run, as `reflectrl train` and the Python API (api.py) do it: the trainer a
resolved config names (the registry's), and what a finished run records."""

from __future__ import annotations


def make_trainer(cfg, run):
    """The trainer --algo names (the registry's TRAINERS), built for a resolved config; on
    backend=jax, the compiled JAX PPO (trainers/ppo_jax/)."""
    from reflectrl.config import trainer_name
    from reflectrl.registry import trainer_class

    if cfg.backend == "jax":
        from reflectrl.trainers.ppo_jax.trainer import JaxTrainer

        return JaxTrainer(cfg, run)
    from reflectrl.torch_setup import optimizers_without_dynamo

    optimizers_without_dynamo()  # 2.5 s of start-up that only a compiler needs (torch_setup.py)
    return trainer_class(trainer_name(cfg))(cfg, run)


def finish(trainer, run) -> None:
    """A control run's end: its status (finished, its step and params_sha256), the signals' end-of-run
    steps, one line saying what it reached."""
    from reflectrl.registry import finish_signals
    from reflectrl.runs.progress import recent_return_text
    from reflectrl.trainers.policies import params_sha256

    if hasattr(trainer, "group"):  # backend=jax
        from reflectrl.trainers.ppo_jax.trainer import finish_run

        finish_run(trainer.group, 0, run)
        return
    run.set_status("finished", global_step=trainer.global_step, params_sha256=params_sha256(trainer.policy_module))
    finish_signals(trainer.cfg.algo, "control", run.path)
    print(f"finished {trainer.cfg.algo} on {trainer.cfg.env_id}: {trainer.global_step} steps, "
          f"{recent_return_text(trainer.recent_returns)}; run: {run.path}")
