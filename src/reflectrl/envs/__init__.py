"""Environments: `make_env(id)` for any Gymnasium id, MiniGrid ids and the built-in grid world.

The wrapper order matters and is fixed here, innermost first:

1. the env (MiniGrid's dict observation is reduced to its image and flattened, see below);
2. `RecordEpisodeStatistics`: the episode return it reports is the *true* env return, so it
   sits below every reward wrapper; trainers and `eval` log only this number;
3. the optional reward wrapper (`sparse` or `delayed:K`);
4. for continuous control, CleanRL's observation/reward normalisation and clipping
   (added by `make_vector_env`, not by `make_env`).

MiniGrid: observations are the 7x7x3 symbolic egocentric view, flattened to 147 integers
for the MLP policy. We chose flattening over a CNN because the view is symbolic (object,
colour and state indices, not pixels), tiny, and fixed in size, so an MLP learns it well
on a CPU and every signal sees the same kind of feature vector on every env.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import gymnasium as gym
import numpy as np

from reflectrl.errors import UserError
from reflectrl.envs.gridworld import GridWorldEnv, register_gridworld
from reflectrl.envs.normalize import NormalizeObservation, NormalizeReward
from reflectrl.envs.wrappers import DelayedReward, SparseReward, parse_reward_wrapper

__all__ = [
    "make_env", "make_vector_env", "GridWorldEnv", "SparseReward", "DelayedReward",
    "parse_reward_wrapper", "is_continuous", "DEFAULT_ENV",
]

DEFAULT_ENV = "reflectrl/GridWorld-v0"


def _ensure_registered(env_id: str) -> None:
    register_gridworld()
    if env_id not in gym.registry:
        try:  # MiniGrid registers its ids on import.
            import minigrid  # noqa: F401
        except ImportError:
            pass


def _check_env_id(env_id: str) -> None:
    _ensure_registered(env_id)
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.pprint_registry() for the ids"
    if env_id.startswith(("MiniGrid", "BabyAI")):
        hint += " (MiniGrid ids need: pip install 'reflectrl[envs]')"
    raise UserError(f"unknown env id '{env_id}'{hint}")


class ClipObservation(gym.ObservationWrapper):
    """Clip observations to [-bound, bound] (a picklable stand-in for a lambda transform)."""

    def __init__(self, env: gym.Env, bound: float):
        super().__init__(env)
        self.bound = bound

    def observation(self, observation):
        return np.clip(observation, -self.bound, self.bound)


def is_continuous(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Box):
        return True
    if isinstance(space, gym.spaces.Discrete):
        return False
    raise UserError(f"action space {space} is not supported: reflectrl's PPO handles Discrete and Box actions")


def make_env(
    env_id: str,
    *,
    wrapper: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """Make one env with flat observations, true-return statistics and the reward wrapper."""
    _check_env_id(env_id)
    try:
        add_reward_wrapper = parse_reward_wrapper(wrapper)
    except ValueError as err:
        raise UserError(str(err)) from None
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise UserError(f"env '{env_id}' needs an extra package: {str(err).splitlines()[0]} (pip install 'reflectrl[envs]')") from None
    except (TypeError, ValueError) as err:
        raise UserError(f"cannot make env '{env_id}' with {kwargs}: {str(err).splitlines()[0]}") from None

    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and "image" in space.spaces:
        from minigrid.wrappers import ImgObsWrapper

        env = ImgObsWrapper(env)
        space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        try:
            env = gym.wrappers.FlattenObservation(env)
        except Exception:
            raise UserError(f"observation space {space} of '{env_id}' cannot be flattened for an MLP policy") from None
    is_continuous(env.action_space)
    if isinstance(env.action_space, gym.spaces.Box) and len(env.action_space.shape) != 1:
        raise UserError(f"action space {env.action_space} of '{env_id}': only flat (1-D) Box actions are supported")

    env = gym.wrappers.RecordEpisodeStatistics(env)
    if add_reward_wrapper is not None:
        env = add_reward_wrapper(env)
    return env


def _make_training_env(env_id, wrapper, env_kwargs, norm_obs, norm_reward, clip_obs, clip_reward, gamma):
    env = make_env(env_id, wrapper=wrapper, env_kwargs=env_kwargs)
    if norm_obs:
        env = NormalizeObservation(env)
        env = ClipObservation(env, clip_obs)
    if norm_reward:
        env = NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.ClipReward(env, -clip_reward, clip_reward)
    return env


def make_vector_env(cfg, seed_offset: int = 0) -> gym.vector.SyncVectorEnv:
    """The training envs of a resolved RunConfig, autoresetting in the same step.

    Same-step autoreset returns the next episode's first observation at once and the
    finished episode's last one in `info["final_obs"]`, which is what bootstrapping from the
    value at truncation needs.
    """
    p = cfg.ppo
    fn = functools.partial(
        _make_training_env, cfg.env_id, cfg.wrapper, dict(cfg.env), p.norm_obs, p.norm_reward,
        p.clip_obs, p.clip_reward, p.gamma,
    )
    return gym.vector.SyncVectorEnv(
        [fn] * p.num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def find_wrapper(env: gym.Env, cls: type) -> gym.Wrapper | None:
    """The outermost wrapper of type `cls` in an env's chain, or None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None
