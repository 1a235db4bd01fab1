"""The one sequence of signal hooks around an advantage estimate: `apply_signals`.

Every trainer of reflectrl calls it (trainers/base.py imports it from here), and so does the
standalone interface that puts a signal into anyone's training loop (signals/standalone.py):
one code path, whoever runs the loop. `Stopwatch` times the share of an iteration a signal takes
(`signal_time_fraction`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


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
