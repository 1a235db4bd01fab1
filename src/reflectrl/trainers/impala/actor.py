"""An IMPALA actor: its own vector envs and a local copy of the policy; each `unroll` steps
every env `unroll_length` times with the weights it is given and returns the trajectories
with the behaviour policy's log-probabilities (Espeholt et al. 2018, section 3).

The same class runs in the learner's process (actors=inline) or as a Ray actor process
(`ray.remote(Actor)`, pool.py). It draws every action from its own `torch.Generator`, seeded
from the run's seed and the actor's slot, and resets its envs from that seed, so a slot's
trajectories depend only on the weights it was given: what makes the synchronous mode
deterministic. A replacement actor (after one died) takes a new slot, so new seeds: it does
not replay the dead one's episodes.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from reflectrl.envs import is_continuous, make_vector_env, snapshot
from reflectrl.nets import flatten_parameters
from reflectrl.trainers.exploration_metrics import RolloutKeys


def slot_seed(seed: int, slot: int) -> int:
    """The env and action seed of an actor slot (slot 0 of a one-actor run included): a hash, so
    nearby run seeds do not share slots' streams."""
    digest = hashlib.sha256(f"impala-actor:{seed}:{slot}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & (2**31 - 1)


@dataclass
class Unroll:
    """One actor's unroll: E trajectories of T steps, each array (T, E, ...)."""

    slot: int
    version: int                 # the policy version (learner updates) the actions came from
    obs: np.ndarray              # float32, or the env's integer dtype (Atari frames stay uint8)
    actions: np.ndarray
    logprobs: np.ndarray         # float32: the behaviour policy's log mu(a_t | x_t)
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    last_obs: np.ndarray         # (E, ...): the observation after the unroll
    ended: list = field(default_factory=list)     # (t, e, final observation) of every episode end
    episodes: list = field(default_factory=list)  # (return, length) of the episodes that ended
    state_keys: np.ndarray | None = None
    next_state_keys: np.ndarray | None = None
    seconds: float = 0.0         # wall time of the unroll, on the actor
    nonfinite: str | None = None  # "observation" or "reward" where the env gave a non-finite one

    @property
    def steps(self) -> int:
        return int(self.rewards.size)


class Actor:
    def __init__(self, config: dict, slot: int):
        from reflectrl.config import RunConfig  # a Ray worker imports this module first
        from reflectrl.trainers.cnn import make_policy

        torch.set_num_threads(1)  # actors are many; each one's policy is small
        cfg = RunConfig.from_dict(config)
        self.slot, self.seed = slot, slot_seed(cfg.seed, slot)
        self.unroll_length = cfg.impala.unroll_length
        self.envs = make_vector_env(cfg)
        space = self.envs.single_observation_space
        act_space = self.envs.single_action_space
        self.continuous = is_continuous(act_space)
        self.obs_shape = tuple(space.shape)
        self.obs_dtype = space.dtype if np.issubdtype(space.dtype, np.integer) else np.float32
        action_dim = act_space.shape[0] if self.continuous else int(act_space.n)
        if self.continuous:
            self.low, self.high = act_space.low, act_space.high
        with torch.random.fork_rng(devices=[]):  # its init is overwritten by the first weights anyway
            self.policy = make_policy(self.obs_shape, action_dim, self.continuous, cfg.impala.encoder,
                                      cfg.impala.hidden_sizes)
        self.flat = flatten_parameters(self.policy)
        self.version = -1
        self.generator = torch.Generator().manual_seed(self.seed)
        obs, info = self.envs.reset(seed=self.seed)
        self.next_obs = np.asarray(obs)
        self.keys = RolloutKeys(obs, info)

    def pid(self) -> int:
        return os.getpid()

    def set_weights(self, weights: np.ndarray, version: int) -> None:
        if version != self.version:
            with torch.no_grad():
                self.flat.copy_(torch.from_numpy(np.asarray(weights)))
            self.version = version

    @torch.no_grad()
    def unroll(self, weights: np.ndarray, version: int) -> Unroll:
        """Step every env unroll_length times with the policy `weights` (learner version `version`)."""
        start = time.perf_counter()
        self.set_weights(weights, version)
        T, E = self.unroll_length, self.envs.num_envs
        obs = np.zeros((T, E, *self.obs_shape), dtype=self.obs_dtype)
        rewards = np.zeros((T, E), dtype=np.float32)
        terminations = np.zeros((T, E), dtype=bool)
        truncations = np.zeros((T, E), dtype=bool)
        actions, logprobs = [], np.zeros((T, E), dtype=np.float32)
        ended, episodes, nonfinite = [], [], None
        next_obs = self.next_obs
        # the MLP policy samples in numpy (policies.NumpySampler), a CNN's through act()
        sampler = self.policy.numpy_sampler() if self.policy.numpy_acting else None
        self.keys.start(T, self.envs)
        for t in range(T):
            obs[t] = next_obs
            if sampler is not None:
                action, logprobs[t] = sampler(obs[t].astype(np.float32, copy=False), self.generator)
                actions.append(action)
            else:
                action, logprob = self.policy.act(torch.as_tensor(obs[t], dtype=torch.float32), self.generator)
                actions.append(action.numpy())
                logprobs[t] = logprob.numpy()
            env_action = np.clip(actions[-1], self.low, self.high) if self.continuous else actions[-1]
            next_obs, reward, term, trunc, info = self.envs.step(env_action)
            if nonfinite is None and not (np.isfinite(next_obs).all() and np.isfinite(reward).all()):
                nonfinite = "observation" if not np.isfinite(next_obs).all() else "reward"
            rewards[t], terminations[t], truncations[t] = reward, term, trunc
            self.keys.record(t, next_obs, info)
            if "final_obs" in info:
                for i in np.flatnonzero(info["_final_obs"]):
                    ended.append((t, int(i), np.asarray(info["final_obs"][i])))
                final = info["final_info"]
                if "episode" in final:
                    for i in np.flatnonzero(final["_episode"]):
                        episodes.append((float(final["episode"]["r"][i]), int(final["episode"]["l"][i])))
        self.keys.finish()
        self.next_obs = np.asarray(next_obs)
        return Unroll(self.slot, version, obs, np.stack(actions), logprobs, rewards, terminations, truncations,
                      self.next_obs.copy(), ended, episodes, self.keys.state_keys.copy(),
                      self.keys.next_state_keys.copy(), time.perf_counter() - start, nonfinite)

    # ------------------------------------------------------------------ checkpoints (synchronous mode)

    def get_state(self) -> dict:
        """What resuming this slot exactly needs: its envs, generator and current observations."""
        return {"slot": self.slot, "envs": snapshot.dumps(self.envs), "generator": self.generator.get_state(),
                "next_obs": self.next_obs.copy(), "keys": self.keys.current.copy()}

    def set_state(self, state: dict) -> list[int]:
        """Restore get_state's snapshot; returns the envs whose episodes had to restart."""
        self.envs.close()
        self.envs, stale = snapshot.loads(state["envs"])
        self.generator.set_state(state["generator"])
        self.next_obs = np.asarray(state["next_obs"]).copy()
        self.keys.current = np.asarray(state["keys"]).copy()
        for i in stale:
            obs, info = self.envs.envs[i].reset(seed=self.seed + i)
            self.next_obs[i] = obs
            self.keys.current[i] = RolloutKeys(np.asarray(obs)[None], {k: [v] for k, v in info.items()}).current[0]
        return list(stale)

    def close(self) -> None:
        self.envs.close()
