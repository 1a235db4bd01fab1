"""The EnvPool backend: Atari and MiniGrid through EnvPool's C++ vector envs (issue 15, item 2).

`--set backend=envpool` (the `envpool` extra: pip install 'reflectrl[envpool]') makes the PPO
trainer's training envs an `EnvPoolVectorEnv` instead of Gymnasium's `SyncVectorEnv`. It gives
the collect loop exactly what the Gymnasium path gives:

- observations as `make_vector_env` shapes them: MiniGrid's 7x7x3 symbolic view (flattened to
  147 integers unless `encoder=cnn`), Atari's (4, 84, 84) uint8 frame stack;
- Gymnasium's *same-step* autoreset: where an episode ends, the step returns the next
  episode's first observation and the last one in `info["final_obs"]` / `info["_final_obs"]`.
  EnvPool resets an env on the step *after* its episode ends, ignoring that step's action, so
  the adapter steps just the ended envs once more at once (`step(..., env_id=ended)`), which is
  EnvPool's own reset (for Atari with episodic life: the game goes on after a lost life);
- the true episode return and length in `info["final_info"]["episode"]` (as Gymnasium's
  `RecordEpisodeStatistics`), counted by the adapter: for Atari the *unclipped* score
  (EnvPool's `info["reward"]`) of the whole game (a lost life ends a learning episode but not
  the logged one; the game is over at `info["terminated"]` or the time limit), its length in
  emulator frames (agent steps x 4, the no-op and FIRE frames of resets not counted);
- `info["state_key"]` for the exploration metrics (envs/statekey.py): MiniGrid's agent
  position (EnvPool's `info["agent_pos"]`), heading (the observation's `direction`) and carried
  object (the view's own cell shows it, as in MiniGrid's `gen_obs_grid`): the same key as
  `statekey.minigrid_key`; Montezuma's room and position from the RAM in EnvPool's info; a
  SimHash of the observation elsewhere, as on the Gymnasium path.

Atari preprocessing (EnvPool's, set to CleanRL's ppo_atari semantics): no-op reset (1 to 30),
max-and-skip 4, 84x84 grayscale (INTER_AREA), 4-frame stack, episodic life and reward clipping
(for learning; the logged return is the true score), FIRE on reset for games that have it, and
sticky actions as the Gymnasium id defines them (0.25 for `ALE/<Game>-v5`, 0 for
`<Game>NoFrameskip-v4`). Two small differences from the Gymnasium path's wrappers: after a
lost life EnvPool's reset takes 1-30 no-ops then FIRE (CleanRL's wrappers: one no-op, FIRE,
then action 2), and its FIRE reset presses FIRE only.

EnvPool cannot snapshot its envs: a checkpoint records only how to rebuild them, and a resumed
run restarts their episodes (with a warning from the trainer) and is not bit-identical to an
uninterrupted one. `eval` plays through the Gymnasium path; the id must exist there too.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import parse_env_id

from reflectrl.config import BACKENDS
from reflectrl.envs import atari
from reflectrl.envs.statekey import (
    is_montezuma,
    montezuma_keys,
    pack_minigrid_key,
    simhash,
    simhash_observations,
)
from reflectrl.errors import UserError

INSTALL = "pip install 'reflectrl[envpool]'"
_DEFAULT_FRAMES_PER_GAME = 108_000  # ALE's max_num_frames_per_episode for v5 and NoFrameskip-v4


def envpool_installed() -> bool:
    return importlib.util.find_spec("envpool") is not None


def import_envpool():
    """envpool, imported without its XLA mixin where jax is installed: every envpool env class
    tries `from .lax import XlaMixin` (which imports jax: `import envpool` takes 1.8 s with it,
    0.7 s without, here) to offer `.xla()`, which reflectrl never calls, and leaves the mixin out
    when that import fails. Once jax is imported anyway (or envpool is), the plain import."""
    if "envpool" in sys.modules or "jax" in sys.modules:
        import envpool

        return envpool
    sys.modules["envpool.python.lax"] = None  # the mixin's import raises ImportError: envpool skips it
    try:
        import envpool
    finally:
        del sys.modules["envpool.python.lax"]
    return envpool


@functools.cache
def _envpool_ids() -> frozenset[str]:
    envpool = import_envpool()

    return frozenset(envpool.list_all_envs())


def _atari_task(env_id: str) -> str | None:
    """EnvPool's id of an Atari id (ALE/Pong-v5, PongNoFrameskip-v4 -> Pong-v5), or None."""
    if env_id not in gym.registry and not env_id.startswith("MiniGrid-"):
        atari.register_atari()  # plain <Game>-v4 ids exist once ale-py has registered them
    if not (atari.looks_like_atari(env_id) or atari.is_atari_id(env_id)):
        return None
    _, name, _ = parse_env_id(env_id)
    for suffix in ("NoFrameskip", "Deterministic"):
        name = name.removesuffix(suffix)
    return f"{name}-v5"


def _atari_kwargs(env_id: str) -> dict[str, Any]:
    """EnvPool's settings for CleanRL's ppo_atari preprocessing, sticky actions as the id has them."""
    spec = gym.registry.get(env_id)
    given = dict(spec.kwargs) if spec is not None else {}
    version = parse_env_id(env_id)[2]
    sticky = given.get("repeat_action_probability", 0.25 if version == 5 else 0.0)
    frames = given.get("max_num_frames_per_episode") or _DEFAULT_FRAMES_PER_GAME
    return dict(noop_max=atari.NOOP_MAX, frame_skip=atari.FRAME_SKIP, img_height=atari.SCREEN_SIZE,
                img_width=atari.SCREEN_SIZE, stack_num=atari.FRAME_STACK, gray_scale=True,
                episodic_life=True, reward_clip=True, use_fire_reset=True,
                repeat_action_probability=float(sticky), full_action_space=bool(given.get("full_action_space", False)),
                max_episode_steps=int(frames) // atari.FRAME_SKIP)


def pool_task(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[str, dict[str, Any], str]:
    """(EnvPool's id, its keywords, "atari" or "minigrid") for a reflectrl env id; UserError if
    EnvPool is not installed or does not ship the env."""
    if not envpool_installed():
        raise UserError(f"backend=envpool needs EnvPool, which is not installed: {INSTALL}")
    env_kwargs = dict(env_kwargs or {})
    task = _atari_task(env_id)
    if task is not None:
        kind = "atari"
        if "frameskip" in env_kwargs or "frame_skip" in env_kwargs:
            raise UserError(f"env.frameskip: '{env_id}' skips {atari.FRAME_SKIP} frames in its preprocessing "
                            "(max-and-skip), so the emulator's own frameskip is always 1; drop env.frameskip")
        kwargs = {**_atari_kwargs(env_id), **env_kwargs}
        frames = [kwargs.pop(k) for k in ("max_num_frames_per_episode", "max_episode_steps") if k in env_kwargs]
        if frames:  # the Gymnasium path's limits count emulator frames, EnvPool's count agent steps
            kwargs["max_episode_steps"] = max(1, int(min(frames)) // atari.FRAME_SKIP)
    else:
        kind, task, kwargs = "minigrid", env_id, env_kwargs
    if task not in _envpool_ids() or (kind == "minigrid" and not env_id.startswith("MiniGrid-")):
        raise UserError(f"env '{env_id}' is not one of the Atari and MiniGrid envs that EnvPool ships (all that "
                        "backend=envpool runs); the default backend runs it: drop backend=envpool "
                        "(given by --set or a --preset)")
    return task, kwargs, kind


def _make_spec(env_id: str, task: str, kwargs: dict[str, Any], given: dict[str, Any]):
    envpool = import_envpool()

    try:
        return envpool.make_spec(task, **kwargs)
    except (TypeError, ValueError, RuntimeError) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"cannot make env '{env_id}' on backend=envpool with {given}: {text}") from None


def check_backend(cfg) -> None:
    """Bad input for the backend of a RunConfig, as one-line UserErrors, before any run directory."""
    if cfg.backend not in BACKENDS:
        raise UserError(f"backend='{cfg.backend}': use one of {', '.join(BACKENDS)}")
    if cfg.backend != "envpool":
        return
    task, kwargs, _ = pool_task(cfg.env_id, cfg.env)
    if cfg.wrapper is not None:
        raise UserError(f"--wrapper {cfg.wrapper} is not supported with backend=envpool (EnvPool's envs take no "
                        "Gymnasium wrappers); use the default backend for it")
    from reflectrl.config import env_settings

    if env_settings(cfg).norm_obs or env_settings(cfg).norm_reward:
        raise UserError("norm_obs/norm_reward are not supported with backend=envpool; drop them or use the "
                        "default backend")
    _make_spec(cfg.env_id, task, kwargs, cfg.env)  # the env's keywords, checked


# ----------------------------------------------------------------------------- state keys

_MINIGRID_EMPTY = 1  # MiniGrid's OBJECT_TO_IDX["empty"]: the agent's own cell when it carries nothing


def minigrid_keys(agent_pos: np.ndarray, direction: np.ndarray, image: np.ndarray) -> np.ndarray:
    """`statekey.minigrid_key` of (N,) MiniGrid states from what EnvPool gives: position (N, 2),
    heading (N,) and the (N, 7, 7, 3) view, whose agent cell (3, 6) shows the carried object."""
    x, y = agent_pos[:, 0].astype(np.int64), agent_pos[:, 1].astype(np.int64)
    view = image.shape[1]
    carried = image[:, view // 2, view - 1].astype(np.int64)
    none = carried[:, 0] == _MINIGRID_EMPTY
    kind = np.where(none, 0, carried[:, 0] + 1)
    color = np.where(none, 0, carried[:, 1] + 1)
    return pack_minigrid_key(x, y, direction.astype(np.int64), kind, color)


# ----------------------------------------------------------------------------- the vector env

class _EnvView:
    """One env of the pool, for the trainer's resume path (`envs.envs[i].reset(seed=...)`)."""

    def __init__(self, vec: EnvPoolVectorEnv, index: int):
        self.vec, self.index = vec, index
        self._reflectrl_stale = vec.restored  # snapshot.loads reports it: its episode restarts

    @property
    def unwrapped(self):
        return self

    def reset(self, seed: int | None = None, **_):
        return self.vec.reset_one(self.index, seed)


class EnvPoolVectorEnv:
    """EnvPool's vector env with the interface of a same-step-autoresetting Gymnasium vector env."""

    def __init__(self, env_id: str, num_envs: int, *, env_kwargs: dict[str, Any] | None = None,
                 keep_image: bool = False, seed: int = 0, restored: bool = False, num_threads: int = 0):
        self.env_id, self.num_envs, self.keep_image = env_id, int(num_envs), keep_image
        self.num_threads = int(num_threads)  # EnvPool's worker threads (0: its default, min(envs, cores))
        self.env_kwargs = dict(env_kwargs or {})
        self.task, self.kwargs, self.kind = pool_task(env_id, self.env_kwargs)
        spec = _make_spec(env_id, self.task, self.kwargs, self.env_kwargs)
        space = spec.gymnasium_observation_space
        if self.kind == "minigrid":
            space = space["image"]
        self.single_observation_space = space if keep_image else gym.spaces.flatten_space(space)
        self.single_action_space = spec.gymnasium_action_space
        self.montezuma = self.kind == "atari" and is_montezuma(env_id)
        self.seed = seed
        self.restored = restored
        self.envs = [_EnvView(self, i) for i in range(self.num_envs)]
        self._pool = None
        self._fresh: dict[int, tuple[np.ndarray, int]] = {}  # first observations of a lazy start (resume)
        self._returns = np.zeros(self.num_envs)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._starts = np.zeros(self.num_envs)

    def __reduce__(self):
        # EnvPool's envs cannot be saved: a restored copy rebuilds them and restarts their episodes
        return _restore, (self.env_id, self.num_envs, self.env_kwargs, self.keep_image, self.seed, self.num_threads)

    # ------------------------------------------------------------------ helpers

    def _observation(self, obs) -> np.ndarray:
        image = obs["image"] if self.kind == "minigrid" else obs
        return image if self.keep_image else image.reshape(len(image), -1)

    def _keys(self, obs, info: dict) -> np.ndarray:
        if self.kind == "minigrid":
            return minigrid_keys(info["agent_pos"], obs["direction"], obs["image"])
        if "ram" in info:  # Atari: as the Gymnasium path's StateKey, from the RAM
            ram = np.asarray(info["ram"])
            return montezuma_keys(ram) if self.montezuma else simhash(ram.astype(np.float32) - 128.0)
        return simhash_observations(obs)

    def _start(self, seed: int) -> None:
        envpool = import_envpool()

        if self._pool is not None:
            self._pool.close()
        self.seed = int(seed)
        self._pool = envpool.make_gymnasium(self.task, num_envs=self.num_envs, seed=self.seed,
                                            num_threads=self.num_threads, **self.kwargs)
        self._fresh.clear()

    def _clear_stats(self, ids) -> None:
        self._returns[ids] = 0.0
        self._lengths[ids] = 0
        self._starts[ids] = time.perf_counter()

    # ------------------------------------------------------------------ the vector-env interface

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every env; a seed (env i gets seed + i) rebuilds the pool, as EnvPool seeds only on creation."""
        if self._pool is None or (seed is not None and int(seed) != self.seed):
            self._start(self.seed if seed is None else seed)
        obs, info = self._pool.reset()
        self._clear_stats(slice(None))
        keys = self._keys(obs, info)
        return self._observation(obs), {"state_key": keys, "_state_key": np.ones(self.num_envs, dtype=bool)}

    def reset_one(self, index: int, seed: int | None = None):
        """One env's fresh episode: (observation, info). A restored pool starts here, seeded by the
        first call (every env restarts on resume), and hands each env its first observation."""
        if self._pool is None:
            obs, info = self.reset(seed=self.seed if seed is None else seed)
            self._fresh = {i: (obs[i], int(info["state_key"][i])) for i in range(self.num_envs)}
        if index not in self._fresh:
            obs, info = self._pool.reset(env_id=np.array([index], dtype=np.int32))
            self._clear_stats([index])
            self._fresh[index] = (self._observation(obs)[0], int(self._keys(obs, info)[0]))
        obs, key = self._fresh.pop(index)
        return obs, {"state_key": key}

    def step(self, actions):
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions))
        ended = terminated | truncated
        if self.kind == "atari":  # a lost life ends a learning episode; the game ends at game over or the limit
            self._returns += info["reward"]
            game_over = ended & (info["terminated"].astype(bool) | truncated)
            frames = atari.FRAME_SKIP
        else:
            self._returns += reward
            game_over, frames = ended, 1
        self._lengths += 1
        keys = self._keys(obs, info)
        out = {"state_key": keys, "_state_key": np.ones(self.num_envs, dtype=bool)}
        if not ended.any():
            return self._observation(obs), reward, terminated, truncated, out

        ids = np.flatnonzero(ended).astype(np.int32)
        observation = self._observation(obs).copy()
        final_obs = np.empty(self.num_envs, dtype=object)
        for i in ids:
            final_obs[i] = observation[i].copy()
        final_info = {"state_key": np.where(ended, keys, 0), "_state_key": ended.copy()}
        if game_over.any():
            now = time.perf_counter()
            final_info["episode"] = {
                "r": np.where(game_over, self._returns, 0.0),
                "l": np.where(game_over, self._lengths * frames, 0),
                "t": np.where(game_over, np.round(now - self._starts, 6), 0.0),
                "_r": game_over.copy(), "_l": game_over.copy(), "_t": game_over.copy(),
            }
            final_info["_episode"] = game_over.copy()
            self._clear_stats(game_over)
        # EnvPool resets an ended env on its next step, whatever the action: take that step now
        reset_obs, _, _, _, reset_info = self._pool.step(np.zeros(len(ids), dtype=np.int32), env_id=ids)
        observation[ids] = self._observation(reset_obs)
        keys = keys.copy()
        keys[ids] = self._keys(reset_obs, reset_info)
        out["state_key"] = keys
        out.update(final_obs=final_obs, _final_obs=ended.copy(), final_info=final_info)
        return observation, reward, terminated, truncated, out

    def close(self, **_) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _restore(env_id, num_envs, env_kwargs, keep_image, seed, num_threads=0) -> EnvPoolVectorEnv:
    return EnvPoolVectorEnv(env_id, num_envs, env_kwargs=env_kwargs, keep_image=keep_image, seed=seed,
                            restored=True, num_threads=num_threads)


def make_vector_env(cfg) -> EnvPoolVectorEnv:
    """The training envs of a resolved RunConfig with backend=envpool (see envs.make_vector_env)."""
    from reflectrl.config import env_settings

    check_backend(cfg)
    p = env_settings(cfg)
    return EnvPoolVectorEnv(cfg.env_id, p.num_envs, env_kwargs=dict(cfg.env), keep_image=p.encoder == "cnn",
                            seed=cfg.seed, num_threads=cfg.envpool_threads)
