"""The episodic count bonus (issue 15 item 5): r_t += beta / sqrt(N_episode(s_{t+1})).

The baseline any new exploration bonus must beat on MiniGrid (E3B, Henaff et al. 2022;
NovelD, Zhang et al. 2021, whose episodic term is the count's indicator form). N_episode(s)
counts the visits of an env's current episode to the state key s (envs/statekey.py: the grid
world's cell, MiniGrid's position, heading and carried object, Montezuma's room and
position, a SimHash of the observation elsewhere), its first state included: an episode's
counts start at {s_0: 1} and are dropped when it ends. Step t's bonus is paid on the state
it reaches, so a step to a state new in this episode earns beta, a second visit
beta / sqrt(2), and so on. Counts of episodes still running carry over from one rollout to
the next (and through a checkpoint). `episodic=false` counts over all of training and every
env instead (the classic 1 / sqrt(N(s)) bonus, as MBIE-EB).

The bonus is a reward term added before advantages are estimated; `beta=0` adds exact zeros,
so the run equals --algo ppo bit for bit. `schedule` decays beta over the run (constant, the
default, leaves it as it is; linear or exponential: signals/schedule.py), so that a decayed
count bonus is a baseline on the same terms as a variant that outlives its bonus (issue 42).
"""

from __future__ import annotations

import numpy as np
import torch

from reflectrl.signals.base import Batch, Signal, SignalContext
from reflectrl.signals.count import SPEC, CountConfig
from reflectrl.signals.schedule import factor_at


class CountBonus(Signal):
    name = "count"

    def __init__(self, cfg: CountConfig):
        self.built_from(cfg, SPEC)
        self.cfg = cfg
        self.counts: dict | None = None  # {env: its episode's counts} (episodic), or {0: all of training's}
        self.starting: dict | None = None  # {env: its next step starts an episode}
        self._last: dict = {}

    def bind(self, ctx: SignalContext) -> None:
        super().bind(ctx)
        self.counts = self.starting = None

    def visits(self, state_keys: np.ndarray, next_state_keys: np.ndarray, ended: np.ndarray,
               env_ids: np.ndarray | None = None) -> np.ndarray:
        """(T, N) visit counts N(s_{t+1}) after each step, updating the running counts.
        `env_ids` (N,): the env each column continues (Batch.env_ids); None: column i is env i."""
        T, N = next_state_keys.shape
        if self.counts is None:
            self.counts, self.starting = {}, {}
        out = np.empty((T, N), dtype=np.int64)
        for i in range(N):
            env = int(env_ids[i]) if env_ids is not None else i
            counts = self.counts.setdefault(env if self.cfg.episodic else 0, {})
            for t in range(T):
                if self.starting.get(env, True):
                    if self.cfg.episodic:
                        counts.clear()
                    start = int(state_keys[t, i])
                    counts[start] = counts.get(start, 0) + 1
                    self.starting[env] = False
                key = int(next_state_keys[t, i])
                n = counts.get(key, 0) + 1
                counts[key] = out[t, i] = n
                if ended[t, i]:
                    self.starting[env] = True
        return out

    def shape_rewards(self, batch: Batch) -> torch.Tensor:
        ended = (batch.terminations.bool() | batch.truncations.bool()).numpy()
        n = self.visits(batch.state_keys.numpy(), batch.next_state_keys.numpy(), ended,
                        None if batch.env_ids is None else batch.env_ids.numpy())
        beta = self.cfg.beta * factor_at(self.cfg, batch, self.ctx.total_iterations)
        bonus = (beta / np.sqrt(n)).astype(np.float32)
        self._last = {"count_bonus_mean": float(bonus.mean()), "count_visits_mean": float(n.mean()),
                      "count_new_frac": float((n == 1).mean()), "count_beta": beta}
        return torch.from_numpy(bonus)

    def metrics(self) -> dict:
        return dict(self._last)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "counts": self.counts, "starting": self.starting}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        counts, starting = state["counts"], state["starting"]
        if isinstance(counts, list):  # written before env ids: one entry per column
            counts, starting = dict(enumerate(counts)), dict(enumerate(starting))
        self.counts, self.starting = counts, starting
