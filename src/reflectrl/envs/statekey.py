"""Exploration state keys: one hashable integer per env step, for counting the states visited
(issue 15 items 5-6; seed 002 section 5.1).

The key of a state is what an exploration metric or a count bonus treats as "the same place":

- the built-in grid world: the agent's cell (row * size + col; the grid world has no heading);
- MiniGrid: the agent's position, heading and carried object (type and colour);
- Montezuma's Revenge (any `MontezumaRevenge` id): the room (RAM byte 3) and the agent's
  x, y (RAM bytes 42, 43), so `room_of_key` reads the room back (`rooms_visited`);
- any other env: a SimHash of the observation (Tang et al. 2017, #Exploration): the signs of
  a fixed random Gaussian projection to `SIMHASH_BITS` bits (of an Atari game's RAM rather
  than its pixels; of a large observation's regular subsample: `hash_input`). The projection is drawn from its
  own fixed-seed generator (never the trainer's random stream) and cached per observation
  size, not stored in the wrapper, so a checkpoint of the envs stays small.

`StateKey` is the wrapper that puts the key in `info["state_key"]` on reset and on every step;
`make_vector_env` adds it to every training env, inside the observation normaliser, so a
SimHash key reads the raw observation. A backend without per-env wrappers gives no such info:
the trainer then hashes the observations it sees (`simhash`) instead.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

SIMHASH_BITS = 32
_SIMHASH_SEED = 20170801  # fixed: the same observation has the same key in every run
_PROJECTIONS: dict[tuple[int, int], np.ndarray] = {}
_BIT_VALUES = {bits: (1 << np.arange(bits, dtype=np.int64)) for bits in (SIMHASH_BITS,)}


def _projection(dim: int, bits: int) -> np.ndarray:
    key = (dim, bits)
    if key not in _PROJECTIONS:
        _PROJECTIONS[key] = np.random.default_rng(_SIMHASH_SEED).standard_normal((dim, bits)).astype(np.float32)
    return _PROJECTIONS[key]


def simhash(obs: np.ndarray, bits: int = SIMHASH_BITS) -> np.ndarray:
    """(B, ...) observations -> (B,) int64 keys: bit j is 1 where (A x)_j > 0 (A: fixed Gaussian)."""
    if not 1 <= bits <= 62:
        raise ValueError(f"simhash bits={bits}: must be in [1, 62] to fit an int64")
    import torch  # here, not at the top: importing the envs (to check an --env) must not cost torch's 2-5 s

    x = np.ascontiguousarray(obs, dtype=np.float32).reshape(len(obs), -1)
    # the product through torch, which keeps to the run's torch_threads: numpy's BLAS would
    # start its own threads beside the envs' (EnvPool's) and be slower by orders of magnitude
    signs = (torch.from_numpy(x) @ torch.from_numpy(_projection(x.shape[1], bits))).numpy() > 0
    values = _BIT_VALUES.get(bits)
    if values is None:
        values = _BIT_VALUES[bits] = 1 << np.arange(bits, dtype=np.int64)
    return signs.astype(np.int64) @ values


# ----------------------------------------------------------------------------- env-provided keys

def gridworld_key(env: gym.Env) -> int:
    base = env.unwrapped
    row, col = base._agent
    return int(row) * base.size + int(col)


def pack_minigrid_key(x, y, direction, kind, color):
    """MiniGrid's key from position (x, y < 256), heading (4) and carried object (type and
    colour, each +1; 0 when none): ints, or int64 arrays for a batch (the EnvPool path)."""
    return x | (y << 8) | (direction << 16) | (kind << 18) | (color << 23)


# The JAX backend's keys (envs/jax_envs.py), ints below a small key space so that its tables stay small:
# navix's player cell (row < 64, column < 32), heading and whether it carries something; Craftax's
# player cell on its 64 x 64 map (and level).
def pack_navix_key(row, col, direction, carried):
    return (((row * 32 + col) * 4 + direction) * 2) + carried


def unpack_navix_key(keys):
    """(column, row) of navix keys (arrays)."""
    cell = keys // 8
    return cell % 32, cell // 32


def pack_craftax_key(level, x, y):
    return (level * 64 + x) * 64 + y


def unpack_craftax_key(keys):
    """(x, y) of Craftax keys (arrays)."""
    return (keys // 64) % 64, keys % 64


def minigrid_key(env: gym.Env) -> int:
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX

    base = env.unwrapped
    x, y = (int(v) for v in base.agent_pos)
    carrying = base.carrying
    kind, color = (0, 0) if carrying is None else (OBJECT_TO_IDX[carrying.type] + 1, COLOR_TO_IDX[carrying.color] + 1)
    return pack_minigrid_key(x, y, int(base.agent_dir), kind, color)


MONTEZUMA_ROOM, MONTEZUMA_X, MONTEZUMA_Y = 3, 42, 43  # RAM bytes


def montezuma_keys(ram: np.ndarray) -> np.ndarray:
    """Montezuma's keys (room << 16 | x << 8 | y) of (..., 128) RAM rows."""
    ram = np.asarray(ram).astype(np.int64)
    return (ram[..., MONTEZUMA_ROOM] << 16) | (ram[..., MONTEZUMA_X] << 8) | ram[..., MONTEZUMA_Y]


def montezuma_key(env: gym.Env) -> int:
    return int(montezuma_keys(env.unwrapped.ale.getRAM()))


def room_of_key(keys: np.ndarray) -> np.ndarray:
    """The Montezuma rooms of keys made by `montezuma_key`."""
    return (np.asarray(keys, dtype=np.int64) >> 16) & 0xFF


def is_montezuma(env_id: str) -> bool:
    return "MontezumaRevenge" in env_id


def key_function(env: gym.Env, env_id: str = "") -> Callable[[gym.Env], int] | None:
    """The env's own state key, or None where the observation is hashed instead."""
    from reflectrl.envs.gridworld import GridWorldEnv

    base = env.unwrapped
    if isinstance(base, GridWorldEnv):
        return gridworld_key
    if type(base).__module__.startswith("minigrid.") and hasattr(base, "agent_pos"):
        return minigrid_key
    if (is_montezuma(env_id) or "montezuma" in str(getattr(base, "_game", "")).lower()) and hasattr(base, "ale"):
        return montezuma_key
    return None


HASH_MAX_INPUTS = 1024  # a larger observation is hashed on a strided subsample (an image's coarse grid)


def _subsample(obs: np.ndarray) -> np.ndarray:
    """(B, ...) observations as (B, D) rows of at most `HASH_MAX_INPUTS` values: an image's
    every k-th pixel in both spatial directions ((H, W, C) or (C, H, W)), then every j-th value."""
    one = obs.shape[1:]
    size = int(np.prod(one))
    if size > HASH_MAX_INPUTS and len(one) >= 2:
        spatial = (0, 1) if one[-1] <= 4 else (len(one) - 2, len(one) - 1)
        k = int(np.ceil(np.sqrt(size / HASH_MAX_INPUTS)))
        index = [slice(None)] * len(one)
        for axis in spatial:
            index[axis] = slice(None, None, k)
        obs = obs[(slice(None), *index)]
    rows = obs.reshape(len(obs), -1)
    return rows[:, :: max(1, -(-rows.shape[1] // HASH_MAX_INPUTS))]


def hash_input(obs: np.ndarray, env: gym.Env | None = None) -> np.ndarray:
    """What a SimHash key reads, as a (1, D) row: an Atari env's RAM (its 128 bytes are the
    game's state, and hashing them costs microseconds where 28,224 pixels cost milliseconds),
    else the observation, subsampled to at most `HASH_MAX_INPUTS` values (`_subsample`)."""
    ale = getattr(env.unwrapped, "ale", None) if env is not None else None
    return _hash_row(obs, ale)[None].astype(np.float32)


def _hash_row(obs, ale) -> np.ndarray:
    """`hash_input`'s row, kept cheaply per step (StateKey's deferred keys): a copy of a small
    observation as it is (`simhash_observations` casts it once per rollout), a large one's
    subsample, an Atari env's RAM."""
    if ale is not None:
        return ale.getRAM().astype(np.float32) - 128.0
    obs = np.asarray(obs)
    if obs.size > HASH_MAX_INPUTS:
        return _subsample(obs[None])[0].astype(np.float32)
    return obs.reshape(-1).copy()


def simhash_observations(obs: np.ndarray) -> np.ndarray:
    """(B, ...) observations -> (B,) keys, as a StateKey wrapper without the env would give."""
    return simhash(_subsample(np.asarray(obs)).astype(np.float32))


class StateKey(gym.Wrapper):
    """Adds `info["state_key"]` (an int) on reset and on every step; touches no random stream.

    `deferred=True` (the training envs): where the key is a SimHash of the observation, a step
    only keeps the observation's hash input (`take()` hands them over), and the trainer hashes a
    whole rollout's at once (exploration.RolloutKeys): one matrix product per rollout instead of
    one per env per step, and no per-step info entry for the vector env to merge. A reset still
    puts its key in the info (once per episode), and an env with its own key (the grid world,
    MiniGrid, Montezuma) is keyed per step as before, its key being cheap to read."""

    def __init__(self, env: gym.Env, env_id: str = "", deferred: bool = False):
        super().__init__(env)
        self.key_fn = key_function(env, env_id or (env.spec.id if env.spec else ""))
        self.deferred = deferred and self.key_fn is None
        self.pending: list[np.ndarray] = []  # hash inputs of the steps since the last take()
        self._ale = getattr(env.unwrapped, "ale", None)  # an Atari env's RAM is what is hashed

    def _key(self, obs) -> int:
        if self.key_fn is not None:
            return self.key_fn(self.env)
        return int(simhash(hash_input(np.asarray(obs), self.env))[0])

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        info["state_key"] = self._key(obs)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.deferred:
            self.pending.append(_hash_row(obs, self._ale))
        else:
            info["state_key"] = self._key(obs)
        return obs, reward, terminated, truncated, info

    def take(self) -> list[np.ndarray]:
        rows, self.pending = self.pending, []
        return rows

    def __getstate__(self):  # a snapshot of the envs (checkpoints): no rollout's rows, no ALE handle
        state = self.__dict__.copy()
        state["pending"], state["_ale"] = [], None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._ale = getattr(self.env.unwrapped, "ale", None)


def deferred_wrappers(envs) -> list[StateKey] | None:
    """The deferred StateKey wrapper of each env of a Gymnasium vector env (None where any env
    has none: EnvPool, an env with its own key)."""
    out = []
    for env in getattr(envs, "envs", None) or []:
        while not isinstance(env, StateKey):
            if not isinstance(env, gym.Wrapper):
                return None
            env = env.env
        if not env.deferred:
            return None
        out.append(env)
    return out or None
