"""The shared layer of every trainer: the train-loop skeleton, the loop hooks a control trainer
shares (EnvStepTrainer), the checkpoint helpers, and `apply_signals`.

The train-loop skeleton every trainer runs: metrics log and TensorBoard, progress bar,
checkpoint cadence (and a checkpoint before the first update), the run's health warnings
and time estimate, and the stop at an iteration boundary that SIGTERM or Ctrl-C asks for.

A trainer plugs in by providing (see PPOTrainer and GRPOTrainer):

    run                   RunDir or None (None: train without writing anything)
    logger                MetricsLogger or None (the loop opens and closes it)
    unit                  what progress counts ("env steps", "steps")
    total_units()         progress at the end of training
    units_done()          progress so far (0 before the first iteration)
    finished()            True when no iteration is left
    run_iteration()       one iteration; returns its metrics row (with "global_step")
    checkpoint_due(before) whether to checkpoint after an iteration that started at `before`
    save_checkpoint()
    prepare()             optional: start what training needs (IMPALA's actors) before the clock starts
    on_start(logger)      optional: log something before the first iteration
    postfix(row)          optional: the progress bar's text
    discrete_entropy      optional: whether `entropy` is a discrete policy's (for the collapse warning)
    callbacks             optional: f(trainer, row) called after each iteration; False (or raising
                          StopTraining) stops there with a checkpoint, as Ctrl-C does (the Python API's)

`apply_signals`, `SignalResult` and `Stopwatch` (the share of an iteration a signal takes,
`signal_time_fraction`) live in signals/apply.py, where the standalone interface calls them too;
the trainers import them from here.
"""

from __future__ import annotations

import random
import sys
import time
import warnings

import numpy as np
import torch

from reflectrl.envs import snapshot
from reflectrl.runs.health import RunMonitor
from reflectrl.runs.rundir import MetricsLogger
from reflectrl.runs.session import stop_requested, stopped
from reflectrl.signals.apply import (  # noqa: F401 (their home is signals/apply.py; trainers import them here)
    SignalResult,
    Stopwatch,
    apply_signals,
)
from reflectrl.trainers.exploration_metrics import RolloutKeys


def train_loop(trainer, progress: bool = True) -> None:
    from reflectrl.runs.progress import progress_bar

    run = trainer.run
    started = trainer.units_done() > 0
    note = trainer.budget_note() if not started and hasattr(trainer, "budget_note") else None
    if note:
        print(f"reflectrl: note: {note}", file=sys.stderr)
    if run is not None and trainer.logger is None:
        # always cut what was logged past the step we start from: a run resumed from its step-0
        # checkpoint (killed before its first periodic one) must not keep the rows it logged
        trainer.logger = MetricsLogger(run, resume_step=trainer.units_done())
        if not started:
            trainer.save_checkpoint()  # a good checkpoint exists before the first update
    if hasattr(trainer, "prepare"):
        trainer.prepare()  # e.g. start actor processes: not part of the first iteration's speed, and a
        # refusal there comes before the progress bar
    total = trainer.total_units()
    bar = progress_bar(total, trainer.unit, initial=trainer.units_done(), enabled=progress)
    monitor = RunMonitor(total, trainer.unit, discrete_entropy=getattr(trainer, "discrete_entropy", True))
    session_start, session_first = time.perf_counter(), trainer.units_done()
    try:
        if hasattr(trainer, "on_start"):
            trainer.on_start(trainer.logger)
        while not trainer.finished():
            before = trainer.units_done()
            row = trainer.run_iteration()
            if trainer.logger is not None:
                trainer.logger.log(row)
            done = trainer.units_done()
            bar.update(done - before)
            monitor.after_iteration(row, done, done - session_first, time.perf_counter() - session_start)
            if hasattr(trainer, "postfix"):
                bar.set_postfix_str(trainer.postfix(row), refresh=False)
            saved = run is not None and (trainer.checkpoint_due(before) or trainer.finished())
            if saved:
                trainer.save_checkpoint()
            asked = callbacks_stop(trainer, row)
            if (stop_requested() or asked) and not trainer.finished():
                if run is not None and not saved:
                    trainer.save_checkpoint()  # between iterations the state is whole: nothing is lost
                raise stopped() if stop_requested() else StopTraining()
    finally:
        bar.close()
        if trainer.logger is not None:
            trainer.logger.close()
            trainer.logger = None


class StopTraining(KeyboardInterrupt):
    """Raised by a callback to stop training at this iteration's end (as returning False does): the run is
    checkpointed there and marked interrupted, as after Ctrl-C, and resumes from there."""


def callbacks_stop(trainer, row: dict) -> bool:
    """Call each of `trainer.callbacks` (set by the Python API; none by default) with the trainer and the
    iteration's metrics row; True when one asks to stop (it returns False or raises StopTraining)."""
    asked = False
    for callback in getattr(trainer, "callbacks", ()):
        try:
            asked = callback(trainer, row) is False or asked
        except StopTraining:
            asked = True
    return asked


def crossed(before: int, after: int, every: int) -> bool:
    """Whether progress from `before` to `after` passed a multiple of `every` (checkpoint cadence)."""
    return after // every > before // every


class EnvStepTrainer:
    """What train_loop needs of a control trainer that counts env steps (PPO, DQN, SAC, IMPALA),
    written once: the subclass keeps `global_step`, `iteration`, `num_iterations`,
    `recent_returns` and `cfg.checkpoint_every`, and gives `total_units()` and `run_iteration()`."""

    unit = "env steps"
    iteration_knobs = "num_envs x num_steps"  # what one iteration's env steps are made of (the budget note)

    def budget_note(self) -> str | None:
        """Where the trainer cannot train exactly --total-steps (it trains in whole iterations),
        the line that says so at the start of a run, and why."""
        asked, total = self.cfg.total_steps, self.total_units()
        if total == asked:
            return None
        from reflectrl.config import RunConfig

        per = total // max(self.num_iterations, 1)
        default = " (the default)" if asked == RunConfig.total_steps else ""  # a user who gave none sees why
        return (f"--total-steps {asked:,}{default} is not a multiple of one iteration's {per:,} env steps "
                f"({self.iteration_knobs}); training {total:,} env steps ({self.num_iterations:,} iterations)")

    def units_done(self) -> int:
        return self.global_step

    def finished(self) -> bool:
        return self.iteration >= self.num_iterations

    def checkpoint_due(self, before: int) -> bool:
        return crossed(before, self.global_step, self.cfg.checkpoint_every)

    def postfix(self, row: dict) -> str:
        return f"return={np.mean(self.recent_returns):.3g}" if self.recent_returns else ""

    def train(self, progress: bool = True) -> None:
        train_loop(self, progress)

    def finish(self, run) -> None:
        """The run's end (`reflectrl train`'s, the Python API's): its status (finished, its step and
        params_sha256), the signals' end-of-run steps, one line saying what it reached."""
        from reflectrl.registry import finish_signals
        from reflectrl.runs.progress import recent_return_text
        from reflectrl.trainers.policies import params_sha256

        run.set_status("finished", global_step=self.global_step, params_sha256=params_sha256(self.policy_module))
        finish_signals(self.cfg.algo, "control", run.path)
        print(f"finished {self.cfg.algo} on {self.cfg.env_id}: {self.global_step} steps, "
              f"{recent_return_text(self.recent_returns)}; run: {run.path}")


# --------------------------------------------------------------------------- checkpoints
# What every control trainer's checkpoint holds beyond its own networks: the global RNGs, the
# exploration bookkeeping, and the envs (an exact snapshot, with the episodes that cannot be
# snapshotted restarted and said so).


def global_rngs() -> dict:
    return {"torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}


def restore_global_rngs(state: dict) -> None:
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def exploration_state(trainer) -> dict:
    return {"tracker": trainer.exploration.state_dict(), "current_keys": trainer.keys.current.copy()}


def restore_exploration(trainer, state: dict | None) -> None:
    if state:  # a checkpoint from before the exploration metrics starts them afresh
        trainer.exploration.load_state_dict(state["tracker"])
        trainer.keys.current = state["current_keys"].copy()


def restore_envs(trainer, data: bytes) -> list[tuple[int, np.ndarray]]:
    """Replace `trainer.envs` with the snapshot `data`; the (env index, first observation) of
    each env whose episode had to restart (its state keys are reset here; the caller puts the
    observation into its own next-observation buffer)."""
    trainer.envs.close()
    trainer.envs, stale = snapshot.loads(data)
    restarted = []
    if stale:
        warnings.warn(
            f"env '{trainer.cfg.env_id}' cannot be snapshotted exactly; its {len(stale)} in-progress "
            "episode(s) restart on resume, so this run is not bit-identical to an uninterrupted one",
            stacklevel=3,
        )
        for i in stale:
            obs, info = trainer.envs.envs[i].reset(seed=trainer.cfg.seed + trainer.global_step + i)
            trainer.keys.current[i] = RolloutKeys(obs[None], {k: [v] for k, v in info.items()}).current[0]
            restarted.append((i, obs))
    return restarted
