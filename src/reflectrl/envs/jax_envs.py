"""JAX environments by family, behind one functional interface with auto-reset.

    gymnax:<id>    gymnax's classic control and MinAtar (gymnax:CartPole-v1, gymnax:Breakout-MinAtar)
    navix:<id>     MiniGrid tasks in navix (navix:Navix-DoorKey-Random-8x8-v0, navix:Navix-Empty-8x8-v0;
                   not its KeyCorridor, which cannot be solved: key_corridor_defects)
    xminigrid:<id> xland-minigrid's ports of MiniGrid tasks navix lacks (xminigrid:MiniGrid-LockedRoom,
                   xminigrid:MiniGrid-BlockedUnlockPickUp, ...); its XLand meta-RL tasks are not supported
    craftax:<id>   Craftax (craftax:Craftax-Classic-Symbolic-v1), its achievements logged
    reflectrl:GridWorld-v0  the built-in maze of the torch side (reflectrl/GridWorld-v0), the same
                   layouts, observations, step limit and reward from the same `env.*` settings

navix and MiniGrid: navix's plain `Navix-DoorKey-*` fixes the agent's start where MiniGrid
randomises it; use its `-Random-` ids for MiniGrid's task. By default (`env.minigrid=true`) a
navix env is built with MiniGrid's settings, so that a run compares with the torch side's
MiniGrid runs: the agent's 7x7 first-person view (`symbolic_first_person`, flattened), MiniGrid's
step limit for the task (DoorKey 10 n^2, Empty 4 n^2, KeyCorridor 30 s^2, FourRooms 100, ...;
navix's default is 100 for every task), MiniGrid's reward 1 - 0.9 t / max_steps on reaching the
goal (navix's `penality_coeff=0.9`) and, for the -Random- DoorKey, MiniGrid's layout
(`minigrid_doorkey`: navix puts the goal anywhere in the right room, MiniGrid in its corner).
`env.minigrid=false` keeps navix's own defaults.

Every env here terminates or truncates on its own; `step` resets an env whose episode ended in
the same call (the next observation is the new episode's first) and returns the final
observation and the state key of the state the step reached (for bootstrapping a truncated
step and for the exploration metrics). State keys (exploration metrics, the count bonus) are
ints in [0, key_space): navix's and xland-minigrid's player cell, heading and whether it carries
something; Craftax's
player cell; the grid world's cell (row * size + col, as on the torch side); elsewhere a 16-bit
SimHash of the observation (envs/statekey.py's idea).

Resets in a vector step (`vector_step`): every env whose episode ended gets a fresh reset, except
with `env.reset_ratio=k` (Craftax's default 16: its reset generates a world, the cost of many
steps), where N / k resets are computed per step and handed out as Craftax's optimistic resets do
(distinct while they last, then shared by envs that ended at the same step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from reflectrl.envs.gridworld import ACTION_DELTAS, GridWorldEnv
from reflectrl.envs.jax_ids import FAMILIES, canonical_env_id, install_hint
from reflectrl.envs.statekey import pack_craftax_key, pack_navix_key
from reflectrl.errors import UserError

SIMHASH_BITS = 16


@dataclass(frozen=True)
class StepOut:
    obs: Any          # the next observation (the new episode's first where this one ended)
    env_state: Any
    reward: Any
    terminated: Any
    truncated: Any
    final_obs: Any    # the observation the step reached (its episode's last where it ended)
    reached_key: Any  # the state key of that observation
    key: Any          # the state key of `obs`
    achievements: Any  # (A,) bool achievements of the episode so far (Craftax), else (0,)


jax.tree_util.register_pytree_node(
    StepOut, lambda s: ((s.obs, s.env_state, s.reward, s.terminated, s.truncated, s.final_obs, s.reached_key,
                         s.key, s.achievements), None),
    lambda _, c: StepOut(*c))


class JaxEnv:
    """One env of a family; `reset` and `step` are pure and vmap over envs and seeds."""

    id: str
    obs_dim: int
    discrete: bool
    action_dim: int             # actions (discrete) or the Box dimension
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None
    key_space: int = 2 ** SIMHASH_BITS
    achievement_names: tuple[str, ...] = ()

    reset_ratio: int = 1        # envs per reset computed in each vector step (vector_step); 1: every env its own

    def reset(self, key):
        """(obs, env_state, state key)."""
        raise NotImplementedError

    def transition(self, key, env_state, action):
        """One step without the reset: (obs, env_state, reward, terminated, truncated, state key, achievements)."""
        raise NotImplementedError

    def step(self, key, env_state, action) -> StepOut:
        """One env's step, reset where its episode ended (eval)."""
        k_step, k_reset = jax.random.split(key)
        obs, state, reward, terminated, truncated, reached, achievements = self.transition(k_step, env_state, action)
        return _with_resets(self.reset(k_reset), obs, state, reward, terminated, truncated, reached, achievements)


def _with_resets(resets, obs, state, reward, terminated, truncated, reached, achievements) -> StepOut:
    reset_obs, reset_state, reset_key = resets
    done = jnp.logical_or(terminated, truncated)

    def pick(r, s):
        return jnp.where(done.reshape(done.shape + (1,) * (s.ndim - done.ndim)), r, s)

    return StepOut(pick(reset_obs, obs), jax.tree_util.tree_map(pick, reset_state, state), reward.astype(jnp.float32),
                   terminated, truncated, obs, reached, jnp.where(done, reset_key, reached), achievements)


def vector_step(env: JaxEnv, key, env_states, actions) -> StepOut:
    """N envs' step (vmapped), the ended episodes reset. With `env.reset_ratio` = k > 1, only N / k
    resets are computed per step and handed to the envs that ended (distinct ones while they last, then
    shared): Craftax's optimistic resets, for envs whose reset costs many steps (Craftax builds a world)."""
    n = actions.shape[0]
    k_step, k_reset, k_pick = jax.random.split(key, 3)
    obs, state, reward, terminated, truncated, reached, achievements = jax.vmap(env.transition)(
        jax.random.split(k_step, n), env_states, actions)
    resets_n = max(1, n // max(1, env.reset_ratio))
    resets = jax.vmap(env.reset)(jax.random.split(k_reset, resets_n))
    if resets_n < n:
        done = jnp.logical_or(terminated, truncated)
        index = jnp.arange(resets_n).repeat(-(-n // resets_n))[:n]
        chosen = jax.random.choice(k_pick, n, shape=(resets_n,), replace=False,
                                   p=(done + 1e-6) / (done + 1e-6).sum())
        index = index.at[chosen].set(jnp.arange(resets_n))
        resets = jax.tree_util.tree_map(lambda x: x[index], resets)
    return _with_resets(resets, obs, state, reward, terminated, truncated, reached, achievements)


def _reset_ratio(kwargs: dict, default: int) -> int:
    """env.reset_ratio: envs per reset computed in a vector step (vector_step's optimistic resets)."""
    value = kwargs.pop("reset_ratio", default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"env.reset_ratio={value}: give a positive integer (1: every env that ends gets its own "
                        "reset; k: one reset per k envs each step, shared where more end at once)")
    return value


def _simhash(obs: jax.Array, obs_dim: int) -> jax.Array:
    """A 16-bit SimHash of a flat observation: the signs of 16 fixed random projections."""
    planes = jax.random.normal(jax.random.PRNGKey(20240), (obs_dim, SIMHASH_BITS))
    bits = (obs.reshape(-1).astype(jnp.float32) @ planes) > 0
    return jnp.sum(bits.astype(jnp.int32) << jnp.arange(SIMHASH_BITS, dtype=jnp.int32))


class GymnaxEnv(JaxEnv):
    def __init__(self, name: str, kwargs: dict):
        gymnax = import_gymnax()
        if name not in gymnax.registered_envs:
            raise UserError(f"--env gymnax:{name}: gymnax has no such env; it has {', '.join(gymnax.registered_envs)}")
        self.id = f"gymnax:{name}"
        kwargs = dict(kwargs)
        self.reset_ratio = _reset_ratio(kwargs, 1)
        self.env, params = gymnax.make(name)
        self.params = params.replace(**kwargs) if kwargs else params
        space = self.env.action_space(self.params)
        self.discrete = hasattr(space, "n")
        obs_shape = self.env.observation_space(self.params).shape
        self.obs_dim = int(np.prod(obs_shape))
        if self.discrete:
            self.action_dim = int(space.n)
        else:
            self.action_dim = int(np.prod(space.shape))
            self.action_low = np.broadcast_to(np.asarray(space.low, np.float32), (self.action_dim,)).copy()
            self.action_high = np.broadcast_to(np.asarray(space.high, np.float32), (self.action_dim,)).copy()
        self.max_steps = int(self.params.max_steps_in_episode)

    def _flat(self, obs):
        return obs.reshape(-1).astype(jnp.float32)

    def reset(self, key):
        obs, state = self.env.reset_env(key, self.params)
        obs = self._flat(obs)
        return obs, state, _simhash(obs, self.obs_dim)

    def transition(self, key, env_state, action):
        obs, state, reward, terminated, _ = self.env.step_env(key, env_state, action, self.params)
        obs = self._flat(obs)
        # gymnax >= 1.0 tells the time limit apart: a step that ends on both is a termination
        truncated = jnp.logical_and(self.env.is_truncated(state, self.params), jnp.logical_not(terminated))
        return obs, state, reward, terminated, truncated, _simhash(obs, self.obs_dim), jnp.zeros((0,), bool)


# MiniGrid's step limits by task (minigrid/envs/*.py), for navix's ids
def _minigrid_max_steps(name: str) -> int | None:
    size = re.search(r"(\d+)x\d+", name)
    n = int(size.group(1)) if size else None
    if "DoorKey" in name and n:
        return 10 * n * n
    if ("Empty" in name or "Dynamic-Obstacles" in name or "GoToDoor" in name) and n:
        return 4 * n * n
    corridor = re.search(r"KeyCorridorS(\d+)R(\d+)", name)
    if corridor:
        return 30 * int(corridor.group(1)) ** 2
    crossing = re.search(r"(?:LavaGap|SimpleCrossing)S(\d+)", name)
    if crossing:
        return 4 * int(crossing.group(1)) ** 2
    if "FourRooms" in name:
        return 100
    return None


def import_with_stand_ins(package: str, stand_ins: dict, keep: bool):
    """`package`, imported with stand-in modules in sys.modules for `stand_ins` ({module: its
    attributes}: modules it imports that the envs we use never call: renderers, agents). Stand-ins
    that `keep` stay (the package's own submodules); the others (third-party modules such as
    seaborn) are taken out again once the package is in, or its import failed, so that a later real
    import of them still works. Nothing is stood in for when the package was imported already, or
    for a module that was."""
    import importlib
    import sys
    import types

    if sys.modules.get(package) is not None:  # (None: an import of it is to fail, as Python's own import says)
        return sys.modules[package]
    placed = {}
    for name, attributes in stand_ins.items():
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__doc__ = f"a stand-in (reflectrl.envs.jax_envs.import_with_stand_ins): import {name} first to use it"
            stub.__dict__.update(attributes)
            sys.modules[name] = placed[name] = stub
    try:
        return importlib.import_module(package)
    finally:
        for name, stub in placed.items() if not keep else ():
            if sys.modules.get(name) is stub:
                del sys.modules[name]


def import_navix():
    """navix, without its agents and experiment modules: its package imports them (wandb, distrax,
    tensorflow-probability: 4 of navix's 6 s of import here) and its envs use neither."""
    return import_with_stand_ins("navix", {"navix.agents": {}, "navix.experiment": {"Experiment": None}}, keep=True)


def import_gymnax():
    """gymnax, without seaborn and matplotlib's pyplot: its registry imports every env module, and
    Pong's and the bsuite envs' renderers import those two (about 2 of gymnax's 3.5 s of import on
    top of jax's here, with scipy and pandas); no env's step or reset uses them."""
    return import_with_stand_ins("gymnax", {"seaborn": {}, "matplotlib.pyplot": {}}, keep=False)


def minigrid_doorkey(env):
    """navix's -Random- DoorKey with MiniGrid's layout (minigrid/envs/doorkey.py): the goal in the
    bottom-right corner (navix places it anywhere in the right room), the door in rows 1 .. h-3
    (navix: 1 .. h-2), the agent anywhere in the left room with any heading, the key elsewhere there."""
    import dataclasses

    from navix.components import EMPTY_POCKET_ID
    from navix.entities import Door, Goal, Key, Player, Wall
    from navix.environments import Timestep
    from navix.environments.door_key import DoorKey
    from navix.grid import mask_by_coordinates, random_directions, random_positions, room
    from navix.rendering.cache import RenderingCache
    from navix.rendering.registry import PALETTE
    from navix.states import State

    class MiniGridDoorKey(DoorKey):
        def _reset(self, key, cache=None):
            h, w = self.height, self.width
            key, k_player, k_dir, k_key, k_row, k_col = jax.random.split(key, 6)
            grid = room(height=h, width=w)
            door_col = jax.random.randint(k_col, (), 2, w - 2)
            door_row = jax.random.randint(k_row, (), 1, h - 2)
            door_pos = jnp.asarray((door_row, door_col))
            door = Door.create(position=door_pos, requires=jnp.asarray(3), open=jnp.asarray(False),
                               colour=PALETTE.YELLOW)
            wall_pos = jnp.stack((jnp.arange(1, h - 1), jnp.full((h - 2,), door_col)), axis=1)
            walls = Wall.create(position=jnp.delete(wall_pos, door_row - 1, axis=0, assume_unique_indices=True))
            first_room = jnp.where(mask_by_coordinates(grid, (jnp.asarray(h), door_col), jnp.less), grid, -1)
            player_pos = random_positions(k_player, first_room)
            player = Player.create(position=player_pos, direction=random_directions(k_dir),
                                   pocket=EMPTY_POCKET_ID)
            goal = Goal.create(position=jnp.asarray([h - 2, w - 2]), probability=jnp.asarray(1.0))
            key_entity = Key.create(position=random_positions(k_key, first_room, exclude=player_pos),
                                    id=jnp.asarray(3), colour=PALETTE.YELLOW)
            grid = grid.at[tuple(door_pos)].set(0)
            state = State(key=key, grid=grid, cache=cache or RenderingCache.init(grid),
                          entities={"player": player[None], "key": key_entity[None], "door": door[None],
                                    "goal": goal[None], "wall": walls})
            return Timestep(t=jnp.asarray(0, dtype=jnp.int32), observation=self.observation_fn(state),
                            action=jnp.asarray(-1, dtype=jnp.int32), reward=jnp.asarray(0.0, dtype=jnp.float32),
                            step_type=jnp.asarray(0, dtype=jnp.int32), state=state)

    return MiniGridDoorKey(**{f.name: getattr(env, f.name) for f in dataclasses.fields(env)})


def key_corridor_defects(env) -> list[str]:
    """What makes a navix KeyCorridor unsolvable, from one reset (empty where nothing does). navix
    0.7.4's (navix/environments/key_corridor.py) places every door on a wall cell, so the agent never
    leaves the corridor, and its goal is a Ball, which walking into or picking up never marks as the
    goal reached, so no step pays a reward (found on 2026-12-06: 8 seeds x 500k steps of ppo and
    ppo+count visited 20 state keys, the corridor's 5 cells x 4 headings, and got no reward)."""
    from navix.entities import Goal

    state = jax.jit(env.reset)(jax.random.PRNGKey(0)).state
    grid = np.asarray(state.grid)
    doors = np.asarray(state.entities["door"].position).reshape(-1, 2)
    found = []
    if any(grid[r, c] != 0 for r, c in doors):
        found.append("its doors sit in walls, so the agent never leaves the corridor")
    if not isinstance(state.entities["goal"], Goal):
        found.append(f"its goal is a {type(state.entities['goal']).__name__}, which never pays a reward")
    return found


def _refuse_unsolvable_key_corridor(env, env_id: str) -> None:
    found = key_corridor_defects(env)
    if found:
        from importlib import metadata

        version = metadata.version("navix")  # installed: the env came from it
        minigrid_id = env_id.split(":", 1)[1].replace("Navix-", "MiniGrid-")
        raise UserError(f"--env {env_id}: navix {version}'s KeyCorridor cannot be solved ({'; '.join(found)}); "
                        f"run MiniGrid's on the torch side instead: --env {minigrid_id} --set backend=envpool")


class NavixEnv(JaxEnv):
    def __init__(self, name: str, kwargs: dict):
        import warnings

        with warnings.catch_warnings():  # navix 0.7 touches an API jax deprecates: not the user's concern
            warnings.filterwarnings("ignore", message=".*pytype_aval_mappings", category=DeprecationWarning)
            navix = import_navix()

        if name not in navix.registry():
            raise UserError(f"--env navix:{name}: navix has no such env; e.g. navix:Navix-DoorKey-Random-8x8-v0 "
                            f"(it has {len(navix.registry())}: {', '.join(sorted(navix.registry())[:6])}, ...)")
        kwargs = dict(kwargs)
        minigrid = bool(kwargs.pop("minigrid", True))
        self.reset_ratio = _reset_ratio(kwargs, 1)
        if minigrid:
            max_steps = _minigrid_max_steps(name)
            if max_steps is not None:
                kwargs.setdefault("max_steps", max_steps)
            kwargs.setdefault("observation_fn", navix.observations.symbolic_first_person)
            kwargs.setdefault("penality_coeff", 0.9)
        try:
            self.env = navix.make(name, **kwargs)
        except TypeError as err:
            raise UserError(f"--env navix:{name}: {err}") from None
        if minigrid and "DoorKey" in name and "Random" in name:
            self.env = minigrid_doorkey(self.env)
        self.id = f"navix:{name}"
        if "KeyCorridor" in name:
            _refuse_unsolvable_key_corridor(self.env, self.id)
        self.max_steps = int(self.env.max_steps)
        ts = jax.eval_shape(self.env.reset, jax.random.PRNGKey(0))  # shapes only: an eager reset takes seconds
        self.obs_dim = int(np.prod(ts.observation.shape))
        self.discrete = True
        self.action_dim = len(self.env.action_set)
        self.height, self.width = (int(x) for x in ts.state.grid.shape)
        if self.height > 64 or self.width > 32:
            raise UserError(f"--env {self.id}: grids up to 64 x 32 cells are supported (this one is "
                            f"{self.height} x {self.width})")
        self.key_space = self.height * 32 * 8

    def _key(self, state):
        player = state.get_player()
        pos = player.position.reshape(-1)
        carried = (player.pocket.reshape(-1)[0] != -1).astype(jnp.int32)
        return pack_navix_key(pos[0], pos[1], player.direction.reshape(-1)[0], carried)

    def reset(self, key):
        ts = self.env.reset(key)
        return ts.observation.reshape(-1).astype(jnp.float32), ts, self._key(ts.state)

    def transition(self, key, env_state, action):
        from navix.environments.environment import StepType

        ts = self.env._step(env_state, action)
        ts = ts.replace(state=ts.state.replace(key=jax.random.fold_in(ts.state.key, 1)))
        obs = ts.observation.reshape(-1).astype(jnp.float32)
        return (obs, ts, ts.reward, ts.step_type == StepType.TERMINATION, ts.step_type == StepType.TRUNCATION,
                self._key(ts.state), jnp.zeros((0,), bool))


class XMinigridEnv(JaxEnv):
    """xland-minigrid's MiniGrid tasks (`xminigrid:MiniGrid-LockedRoom`): the ones navix lacks (LockedRoom,
    BlockedUnlockPickUp, UnlockPickUp, Unlock, Playground, Memory). They keep MiniGrid's layouts, step
    limits and reward (1 - 0.9 t / max_steps); what differs from MiniGrid: the observation is the 7x7 view
    as (tile, colour) pairs, transparent (MiniGrid hides what walls occlude) and without the carried
    object; the six actions are xland-minigrid's (forward, right, left, pick up, put down, toggle: MiniGrid's
    order is left, right, forward, pick up, drop, toggle, done). `env.*` settings are its EnvParams
    (`height`, `width`, `view_size`, `max_steps`)."""

    def __init__(self, name: str, kwargs: dict):
        import xminigrid

        if name.startswith("XLand-MiniGrid"):
            raise UserError(f"--env xminigrid:{name}: xland-minigrid's XLand tasks need a benchmark of rulesets "
                            "downloaded at run time, which reflectrl does not do; its MiniGrid-* tasks are "
                            "supported (e.g. xminigrid:MiniGrid-LockedRoom)")
        known = sorted(n for n in xminigrid.registered_environments() if n.startswith("MiniGrid"))
        if name not in known:
            raise UserError(f"--env xminigrid:{name}: xland-minigrid has no such task; it has {', '.join(known)}")
        kwargs = dict(kwargs)
        self.reset_ratio = _reset_ratio(kwargs, 1)
        try:
            # the task's defaults with the settings in (xminigrid.make replaces them after the defaults, so a
            # new height or width would keep the default grid's step limit)
            self.env, default = xminigrid.make(name)
            self.params = self.env.default_params(**{"height": default.height, "width": default.width, **kwargs})
        except (TypeError, ValueError, AssertionError) as err:
            raise UserError(f"--env xminigrid:{name}: {err} (its settings: height, width, view_size, "
                            "max_steps)") from None
        self.id = f"xminigrid:{name}"
        self.max_steps = int(self.params.max_steps)
        self.obs_dim = int(np.prod(self.env.observation_shape(self.params)))
        self.discrete = True
        self.action_dim = int(self.env.num_actions(self.params))
        self.height, self.width = int(self.params.height), int(self.params.width)
        if self.height > 64 or self.width > 32:
            raise UserError(f"--env {self.id}: grids up to 64 x 32 cells are supported (this one is "
                            f"{self.height} x {self.width})")
        self.key_space = self.height * 32 * 8

    def _key(self, state):
        agent = state.agent
        carried = (agent.pocket[0] != 0).astype(jnp.int32)  # an empty pocket is the EMPTY tile (0)
        return pack_navix_key(agent.position[0], agent.position[1], agent.direction, carried)

    def reset(self, key):
        ts = self.env.reset(self.params, key)
        return ts.observation.reshape(-1).astype(jnp.float32), ts, self._key(ts.state)

    def transition(self, key, env_state, action):
        ts = self.env.step(self.params, env_state, action)
        last = ts.step_type == 2  # StepType.LAST; a termination sets the discount to 0
        terminated = jnp.logical_and(last, ts.discount == 0)
        truncated = jnp.logical_and(last, ts.discount != 0)
        obs = ts.observation.reshape(-1).astype(jnp.float32)
        return obs, ts, ts.reward, terminated, truncated, self._key(ts.state), jnp.zeros((0,), bool)


class CraftaxEnv(JaxEnv):
    def __init__(self, name: str, kwargs: dict):
        from craftax.craftax_env import make_craftax_env_from_name

        if name not in ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1"):
            raise UserError(f"--env craftax:{name}: use craftax:Craftax-Classic-Symbolic-v1 or "
                            "craftax:Craftax-Symbolic-v1 (the pixel versions are not supported)")
        self.id = f"craftax:{name}"
        kwargs = dict(kwargs)
        self.reset_ratio = _reset_ratio(kwargs, 16)  # Craftax's own PPO: a reset builds a world
        self.env = make_craftax_env_from_name(name, auto_reset=False)
        self.params = self.env.default_params.replace(**kwargs) if kwargs else self.env.default_params
        obs, state = jax.eval_shape(lambda k: self.env.reset(k, self.params), jax.random.PRNGKey(0))
        self.obs_dim = int(np.prod(obs.shape))
        self.discrete = True
        self.action_dim = int(self.env.action_space(self.params).n)
        self.max_steps = int(self.params.max_timesteps)
        self.map_size = int(state.map.shape[-1])
        if self.map_size > 64:
            raise UserError(f"--env {self.id}: maps up to 64 x 64 are supported")
        self.key_space = 64 * 64 * (int(state.map.shape[0]) if state.map.ndim == 3 else 1)
        from craftax.craftax_classic.constants import Achievement

        self.achievement_names = tuple(a.name.lower() for a in Achievement)

    def _key(self, state):
        pos = state.player_position.reshape(-1)
        return pack_craftax_key(getattr(state, "player_level", 0), pos[0], pos[1])

    def reset(self, key):
        obs, state = self.env.reset_env(key, self.params)
        return obs.reshape(-1).astype(jnp.float32), state, self._key(state)

    def transition(self, key, env_state, action):
        obs, state, reward, done, _ = self.env.step_env(key, env_state, action, self.params)
        obs = obs.reshape(-1).astype(jnp.float32)
        truncated = jnp.logical_and(done, state.timestep >= self.max_steps)
        terminated = jnp.logical_and(done, jnp.logical_not(truncated))
        return obs, state, reward, terminated, truncated, self._key(state), state.achievements


class GridWorldJax(JaxEnv):
    """The built-in maze (envs/gridworld.py) in JAX: the layout, start, goal, step limit and
    observation come from the torch env built with the same settings, so both backends run the
    same task; its state is the agent's cell and the episode's step count."""

    def __init__(self, name: str, kwargs: dict):
        if name != "GridWorld-v0":
            raise UserError(f"--env reflectrl:{name}: the JAX backend's built-in env is reflectrl:GridWorld-v0")
        kwargs = dict(kwargs)
        self.reset_ratio = _reset_ratio(kwargs, 1)
        try:
            base = GridWorldEnv(**kwargs)
        except (TypeError, ValueError) as err:
            raise UserError(f"--env reflectrl:GridWorld-v0: {err}") from None
        if base.hazards is not None:
            raise UserError("--env reflectrl:GridWorld-v0: env.hazards (a cost channel) is torch-only; "
                            "use --env reflectrl/GridWorld-v0 without backend=jax")
        self.id = f"reflectrl:{name}"
        self.size = base.size
        self.onehot = base.obs_mode == "onehot"
        self.walls = jnp.asarray(base.walls)
        self.start = tuple(int(v) for v in base.start)
        self.goal = tuple(int(v) for v in base.goal)
        self.max_steps = base.max_episode_steps
        self.obs_dim = int(np.prod(base.observation_space.shape))
        self.discrete = True
        self.action_dim = 4
        self.key_space = self.size * self.size
        self.deltas = jnp.asarray(ACTION_DELTAS, dtype=jnp.int32)

    def _obs(self, cell):
        if self.onehot:
            return jax.nn.one_hot(self._key(cell), self.size * self.size, dtype=jnp.float32)
        return cell.astype(jnp.float32) / (self.size - 1)

    def _key(self, cell):
        return cell[0] * self.size + cell[1]  # the torch side's gridworld_key

    def reset(self, key):
        cell = jnp.asarray(self.start, dtype=jnp.int32)
        return self._obs(cell), (cell, jnp.int32(0)), self._key(cell)

    def transition(self, key, env_state, action):
        cell, t = env_state
        target = cell + self.deltas[action]
        inside = jnp.all((target >= 0) & (target < self.size))
        clipped = jnp.clip(target, 0, self.size - 1)
        cell = jnp.where(inside & ~self.walls[clipped[0], clipped[1]], target, cell)
        t = t + 1
        terminated = (cell[0] == self.goal[0]) & (cell[1] == self.goal[1])
        truncated = ~terminated & (t >= self.max_steps)
        return (self._obs(cell), (cell, t), terminated.astype(jnp.float32), terminated, truncated,
                self._key(cell), jnp.zeros((0,), bool))


_MADE: dict = {}


def make_env(env_id: str, kwargs: dict | None = None) -> JaxEnv:
    """The JAX env an id names (FAMILY:NAME), with one clear line for a missing package or a bad id;
    built once per process for an id and settings (a run's resolve and its trainer share it)."""
    import json

    env_id = canonical_env_id(env_id, "jax")  # the grid world's torch spelling too
    key = (env_id, json.dumps(kwargs or {}, sort_keys=True, default=str))
    if key not in _MADE:
        _MADE[key] = _make_env(env_id, kwargs)
    return _MADE[key]


def _make_env(env_id: str, kwargs: dict | None = None) -> JaxEnv:
    family, _, name = env_id.partition(":")
    if family not in FAMILIES or not name:
        raise UserError(f"--env {env_id}: backend=jax takes gymnax:<id>, navix:<id>, xminigrid:<id>, craftax:<id> "
                        "or reflectrl:GridWorld-v0 (e.g. gymnax:CartPole-v1, navix:Navix-DoorKey-Random-8x8-v0)")
    if family == "reflectrl":
        return GridWorldJax(name, dict(kwargs or {}))
    try:
        import jax  # noqa: F401

        {"gymnax": import_gymnax, "navix": import_navix}.get(family, lambda: __import__(family))()  # (their stand-ins)
    except ImportError:
        raise UserError(f"--env {env_id} needs {family} and JAX: {install_hint(env_id)}") from None
    return {"gymnax": GymnaxEnv, "navix": NavixEnv, "xminigrid": XMinigridEnv,
            "craftax": CraftaxEnv}[family](name, dict(kwargs or {}))
