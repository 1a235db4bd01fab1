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

`Stopwatch` times the share of an iteration a signal takes (`signal_time_fraction`).
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from reflectrl.envs import snapshot
from reflectrl.runs.health import RunMonitor
from reflectrl.runs.rundir import MetricsLogger
from reflectrl.runs.session import stop_requested, stopped
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
            if stop_requested() and not trainer.finished():
                if run is not None and not saved:
                    trainer.save_checkpoint()  # between iterations the state is whole: nothing is lost
                raise stopped()
    finally:
        bar.close()
        if trainer.logger is not None:
            trainer.logger.close()
            trainer.logger = None


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


class Stopwatch:
    """Accumulates the seconds spent inside `with watch:` blocks."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._start
        return False


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


# --------------------------------------------------------------------------- signals

@dataclass
class SignalResult:
    """What a signal's hooks made of one batch (apply_signals)."""

    rewards: torch.Tensor            # what the advantages were estimated from: the env's rewards and the terms
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor | None     # per-step weights on the advantage in the policy loss
    reward_term: torch.Tensor | None  # the signals' reward terms summed (shape_rewards' and after_advantages')
    shaped: torch.Tensor | None      # shape_rewards' term alone
    advantage_term: torch.Tensor | None  # after_advantages' advantage term alone
    streams: dict                    # the signals' own reward streams, by name (signals/base.py)
    terms: dict                      # each signal's per-step terms, "NAME KIND" (for state maps)
    estimated: tuple                 # the first estimate's whole output (IMPALA's V-trace statistics)
    own_estimate: Stopwatch          # the time of the estimate the trainer makes without a signal too


def apply_signals(signal, batch, estimate, *, advantage_terms: bool = True, reward_terms: bool = True,
                  on_rewards=None) -> SignalResult:
    """A run's signals (one, or a stack) around one advantage estimate, in the order signals/base.py
    states: shape_rewards, the trainer's estimate on the rewards with those terms, after_advantages
    (a reward term, re-estimated when it asks; an advantage term; weights). `estimate(rewards)` gives
    (advantages, returns, ...) in the batch's layout. Every trainer calls this; a trainer whose updates
    take no advantage terms or reward streams (the replay trainers) says so with advantage_terms=False,
    one whose steps take no reward terms (GRPO's tokens: its rewards are per sequence) with reward_terms=False;
    `on_rewards(batch)` adds what the trainer derives from the shaped rewards (MAPPO's team rewards)."""
    from reflectrl.signals import signal_terms

    own = Stopwatch()
    extra = signal.shape_rewards(batch)
    rewards = batch.rewards if extra is None else batch.rewards + extra
    with own:
        estimated = estimate(rewards)
    advantages, returns = estimated[0], estimated[1]
    batch.rewards, batch.advantages, batch.returns = rewards, advantages, returns
    if on_rewards is not None:
        on_rewards(batch)
    out = signal.after_advantages(batch)
    weights, streams, reward_term, advantage_term = None, {}, extra, None
    if not reward_terms and (extra is not None or (out is not None and out.reward is not None)):
        raise NotImplementedError(f"signal '{signal.name}' returns a per-step reward term here; this trainer takes "
                                  "per-step weights or advantage terms")
    if out is not None:
        if not advantage_terms and (out.advantage is not None or out.streams):
            raise AssertionError(f"signal '{signal.name}' gave an advantage term or a reward stream to a trainer "
                                 "that takes neither: its registry entry should have refused it")
        if out.reward is not None:
            rewards = rewards + out.reward
            reward_term = out.reward if reward_term is None else reward_term + out.reward
            if out.recompute:
                advantages, returns = estimate(rewards)[:2]
        if out.advantage is not None:
            advantages = advantages + out.advantage
        weights, streams, advantage_term = out.weights, out.streams, out.advantage
    return SignalResult(rewards, advantages, returns, weights, reward_term, extra, advantage_term, streams,
                        signal_terms(signal, extra, out), estimated, own)
