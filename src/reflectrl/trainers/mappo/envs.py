"""PettingZoo parallel envs as reflectrl trains them: `--env pettingzoo:MODULE`, any module
with `parallel_env(**kwargs)` (e.g. `pettingzoo:mpe2.simple_spread_v3`), `--set env.NAME=VALUE`
passed to it.

`ParallelVecEnv` steps `num_envs` copies in turn and gives time-major arrays with an agent
axis: observations (E, n, D), rewards, terminations and truncations (E, n), for the agents of
`possible_agents`, in that order.

DECISIONs (the seed does not say; docs/multiagent.md):
* Observations are flattened; agents whose observations are shorter than the longest are
  zero-padded to it (as SuperSuit's pad_observations), so one network can read every agent.
* Actions must be Discrete, with the same number of actions for every agent: continuous
  actions are refused with one line (mappo samples a categorical policy).
* The team's episode ends when any agent's does (MPE's agents all stop together at
  max_cycles). An agent that terminated then is terminal; every other agent counts as
  truncated, so its return bootstraps from V of the state it was cut at. The env is reset.
* A copy is seeded once, with seed + its index, at the first reset; later resets continue
  its own random stream, so a snapshot of the copies (`dumps`, the checkpoint) continues exactly.
"""

from __future__ import annotations

import importlib
import io
import pickle

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.utils import EzPickle

from reflectrl.envs import PETTINGZOO_PREFIX as PREFIX
from reflectrl.envs import is_pettingzoo_id
from reflectrl.errors import UserError

EXAMPLE = "pettingzoo:mpe2.simple_spread_v3"


def make_parallel_env(env_id: str, env_kwargs: dict | None = None):
    """The PettingZoo parallel env an id names; one line saying what is wrong otherwise."""
    name = env_id[len(PREFIX):].strip()
    if not name:
        raise UserError(f"--env {env_id}: name a module after '{PREFIX}', e.g. --env {EXAMPLE}")
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise UserError(f"--env {env_id}: cannot import module '{name}' ({err}); PettingZoo's MPE envs come with "
                        "pip install 'reflectrl[marl]' (e.g. --env pettingzoo:mpe2.simple_spread_v3)") from None
    factory = getattr(module, "parallel_env", None)
    if not callable(factory):
        raise UserError(f"--env {env_id}: module '{name}' has no parallel_env(); mappo trains PettingZoo parallel "
                        f"envs, a module that exposes parallel_env(**kwargs) (e.g. --env {EXAMPLE})")
    try:
        env = factory(**dict(env_kwargs or {}))
    except TypeError as err:
        raise UserError(f"--env {env_id}: parallel_env() does not take the --set env.* keywords "
                        f"{sorted(env_kwargs or {})}: {err}") from None
    missing = [a for a in ("possible_agents", "reset", "step", "observation_space", "action_space")
               if not hasattr(env, a)]
    if missing:
        raise UserError(f"--env {env_id}: parallel_env() gave a {type(env).__name__}, which lacks "
                        f"{', '.join(missing)}: it is not a PettingZoo ParallelEnv")
    return without_checks(env)


def without_checks(env):
    """A parallel env converted from an AEC env, without the AEC side's checking wrappers
    (OrderEnforcingWrapper, AssertOutOfBoundsWrapper): they change nothing for a caller that
    resets before stepping and sends valid actions, as the trainer does, but every attribute the
    conversion reads each step goes through their __getattr__ (a third of MPE's step time).
    Wrappers that change values (ClipOutOfBoundsWrapper, ...) stay, and so does any other env."""
    try:
        from pettingzoo.utils.conversions import aec_to_parallel_wrapper
        from pettingzoo.utils.wrappers import AssertOutOfBoundsWrapper, OrderEnforcingWrapper
    except ImportError:
        return env
    if type(env) is not aec_to_parallel_wrapper:
        return env
    inner = env.aec_env
    while type(inner) in (OrderEnforcingWrapper, AssertOutOfBoundsWrapper):
        inner = inner.env
    return env if inner is env.aec_env else aec_to_parallel_wrapper(inner)


class EnvLayout:
    """What the trainer needs to know of a multi-agent env: its agents, their (padded)
    observation width and their number of actions."""

    def __init__(self, env, env_id: str):
        self.agents = list(env.possible_agents)
        if not self.agents:
            raise UserError(f"--env {env_id}: the env has no agents")
        obs_dims, actions = [], []
        for agent in self.agents:
            obs_space, act_space = env.observation_space(agent), env.action_space(agent)
            if not isinstance(act_space, gym.spaces.Discrete):
                kind = "continuous (Box)" if isinstance(act_space, gym.spaces.Box) else type(act_space).__name__
                raise UserError(f"--env {env_id}: agent '{agent}' has {kind} actions; mappo supports Discrete "
                                "actions only (MPE envs: --set env.continuous_actions=false)")
            if not isinstance(obs_space, gym.spaces.Box):
                raise UserError(f"--env {env_id}: agent '{agent}' observes a {type(obs_space).__name__} space; "
                                "mappo reads Box (vector) observations")
            obs_dims.append(int(np.prod(obs_space.shape)))
            actions.append(int(act_space.n))
        if len(set(actions)) > 1:
            raise UserError(f"--env {env_id}: the agents have different numbers of actions "
                            f"({dict(zip(self.agents, actions))}); mappo needs the same Discrete(n) for every agent")
        self.obs_dims = obs_dims
        self.obs_dim = max(obs_dims)
        self.n_actions = actions[0]

    @property
    def n_agents(self) -> int:
        return len(self.agents)


def describe(env_id: str, env_kwargs: dict | None = None) -> EnvLayout:
    """Build the env once and read its layout (the config probe); closes it."""
    env = make_parallel_env(env_id, env_kwargs)
    try:
        return EnvLayout(env, env_id)
    finally:
        env.close()


class ParallelVecEnv:
    """`num_envs` copies of a PettingZoo parallel env, stepped in turn, with an agent axis."""

    def __init__(self, env_id: str, env_kwargs: dict | None, num_envs: int):
        self.envs = [make_parallel_env(env_id, env_kwargs) for _ in range(num_envs)]
        self.layout = EnvLayout(self.envs[0], env_id)
        self.agents = self.layout.agents
        n = len(self.agents)
        self.returns = np.zeros((num_envs, n), dtype=np.float64)  # the running episodes' per-agent returns
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def _stack(self, obs: dict) -> np.ndarray:
        out = np.zeros((len(self.agents), self.layout.obs_dim), dtype=np.float32)
        for i, agent in enumerate(self.agents):
            if agent in obs:
                row = np.asarray(obs[agent], dtype=np.float32).reshape(-1)
                out[i, :row.size] = row
        return out

    def reset(self, seed: int) -> np.ndarray:
        """Seed and reset every copy (copy e with seed + e); observations (E, n, D)."""
        self.returns[:] = 0
        self.lengths[:] = 0
        return np.stack([self._stack(env.reset(seed=seed + e)[0]) for e, env in enumerate(self.envs)])

    def step(self, actions: np.ndarray):
        """One joint step of every copy; actions (E, n). Returns (obs, rewards, terminations,
        truncations, finals, episodes): finals {env: (n, D) last observation} of the episodes that
        ended (whose copies were reset: obs holds their first observation), episodes a list of
        (team return, per-agent returns, length) of those episodes."""
        E, n = self.num_envs, len(self.agents)
        obs = np.zeros((E, n, self.layout.obs_dim), dtype=np.float32)
        rewards = np.zeros((E, n), dtype=np.float32)
        terms = np.zeros((E, n), dtype=bool)
        truncs = np.zeros((E, n), dtype=bool)
        finals, episodes = {}, []
        for e, env in enumerate(self.envs):
            live = set(env.agents)
            o, r, te, tr, _ = env.step({a: int(actions[e, i]) for i, a in enumerate(self.agents) if a in live})
            obs[e] = self._stack(o)
            for i, agent in enumerate(self.agents):
                rewards[e, i] = r.get(agent, 0.0)
                terms[e, i] = bool(te.get(agent, agent not in live))
                truncs[e, i] = bool(tr.get(agent, False))
            self.returns[e] += rewards[e]
            self.lengths[e] += 1
            if (terms[e] | truncs[e]).any() or not env.agents:
                truncs[e] = ~terms[e]  # the team's episode ends: the agents still going are cut
                finals[e] = obs[e].copy()
                episodes.append((float(self.returns[e].sum()), self.returns[e].copy(), int(self.lengths[e])))
                self.returns[e] = 0
                self.lengths[e] = 0
                obs[e] = self._stack(env.reset()[0])
        return obs, rewards, terms, truncs, finals, episodes

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _restore_ezpickled(cls, args, kwargs, state):
    env = cls(*args, **kwargs)
    env.__dict__.update(state)
    return env


def _picklable(value) -> bool:
    try:
        cloudpickle.dumps(value)
        return True
    except Exception:  # pickling raises whatever the object's reducer raises
        return False


class _EnvPickler(cloudpickle.Pickler):
    """Pickles an `EzPickle` env (MPE's, most of PettingZoo's) by its state, not by its constructor
    arguments (what EzPickle saves: a fresh env on loading). What cannot be pickled (a pygame
    surface or font) is left out and comes back as a fresh env has it."""

    def reducer_override(self, obj):
        if isinstance(obj, EzPickle) and hasattr(obj, "__dict__"):
            state = {k: v for k, v in vars(obj).items()
                     if k not in ("_ezpickle_args", "_ezpickle_kwargs") and _picklable(v)}
            return _restore_ezpickled, (type(obj), obj._ezpickle_args, obj._ezpickle_kwargs, state)
        return super().reducer_override(obj)


def dumps(envs: ParallelVecEnv) -> bytes:
    """An exact snapshot of the copies: their episodes, running returns and random streams."""
    buf = io.BytesIO()
    _EnvPickler(buf).dump(envs)
    return buf.getvalue()


def loads(data: bytes) -> ParallelVecEnv:
    return pickle.loads(data)


def resolve_multiagent(cfg):
    """MAPPO's resolve: a PettingZoo id, the env described (a UserError for one it cannot train)."""
    if not is_pettingzoo_id(cfg.env_id):
        raise UserError(f"--algo {cfg.algo} trains PettingZoo parallel envs, --env {PREFIX}MODULE (e.g. --env "
                        f"{EXAMPLE}); '{cfg.env_id}' is not one: use --algo ppo on it")
    if cfg.wrapper:
        raise UserError(f"--wrapper {cfg.wrapper}: the reward wrappers are for Gymnasium envs; mappo runs take none")
    if cfg.backend != "gymnasium":
        raise UserError(f"backend={cfg.backend}: mappo steps PettingZoo envs itself; use backend=gymnasium")
    describe(cfg.env_id, cfg.env)  # a UserError for an env mappo cannot train
    return cfg
