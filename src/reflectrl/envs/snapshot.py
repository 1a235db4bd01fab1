"""Exact snapshots of vector envs, so a resumed run continues the very same episodes.

Most envs pickle with their full state (classic control, MiniGrid, the grid world, and
every wrapper's counters and normaliser statistics). Three kinds do not:

* MuJoCo envs pickle through `EzPickle`, which rebuilds a *fresh* env from the constructor
  arguments. We snapshot their physics (`mj_getState` with the full integration state) and
  random generator instead, which restores them exactly.
* Atari (ale-py) envs also pickle through `EzPickle`. We snapshot the emulator with
  `cloneState(include_rng=True)` (its RNG drives sticky actions) and the env's generator
  (no-op resets draw from it), which restores them exactly.
* Other `EzPickle` envs (Box2D's LunarLander, ...) hold simulator objects we cannot save.
  They come back fresh and are reset on resume with a seed derived from the run's; the run
  then goes on correctly but is no longer bit-identical to an uninterrupted one, and we say so.
"""

from __future__ import annotations

import copy
import io
import pickle

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.utils import EzPickle


def _is_mujoco_env(obj) -> bool:
    return any(c.__name__ == "MujocoEnv" for c in type(obj).__mro__)


def _restore_mujoco(cls, args, kwargs, state, np_random_state, attrs):
    import mujoco

    env = cls(*args, **kwargs)
    mujoco.mj_setState(env.model, env.data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(env.model, env.data)
    env.np_random.bit_generator.state = np_random_state
    env.__dict__.update(attrs)
    return env


def _restore_atari(cls, args, kwargs, ale_state, np_random_state):
    env = cls(*args, **kwargs)
    env.ale.restoreState(ale_state)
    env.np_random.bit_generator.state = np_random_state
    return env


def _restore_stale(cls, args, kwargs):
    env = cls(*args, **kwargs)
    env._reflectrl_stale = True
    return env


# Attributes of a MuJoCo env that change while it runs and are plain data.
_MUJOCO_SKIP = {"model", "data", "_np_random", "mujoco_renderer", "spec", "observation_space", "action_space"}


class _EnvPickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, EzPickle) and isinstance(obj, gym.Env):
            args, kwargs = obj._ezpickle_args, obj._ezpickle_kwargs
            if _is_mujoco_env(obj):
                import mujoco

                size = mujoco.mj_stateSize(obj.model, mujoco.mjtState.mjSTATE_INTEGRATION)
                state = np.empty(size, dtype=np.float64)
                mujoco.mj_getState(obj.model, obj.data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
                attrs = {k: copy.deepcopy(v) for k, v in obj.__dict__.items()
                         if k not in _MUJOCO_SKIP and isinstance(v, (int, float, bool, str, np.ndarray, type(None)))}
                return _restore_mujoco, (type(obj), args, kwargs, state, obj.np_random.bit_generator.state, attrs)
            if type(obj).__module__.startswith("ale_py."):
                return _restore_atari, (type(obj), args, kwargs, obj.ale.cloneState(include_rng=True),
                                        obj.np_random.bit_generator.state)
            return _restore_stale, (type(obj), args, kwargs)
        return super().reducer_override(obj)


def dumps(envs: gym.vector.SyncVectorEnv) -> bytes:
    buf = io.BytesIO()
    _EnvPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(envs)
    return buf.getvalue()


def loads(data: bytes) -> tuple[gym.vector.SyncVectorEnv, list[int]]:
    """The restored vector env and the indices of sub-envs that came back fresh (need a reset)."""
    envs = pickle.loads(data)
    stale = [i for i, e in enumerate(envs.envs) if getattr(e.unwrapped, "_reflectrl_stale", False)]
    return envs, stale
