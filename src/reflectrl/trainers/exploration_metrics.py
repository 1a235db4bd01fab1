"""Exploration metrics of a control run (issue 15 item 6; seed 002 section 5.1), logged every
iteration by the PPO trainer, and the per-step state keys they count.

Every iteration's row gets:

- `unique_states`: distinct state keys among the iteration's steps (the states acted in);
- `unique_states_total`: distinct keys over all of training so far (checkpointed, so it
  survives a resume);
- `visitation_entropy`: the entropy (nats) of the keys' visit frequencies over the last
  `WINDOW` iterations: log(number of states) for a uniform visitation, 0 for one state;
- `rooms_visited`: Montezuma's Revenge only, distinct rooms (RAM byte 3) so far;
- `first_reward_step`: the global step (the trainer's env-step counter after that vector
  step) of the first non-zero extrinsic reward, None until then. "Extrinsic" is the reward
  the trainer learns from before any signal's term: the env's reward after its wrappers
  (a `sparse`/`delayed` wrapper pays it later; reward normalisation keeps it non-zero).

The keys come from envs/statekey.py. `RolloutKeys` gathers them during collection:
`state_keys[t]` is the key of obs[t], `next_state_keys[t]` the key of the state the step
reached (the episode's last state where it ended, not the next episode's first).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from reflectrl.envs.statekey import deferred_wrappers, room_of_key, simhash_observations

WINDOW = 10  # iterations in the visitation-entropy window
METRICS = ("unique_states", "unique_states_total", "visitation_entropy", "rooms_visited", "first_reward_step")


class RolloutKeys:
    """The state keys of one rollout, (T, N) int64, from `info["state_key"]` (or a SimHash of
    the observations where the envs give none), and the key of each env's current state.

    A trainer calls `start(T, envs)` before a rollout, `record(t, ...)` after each vector step
    and `finish()` after the last, before it reads `state_keys`/`next_state_keys`. Where the envs'
    StateKey wrappers defer their SimHash keys (envs/statekey.py), `record` only notes which envs
    reset and `finish` hashes the rollout's observations in one product."""

    def __init__(self, obs: np.ndarray, info: dict):
        self.current = self._keys(obs, info)
        self.state_keys = self.next_state_keys = None
        self.wrappers = None
        self.seconds = 0.0  # time spent in record and finish (exploration_time_fraction)

    @staticmethod
    def _keys(obs, info: dict) -> np.ndarray:
        keys = info.get("state_key")
        if keys is None or not np.all(info.get("_state_key", True)):
            return simhash_observations(obs)
        return np.asarray(keys, dtype=np.int64).copy()

    def start(self, num_steps: int, envs=None) -> None:
        n = len(self.current)
        self.state_keys = np.zeros((num_steps, n), dtype=np.int64)
        self.next_state_keys = np.zeros((num_steps, n), dtype=np.int64)
        self.wrappers = deferred_wrappers(envs) if envs is not None else None
        if self.wrappers is not None:
            for w in self.wrappers:
                w.take()  # rows of steps outside a rollout (none in training) are not this rollout's
            self.reset_keys = np.zeros((num_steps, n), dtype=np.int64)
            self.reset_mask = np.zeros((num_steps, n), dtype=bool)
            self.steps = 0

    def record(self, t: int, next_obs, info: dict) -> None:
        """After step t: keys of the states reached, and of the envs' states from now on."""
        if self.wrappers is not None:  # deferred: only which envs reset, and their new keys
            if "state_key" in info:
                began = time.perf_counter()
                mask = np.asarray(info["_state_key"], dtype=bool)
                self.reset_mask[t] = mask
                self.reset_keys[t, mask] = np.asarray(info["state_key"], dtype=np.int64)[mask]
                self.seconds += time.perf_counter() - began
            self.steps = t + 1
            return
        began = time.perf_counter()
        self.state_keys[t] = self.current
        keys = self._keys(next_obs, info)  # after an autoreset: the next episode's first state
        self.next_state_keys[t] = keys
        if "final_obs" in info:
            final = info["final_info"]
            for i in np.flatnonzero(info["_final_obs"]):
                if "state_key" in final and final["_state_key"][i]:
                    self.next_state_keys[t, i] = final["state_key"][i]
                else:
                    self.next_state_keys[t, i] = simhash_observations(np.asarray(info["final_obs"][i])[None])[0]
        self.current = keys
        self.seconds += time.perf_counter() - began

    def finish(self) -> None:
        """After the rollout's last step: the deferred keys, hashed at once (a no-op otherwise)."""
        if self.wrappers is None:
            return
        began = time.perf_counter()
        T = self.steps
        rows = [w.take() for w in self.wrappers]
        if any(len(r) != T for r in rows):
            raise RuntimeError(f"state keys: expected {T} steps per env, got {[len(r) for r in rows]}")
        n = len(rows)
        if T:
            stacked = np.stack([np.stack(r) for r in rows], axis=1)  # (T, N, D)
            reached = simhash_observations(stacked.reshape(T * n, -1)).reshape(T, n)  # the state each step reached
            after = np.where(self.reset_mask[:T], self.reset_keys[:T], reached)  # each env's state after it
            self.next_state_keys[:T] = reached
            self.state_keys[0] = self.current
            self.state_keys[1:T] = after[:-1]
            self.current = after[-1].copy()
        self.wrappers = None
        self.seconds += time.perf_counter() - began


class ExplorationTracker:
    """The running bookkeeping behind the metrics above; `update` once per iteration."""

    def __init__(self, rooms: bool = False, window: int = WINDOW):
        self.rooms = rooms
        self.seen = np.zeros(0, dtype=np.int64)          # sorted distinct keys so far
        self.recent: deque = deque(maxlen=window)          # (keys, counts) of the last iterations
        self.rooms_seen = np.zeros(0, dtype=np.int64)
        self.first_reward_step: int | None = None

    def update(self, state_keys: np.ndarray, rewards: np.ndarray, step_before: int) -> dict:
        """Metrics after an iteration whose (T, N) keys and extrinsic rewards are given;
        `step_before` is the global step at the iteration's start."""
        keys, counts = np.unique(np.asarray(state_keys, dtype=np.int64), return_counts=True)
        self.seen = np.union1d(self.seen, keys)
        self.recent.append((keys, counts))
        if self.first_reward_step is None:
            rewards = np.asarray(rewards)
            hit = np.flatnonzero((rewards != 0).any(axis=1))
            if hit.size:
                self.first_reward_step = int(step_before + (hit[0] + 1) * rewards.shape[1])
        row = {
            "unique_states": int(keys.size),
            "unique_states_total": int(self.seen.size),
            "visitation_entropy": self.visitation_entropy(),
            "first_reward_step": self.first_reward_step,
        }
        if self.rooms:
            self.rooms_seen = np.union1d(self.rooms_seen, room_of_key(keys))
            row["rooms_visited"] = int(self.rooms_seen.size)
        return row

    def visitation_entropy(self) -> float:
        keys = np.concatenate([k for k, _ in self.recent])
        counts = np.concatenate([c for _, c in self.recent])
        _, inverse = np.unique(keys, return_inverse=True)
        p = np.bincount(inverse, weights=counts)
        p = p / p.sum()
        return float(-(p * np.log(p)).sum())

    def state_dict(self) -> dict:
        return {"seen": self.seen, "recent": list(self.recent), "rooms_seen": self.rooms_seen,
                "first_reward_step": self.first_reward_step}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]
        self.recent = deque(state["recent"], maxlen=self.recent.maxlen)
        self.rooms_seen = state["rooms_seen"]
        self.first_reward_step = state["first_reward_step"]
