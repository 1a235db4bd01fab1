"""Run an experiment's runs, locally in parallel processes or as Ray tasks, resumably.

Each run is an ordinary `reflectrl train` (a fresh run, or `--resume` of an interrupted
one), so a run directory made by `compare` is the same as one made by hand and every
guarantee of a run (atomic checkpoints, bit-identical resume) carries over. Running
`compare` again skips finished runs, resumes interrupted ones from their checkpoints and
restarts only runs killed before their first checkpoint.

This module is the orchestration; the parts live beside it:
* state.py: what each run has done (finished | resume | fresh), the experiment lock, the result;
* local.py: the `local` backend, up to `workers` subprocesses at once (default: the cores);
* ray_backend.py: the `ray` backend, one Ray task per run, run directories sent as archives;
* progress.py: the one progress display.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from reflectrl.errors import UserError
from reflectrl.experiments.local import run_local
from reflectrl.experiments.progress import Progress
from reflectrl.experiments.ray_backend import pack, ray_task, run_ray, unpack
from reflectrl.experiments.spec import ExperimentSpec, RunSpec, load_or_create
from reflectrl.experiments.state import ExperimentResult, exclusive, log_path, run_state, runs_to_train, train_argv
from reflectrl.runs.files import last_logged_step

# The names this module had before it was split, for code that imports them from here.
_exclusive, _Progress, _run_local, _run_ray = exclusive, Progress, run_local, run_ray
_pack, _unpack, _ray_task, _last_step, _log_path = pack, unpack, ray_task, last_logged_step, log_path

__all__ = ["ExperimentResult", "run_experiment", "run_state", "train_argv", "validate_runs"]


def validate_runs(spec: ExperimentSpec, root: Path) -> list[RunSpec]:
    """Check every distinct run configuration before anything starts."""
    runs = spec.runs(root)
    seen = set()
    for run in runs:
        key = (run.env_id, run.entry.label)
        if key not in seen:
            seen.add(key)
            run.config()
    from reflectrl.envs import check_new_processes_can_make

    check_new_processes_can_make(spec.envs)  # each run is a new process: an id registered only here is refused now
    return runs


def run_experiment(root: Path, spec: ExperimentSpec, backend: str = "local", workers: int | None = None,
                   ray_address: str | None = None, progress: bool = True) -> ExperimentResult:
    spec.validate()
    if backend not in ("local", "ray"):
        raise UserError(f"unknown --backend '{backend}'; use local or ray")
    if workers is not None and workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    runs = validate_runs(spec, root)
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError("--backend ray needs Ray: pip install 'reflectrl[ray]'") from None
    with exclusive(root):
        result = ExperimentResult(added=load_or_create(root, spec))
        if result.added:
            print(f"reflectrl: extending {root} with {', '.join(result.added)}", file=sys.stderr)
        todo = runs_to_train(runs, result)
        bar = Progress(spec, runs, result, progress)
        try:
            if backend == "local":
                run_local(todo, workers or os.cpu_count() or 1, result, bar)
            else:
                run_ray(todo, workers, ray_address, result, bar)
        finally:
            bar.close()
    return result
