"""A replay buffer of transitions (s, a, r, s', terminated) for off-policy trainers.

Fixed-capacity numpy arrays written circularly; observations keep the env's dtype (Atari's
uint8 frames stay uint8) and become float32 only in a sampled batch. `s'` is the true next
observation: at a time-limit truncation the episode's last observation (Gymnasium's
`final_obs`), not the next episode's first, so a truncated step still bootstraps (as
CleanRL's `real_next_obs`). Sampling draws from a `torch.Generator`, so a checkpoint holding
the buffer (`state_dict`) and that generator resumes bit-identically. `sample(..., reuse=True)`
writes the batch into arrays kept from one call to the next (the same values, no allocation per
gradient step), for a caller that holds no sampled tensor past its next call.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from reflectrl.errors import UserError


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class ReplayBuffer:
    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype, action_shape: tuple[int, ...] = (),
                 action_dtype=np.int64):
        self.capacity = int(capacity)
        obs_dtype = np.dtype(obs_dtype)
        needed = 2 * self.capacity * int(np.prod(obs_shape)) * obs_dtype.itemsize
        memory = physical_memory()
        if memory is not None and needed > 0.8 * memory:
            raise UserError(f"a replay buffer of buffer_size={self.capacity:,} transitions of {tuple(obs_shape)} "
                            f"{obs_dtype} observations needs {needed / 2**30:.1f} GiB, more than this machine's "
                            f"{memory / 2**30:.1f} GiB allow; lower buffer_size")
        self.obs = np.zeros((self.capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros((self.capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((self.capacity, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros(self.capacity, dtype=np.float32)
        self.terminations = np.zeros(self.capacity, dtype=np.float32)
        self.pos = 0
        self.size = 0
        self._out: dict | None = None  # sample(reuse=True)'s arrays and tensors over them, for one batch size

    def __len__(self) -> int:
        return self.size

    def add(self, obs, next_obs, actions, rewards, terminations) -> None:
        """Add N transitions (one vector-env step), each argument with a leading N axis."""
        n = len(rewards)
        if n == 1:  # one env (DQN's and SAC's default): a slice, no index array per step
            i = self.pos
            self.obs[i], self.next_obs[i] = obs[0], next_obs[0]
            self.actions[i], self.rewards[i], self.terminations[i] = actions[0], rewards[0], terminations[0]
            self.pos = (i + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)
            return
        idx = (self.pos + np.arange(n)) % self.capacity
        self.obs[idx], self.next_obs[idx] = obs, next_obs
        self.actions[idx], self.rewards[idx], self.terminations[idx] = actions, rewards, terminations
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator, reuse: bool = False) -> dict[str, torch.Tensor]:
        """`batch_size` transitions drawn uniformly with replacement (as SB3's buffer). With `reuse`
        the tensors are the same objects at every call, overwritten by the next (the same draws
        and values as without)."""
        if reuse:
            return self._sample_into(batch_size, generator)
        idx = torch.randint(0, self.size, (batch_size,), generator=generator).numpy()
        return {
            "obs": torch.from_numpy(self.obs[idx].astype(np.float32, copy=False)),
            "next_obs": torch.from_numpy(self.next_obs[idx].astype(np.float32, copy=False)),
            "actions": torch.from_numpy(self.actions[idx]),
            "rewards": torch.from_numpy(self.rewards[idx]),
            "terminations": torch.from_numpy(self.terminations[idx]),
            "index": torch.from_numpy(idx),
        }

    def _sample_into(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        out = self._out
        if out is None or len(out["arrays"]["index"]) != batch_size:
            arrays = {"index": np.zeros(batch_size, dtype=np.int64),
                      "obs": np.zeros((batch_size, *self.obs.shape[1:]), dtype=np.float32),
                      "next_obs": np.zeros((batch_size, *self.obs.shape[1:]), dtype=np.float32),
                      **{k: np.zeros((batch_size, *getattr(self, k).shape[1:]), dtype=getattr(self, k).dtype)
                         for k in ("actions", "rewards", "terminations")}}
            out = self._out = {"arrays": arrays, "tensors": {k: torch.from_numpy(a) for k, a in arrays.items()}}
        arrays = out["arrays"]
        idx = arrays["index"]
        torch.randint(0, self.size, (batch_size,), generator=generator, out=out["tensors"]["index"])
        for key in ("obs", "next_obs", "actions", "rewards", "terminations"):
            source = getattr(self, key)
            if source.dtype == arrays[key].dtype:
                np.take(source, idx, axis=0, out=arrays[key])
            else:  # uint8 frames: gathered, then converted into the float32 array
                arrays[key][...] = source[idx]
        return out["tensors"]

    def state_dict(self) -> dict:
        """The filled part only (a buffer that has not wrapped is its first `size` rows)."""
        n = self.size
        return {"capacity": self.capacity, "pos": self.pos, "size": n,
                **{k: getattr(self, k)[:n].copy() for k in ("obs", "next_obs", "actions", "rewards", "terminations")}}

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity or state["obs"].shape[1:] != self.obs.shape[1:]:
            raise UserError(f"the checkpoint's replay buffer ({state['capacity']:,} x {state['obs'].shape[1:]}) does "
                            f"not match this run's ({self.capacity:,} x {self.obs.shape[1:]}); was config.json edited?")
        n = state["size"]
        for key in ("obs", "next_obs", "actions", "rewards", "terminations"):
            getattr(self, key)[:n] = state[key]
        self.pos, self.size = state["pos"], n
