"""Training a control run, as `reflectrl train` and the Python API (api.py) do it: the trainer a
resolved config names (the registry's form of its --algo's trainer on its backend), and what a
finished run records."""

from __future__ import annotations

import sys


def trainer_form(cfg):
    """The registry's form of the run's trainer on the run's env backend (its TrainerSpec)."""
    from reflectrl.config import trainer_name
    from reflectrl.registry import trainer_spec

    return trainer_spec(trainer_name(cfg), cfg.backend)


def make_trainer(cfg, run):
    """The trainer --algo names, in its form for the run's backend (registry.trainer_spec: PPO on
    Gymnasium or EnvPool, the compiled JAX PPO on backend=jax), built for a resolved config."""
    trainer_class = trainer_form(cfg).load("entry")
    if "torch" in sys.modules:  # a torch trainer (its module imports torch): its optimizers without the compiler
        from reflectrl.torch_setup import optimizers_without_dynamo

        optimizers_without_dynamo()  # 2.5 s of start-up that only a compiler needs (torch_setup.py)
    return trainer_class(cfg, run)


def finish(trainer, run) -> None:
    """A control run's end, as its trainer records it (trainer.finish: its status, finished with its step
    and params_sha256, the signals' end-of-run steps, one line saying what it reached)."""
    trainer.finish(run)


def train_group(items: list, progress: bool = False) -> int:
    """`reflectrl train-group`: runs of one configuration, differing in their seed (and the knobs its
    program vectorises), trained as one program by their trainer's form that groups seeds (its
    TrainerSpec.train_group). Each item is (run directory, its resolved config for a new run or None to
    resume it, the `reflectrl train` arguments that made it); returns the exit code."""
    from reflectrl.config import RunConfig
    from reflectrl.errors import UserError
    from reflectrl.runs.files import run_config

    forms = {}
    for path, cfg, _ in items:
        if cfg is None:  # resumed: the config it was made with
            held = run_config(path)
            if held is None:
                raise UserError(f"train-group: {path} holds no readable config.json to resume from; train it again")
            cfg = RunConfig.from_dict(held)
        forms[trainer_form(cfg)] = cfg.backend
    if len(forms) > 1:
        raise UserError("train-group: its runs must be of one trainer on one backend")
    if not forms:
        return 0
    (spec, backend), = forms.items()
    if not spec.train_group:
        raise UserError(f"train-group trains the seeds of a trainer that runs them as one program; --algo "
                        f"{spec.name} on backend={backend} trains each run alone (reflectrl train)")
    return spec.load("train_group")(items, progress=progress)
