"""Environments: `make_env(id)` for any Gymnasium id, MiniGrid and Atari ids and the built-in grid world.

The wrapper order matters and is fixed here, innermost first:

1. the env (MiniGrid's dict observation is reduced to its image and flattened, see below);
2. `RecordEpisodeStatistics`: the episode return it reports is the *true* env return, so it
   sits below every reward wrapper; trainers and `eval` log only this number;
3. the optional reward wrapper (`sparse` or `delayed:K`), or a cost channel
   (`velocity-cost`: info["cost"], see cost.py);
4. for continuous control, CleanRL's observation/reward normalisation and clipping
   (added by `make_vector_env`, not by `make_env`).

Atari ids (`ALE/<Game>-v5`, `<Game>NoFrameskip-v4`) get CleanRL's ppo_atari preprocessing
and record their true score themselves, below their episodic-life and reward-clipping
wrappers (see atari.py); the rest of the chain above is the same.

MiniGrid: observations are the 7x7x3 symbolic egocentric view, flattened to 147 integers
for the MLP policy by default (`encoder=cnn` keeps the view for a small CNN). We chose
flattening as the default because the view is symbolic (object,
colour and state indices, not pixels), tiny, and fixed in size, so an MLP learns it well
on a CPU and every signal sees the same kind of feature vector on every env. Measured
(docs/exploration.md): on DoorKey-5x5, 5 seeds, the MLP's AUC is 0.763 against the CNN's
0.664, and it runs about 1.5x faster.
MiniGrid's mission text is dropped with the dict. `make_env` warns about it when the
mission can vary: for every BabyAI-* id, and for any env whose mission space is not one
fixed string (MiniGrid's `MissionSpace` with a placeholder that has several values, or a
mission space of another kind). MiniGrid-Empty-*, DoorKey-* and the like have one fixed
mission and do not warn.

`keep_image=True` keeps an image observation's shape for the CNN encoder (the default,
`encoder=auto`, for pixel images). Other warnings, each given once per process per env id:
an image observation (a Box of rank 3, or rank 2 uint8; not MiniGrid's symbolic view) is
flattened into an MLP, which is slow and large (the message names `encoder=cnn`); and
training envs with no time limit (see `has_time_limit`), whose episodes may never end.

An id whose extra package is missing, or whose entry point fails to import, is a
`UserError` naming the package and how to install it (MuJoCo v2/v3 ids, which need the
unmaintained mujoco-py, point to their -v5 id).

An env of your own: Gymnasium's `MODULE:ID` form (`my_envs:Corridor-v0`) imports MODULE, whose
import runs its gym.register, then makes ID; runs record the whole string, so every later command
imports MODULE again. MODULE:NAME may also name a class or factory of an env at the top of MODULE (what the
Python API records for an env object: objects.py). `check_new_processes_can_make` refuses, for compare and
sweep, an id that their runs (new processes) could not make.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import find_highest_version, get_env_id, load_env_creator, parse_env_id

from reflectrl.envs import atari
from reflectrl.envs.gridworld import GridWorldEnv, register_gridworld
from reflectrl.envs.headless import prepare_headless_rendering
from reflectrl.envs.jax_ids import JAX_ENV_KNOBS, canonical_env_id, is_jax_env
from reflectrl.envs.normalize import NormalizeObservation, NormalizeReward
from reflectrl.envs.objects import NEW_PROCESS_SOURCES as _NEW_PROCESS_SOURCES
from reflectrl.envs.objects import OBJECT_MODULE, object_env_error, register_attribute
from reflectrl.envs.objects import entry_module as _entry_module
from reflectrl.envs.statekey import StateKey
from reflectrl.envs.vector import FastSyncVectorEnv
from reflectrl.envs.wrappers import DelayedReward, SparseReward, parse_reward_wrapper
from reflectrl.errors import UserError

__all__ = [
    "make_env", "make_vector_env", "GridWorldEnv", "SparseReward", "DelayedReward",
    "parse_reward_wrapper", "is_continuous", "episode_step_limit", "has_time_limit",
    "DEFAULT_ENV", "is_image_space", "is_minigrid", "is_atari_id", "is_pettingzoo_id", "PETTINGZOO_PREFIX",
    "split_module_id", "registered_id", "check_new_processes_can_make",
]

DEFAULT_ENV = "reflectrl/GridWorld-v0"

# How to install the module an env id imports, by top-level module name.
_INSTALL = {
    "jax": "pip install 'gymnasium[jax]'", "jaxlib": "pip install 'gymnasium[jax]'",
    "flax": "pip install 'gymnasium[jax]'", "mujoco": "pip install 'gymnasium[mujoco]'",
    "Box2D": "pip install 'gymnasium[box2d]'", "ale_py": atari.INSTALL, "cv2": atari.INSTALL,
    "minigrid": "pip install 'reflectrl[envs]'", "shimmy": "pip install 'shimmy[gym-v26]'",
}

_WARNED: set[tuple[str, str]] = set()
"""(kind, env id) pairs already warned about in this process; tests clear it."""


def _warn_once(kind: str, env_id: str, message: str) -> None:
    if (kind, env_id) not in _WARNED:
        _WARNED.add((kind, env_id))
        warnings.warn(message, UserWarning, stacklevel=3)


def _ensure_registered(env_id: str) -> None:
    register_gridworld()
    if env_id not in gym.registry:
        try:  # MiniGrid registers its ids on import.
            import minigrid  # noqa: F401
        except ImportError:
            pass
    if env_id not in gym.registry:
        atari.register_atari()


OWN_ENV_HINT = "an env of your own: --env MODULE:{id}, where importing MODULE runs its gym.register"


def _check_env_id(env_id: str) -> None:
    _ensure_registered(env_id)
    if env_id in gym.registry:
        return
    if atari.looks_like_atari(env_id) and not atari.ale_installed():
        raise atari.missing_ale_error(env_id)
    close = _similar_ids(env_id)
    hint = (f"; did you mean {', '.join(close)}?" if close else
            f": no registered env has a similar name (gymnasium.pprint_registry() lists them); "
            f"{OWN_ENV_HINT.format(id=env_id)}")
    if env_id.startswith(("MiniGrid", "BabyAI")):
        hint += " (MiniGrid ids need: pip install 'reflectrl[envs]')"
    raise UserError(f"unknown env id '{env_id}'{hint}")


def _similar_ids(env_id: str, among: set[str] | None = None) -> list[str]:
    """Registered ids (of `among`, default all) whose namespace and name are close to env_id's, each at its
    newest version. The version is left out of the comparison: every id ends in -vN, which made any two
    ids look alike (NoSuchEnv-v0 got "UpNDown-v0, Pong-v0, SpaceInvaders-v0")."""
    def label(ns, name):
        return (f"{ns}/{name}" if ns else name).lower()

    newest: dict[str, gym.envs.registration.EnvSpec] = {}
    for spec in gym.registry.values():
        if among is not None and spec.id not in among:
            continue
        key = label(spec.namespace, spec.name)
        if key not in newest or (spec.version or 0) > (newest[key].version or 0):
            newest[key] = spec
    try:
        ns, name, _ = parse_env_id(env_id)
    except gym.error.Error:  # not the NAMESPACE/NAME-vN form at all
        ns, name = None, env_id
    wanted = label(ns, name)
    # the name is right and its version (or namespace) is not: that name alone, its own namespace first
    # (CartPole-v7 -> CartPole-v1; Breakout-v5 -> Breakout-v4, ALE/Breakout-v5)
    same = sorted((spec for spec in newest.values() if spec.name.lower() == name.lower()),
                  key=lambda spec: spec.namespace != ns)
    if same:
        return [spec.id for spec in same[:3]]
    close = difflib.get_close_matches(wanted, list(newest), n=3, cutoff=0.75)
    return [newest[key].id for key in close]


# --------------------------------------------------------------------------- MODULE:ID, an env of your own

def split_module_id(env_id: str) -> tuple[str | None, str]:
    """(MODULE, ID) of Gymnasium's `MODULE:ID` form, split as gym.make splits it: importing MODULE runs
    its gym.register, then ID is made. (None, env_id) for any other id: the JAX backend's FAMILY:NAME
    ids and MAPPO's pettingzoo:MODULE share the colon and keep their meaning."""
    module, sep, name = env_id.partition(":")
    if not sep or is_jax_env(env_id) or is_pettingzoo_id(env_id):
        return None, env_id
    return module, name


def _is_missing(err: ModuleNotFoundError, module: str) -> bool:
    """Whether `module` itself (or a package above it) is what was not found, not a package it imports."""
    return err.name is not None and (module == err.name or module.startswith(err.name + "."))


def import_env_module(module: str, env_id: str) -> set[str]:
    """Import the MODULE of --env MODULE:ID and return the ids its import registered. It is looked up on
    the Python path, then in the current folder: the `reflectrl` script does not put that folder on its
    path, while `python -m reflectrl` (compare's runs) does, and both must find the same module."""
    before = set(gym.registry)
    try:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            here = os.getcwd()
            if not _is_missing(err, module) or here in sys.path or "" in sys.path:
                raise
            sys.path.append(here)  # last: the current folder shadows no installed package
            importlib.import_module(module)
    except ModuleNotFoundError as err:
        if _is_missing(err, module):
            raise UserError(f"env '{env_id}': no module '{module}' to import (its import runs the gym.register "
                            f"of the env): run from the folder that holds {module.replace('.', '/')}.py, add that "
                            "folder to PYTHONPATH, or install its package (pip install -e DIR)") from None
        top = (err.name or "").split(".")[0]
        raise UserError(f"env '{env_id}': module '{module}' needs the package '{top}', which is not installed: "
                        f"{_INSTALL.get(top, f'pip install {top}')}") from None
    except Exception as err:  # the module's own code failed: its first line, as for any env that cannot load
        raise UserError(f"env '{env_id}': importing module '{module}' failed: {type(err).__name__}: "
                        f"{_first_line(err)}") from None
    return set(gym.registry) - before


def registered_id(env_id: str) -> str:
    """The id in Gymnasium's registry that --env names, checked (one line for an unknown one): MODULE:ID
    imports MODULE and gives ID; MODULE:NAME, where MODULE registers no id NAME but has a class or factory
    NAME of an env, registers it as MODULE:NAME (envs/objects.py, the Python API's env objects);
    reflectrl:GridWorld-v0, the JAX spelling, gives reflectrl/GridWorld-v0."""
    env_id = canonical_env_id(env_id, "torch")
    module, name = split_module_id(env_id)
    if module is None:
        _check_env_id(env_id)
        return env_id
    if not module or not name:
        raise UserError(f"env '{env_id}': give MODULE:ID, e.g. my_envs:Corridor-v0 (importing my_envs registers "
                        "Corridor-v0)")
    if env_id in gym.registry:  # MODULE:ATTR or object:LABEL, registered in this process (objects.py)
        return env_id
    if module == OBJECT_MODULE:
        raise UserError(object_env_error(env_id))
    added = import_env_module(module, env_id)
    if name not in gym.registry:
        if register_attribute(module, name, env_id):  # MODULE:ATTR, a class or factory of an env
            return env_id
        close = _similar_ids(name, among=added or None)
        hint = (f"; it registered {', '.join(sorted(added)[:5])}" if added and not close else
                f"; did you mean {module}:{', '.join(close)}?" if close else
                "; does it call gym.register when imported?")
        raise UserError(f"env '{env_id}': importing module '{module}' registered no env '{name}'{hint}")
    return name


_NEW_PROCESS_ERRORS: dict[str, str | None] = {}
"""env id -> the error a new process gives for it (None: it makes it), found once per process."""


def check_new_processes_can_make(env_ids) -> None:
    """Refuse, before anything starts, an --env that this process can make but the runs of compare and
    sweep, each a new process, cannot: an id registered only here (a script's gym.register, then compare
    called from it) or a MODULE:ID whose module a new process cannot import. An id of a known source is
    taken at once; one whose env lives in __main__ is refused at once; any other is tried in one new
    process (the runs' interpreter, folder and environment), about a second."""
    register_gridworld()
    doubtful = []
    for env_id in env_ids:
        if is_jax_env(env_id) or is_pettingzoo_id(env_id) or env_id in _NEW_PROCESS_ERRORS:
            continue
        module, name = split_module_id(env_id)
        spec = gym.registry.get(name)
        source = _entry_module(spec).split(".")[0] if spec is not None else ""
        if module is None and source == "__main__":  # its class is the script's: no new process has it
            _NEW_PROCESS_ERRORS[env_id] = f"unknown env id '{env_id}'"
        elif module is None and source in _NEW_PROCESS_SOURCES:
            _NEW_PROCESS_ERRORS[env_id] = None
        else:
            doubtful.append(env_id)
    if doubtful:
        _NEW_PROCESS_ERRORS.update(_errors_in_a_new_process(doubtful))
    for env_id in env_ids:
        why = _NEW_PROCESS_ERRORS.get(env_id)
        if why is None:
            continue
        if split_module_id(env_id)[0] is not None:
            raise UserError(f"{why} (in a new process: each run of the experiment is one, started in this folder "
                            "with this environment)")
        raise UserError(f"--env {env_id} is registered only in this process (a gym.register that ran here, e.g. in "
                        "your script): each run of the experiment is a new process, which cannot make it; put the "
                        f"gym.register call in a module and pass --env MODULE:{env_id} (the module importable from "
                        "this folder, PYTHONPATH or pip install -e)")


def _errors_in_a_new_process(env_ids: list[str]) -> dict[str, str | None]:
    code = ("import json, sys; from reflectrl.envs import probe_env_ids; "
            "print(json.dumps(probe_env_ids(sys.argv[1:])))")
    try:
        done = subprocess.run([sys.executable, "-c", code, *env_ids], capture_output=True, text=True, timeout=300)
        found = json.loads(done.stdout.strip().splitlines()[-1])  # last: the module may print on import
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}  # the check could not run: each run says what is wrong with its env, as before
    return {env_id: found.get(env_id) for env_id in env_ids if env_id in found}


def probe_env_ids(env_ids: list[str]) -> dict[str, str | None]:
    """(check_new_processes_can_make's new process) each id's one-line error, or None where it is known."""
    out: dict[str, str | None] = {}
    for env_id in env_ids:
        try:
            registered_id(env_id)
            out[env_id] = None
        except UserError as err:
            out[env_id] = str(err)
    return out


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _plain_id(env_id: str) -> str | None:
    """The newest id of the same env outside its namespace (phys2d/CartPole-v1 -> CartPole-v1)."""
    ns, name, _ = parse_env_id(env_id)
    version = find_highest_version(None, name) if ns else None
    return get_env_id(None, name, version) if version is not None else None


def _load_error(env_id: str, err: Exception) -> UserError:
    """One line for an env whose entry point or a package it needs cannot be imported."""
    text = _first_line(err)
    ns, name, version = parse_env_id(env_id)
    if "mujoco_py" in text or "mujoco-py" in text or "mujoco v2 and v3" in text:
        newest = find_highest_version(ns, name)
        use = f"use {get_env_id(ns, name, newest)} instead" if newest and newest != version else "use a -v5 MuJoCo id"
        return UserError(f"env '{env_id}' is not supported: MuJoCo v2/v3 envs need the unmaintained mujoco-py "
                         f"package (moved to gymnasium-robotics); {use} (pip install 'gymnasium[mujoco]')")
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing:
        top = missing.split(".")[0]
        plain = _plain_id(env_id)
        alt = f", or use {plain}" if plain and plain != env_id else ""
        return UserError(f"env '{env_id}' needs the package '{top}', which is not installed: "
                         f"{_INSTALL.get(top, f'pip install {top}')}{alt}")
    if isinstance(err, (ImportError, gym.error.DependencyNotInstalled)):
        return UserError(f"env '{env_id}' needs an extra package: {text}")
    return UserError(f"cannot load env '{env_id}': {type(err).__name__}: {text}")


def _make_error(env_id: str, kwargs: dict[str, Any], err: Exception) -> UserError:
    """One line for an env whose constructor refused the keywords: a --set env.NAME it does not take is
    named as such (a JAX env's knob said to be one), anything else is the constructor's first line."""
    text = _first_line(err)
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", text)
    key = unexpected.group(1) if unexpected else None
    if key in kwargs and key != "render_mode":
        why = JAX_ENV_KNOBS.get(key) or f"drop it{_keywords_of(env_id)}"
        return UserError(f"--set env.{key}: '{env_id}' takes no keyword '{key}': {why}")
    return UserError(f"cannot make env '{env_id}' with {kwargs}: {text}")


def _keywords_of(env_id: str) -> str:
    """", it takes: a, b" for the keywords of an env's constructor, where they can be read ("" otherwise)."""
    import inspect

    try:
        creator = gym.registry[env_id].entry_point
        creator = load_env_creator(creator) if isinstance(creator, str) else creator
        params = inspect.signature(creator).parameters.values()
    except Exception:  # a creator that cannot be inspected: the line goes without the list
        return ""
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "render_mode"]
    return f" (it takes: {', '.join(names)})" if names else " (it takes none)"


_MUJOCO_SEEN: set[str] = set()


def _once_mujoco_warnings() -> None:
    """MuJoCo prints its warnings from C on every model compile (each env of a vector env: the
    same deprecation of Gymnasium's own assets twice and more); route them through Python's
    warnings, each distinct message once."""
    try:
        import mujoco
    except ImportError:
        return
    if getattr(_once_mujoco_warnings, "installed", False):
        return

    def warn(message: str) -> None:
        text = message.strip()
        if text not in _MUJOCO_SEEN:
            _MUJOCO_SEEN.add(text)
            import warnings

            warnings.warn(f"MuJoCo: {text}", stacklevel=2)

    mujoco.set_mju_user_warning(warn)
    _once_mujoco_warnings.installed = True


def _make(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    spec = gym.registry[env_id]
    if isinstance(spec.entry_point, str):
        try:  # an import failure of the entry point, whatever its type, is an install problem
            load_env_creator(spec.entry_point)
        except Exception as err:
            raise _load_error(env_id, err) from None
    rest = kwargs
    if isinstance(spec.entry_point, str) and ".mujoco" in spec.entry_point:
        _once_mujoco_warnings()
    if spec.entry_point == "reflectrl.envs.gridworld:GridWorldEnv" and "max_episode_steps" in kwargs:
        # gym.make would take max_episode_steps for a TimeLimit: the grid world's own limit is its keyword
        spec = dataclasses.replace(spec, kwargs={**spec.kwargs, "max_episode_steps": kwargs["max_episode_steps"]})
        rest = {k: v for k, v in kwargs.items() if k != "max_episode_steps"}
    try:  # from the spec: from the id, gym.make warns that an old id is out of date even when it then fails
        env = gym.make(spec, **rest)
    except (ImportError, gym.error.DependencyNotInstalled) as err:
        raise _load_error(env_id, err) from None
    except (TypeError, ValueError) as err:
        raise _make_error(env_id, kwargs, err) from None
    ns, name, version = parse_env_id(env_id)
    newest = find_highest_version(ns, name)
    if version is not None and newest is not None and newest > version:
        _warn_once("version", env_id, f"'{env_id}' is out of date: consider {get_env_id(ns, name, newest)}")
    return env


def _mission_can_vary(env_id: str, space: gym.Space) -> bool:
    if env_id.startswith("BabyAI-") or type(space).__name__ == "BabyAIMissionSpace":
        return True
    if not hasattr(space, "ordered_placeholders"):  # not MiniGrid's MissionSpace: free text
        return True
    return any(len(values) > 1 for values in space.ordered_placeholders or [])


def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and (
        len(space.shape) == 3 or (len(space.shape) == 2 and space.dtype == np.uint8))


def _is_minigrid(env: gym.Env) -> bool:
    return type(env.unwrapped).__module__.startswith("minigrid.")


is_image_space, is_minigrid, is_atari_id = _is_image, _is_minigrid, atari.is_atari_id  # public names


# multi-agent envs: a PettingZoo parallel env's module, named after this prefix (trainers/mappo/envs.py)
PETTINGZOO_PREFIX = "pettingzoo:"


def is_pettingzoo_id(env_id: str) -> bool:
    return env_id.startswith(PETTINGZOO_PREFIX)


def episode_step_limit(env: gym.Env) -> int | None:
    """The most steps an episode of `env` can last, or None if it has no time limit.

    The smallest of: a `TimeLimit` wrapper's limit, `env.spec.max_episode_steps`, and the
    limit the env applies itself (the built-in grid world's `max_episode_steps`, MiniGrid's
    `max_steps`). A BabyAI level sets its limit on each reset, so before the first reset it
    has none here; `has_time_limit` is True for it all the same.
    """
    limits = []
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, gym.wrappers.TimeLimit):
            limits.append(inner._max_episode_steps)
        inner = inner.env
    spec = getattr(env, "spec", None)
    if spec is not None and spec.max_episode_steps is not None:
        limits.append(spec.max_episode_steps)
    base = env.unwrapped
    if isinstance(base, GridWorldEnv):
        limits.append(base.max_episode_steps)
    elif _is_minigrid(base) and isinstance(getattr(base, "max_steps", None), int):
        limits.append(base.max_steps)
    elif atari.is_atari_env(base):
        limits.append(atari.step_limit(env))
    limits = [int(n) for n in limits if n is not None and n > 0]
    return min(limits) if limits else None


def has_time_limit(env: gym.Env) -> bool:
    """Whether every episode of `env` ends after a bounded number of steps (MiniGrid's always do)."""
    return episode_step_limit(env) is not None or _is_minigrid(env)


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
    keep_image: bool = False,
    learning: bool = True,
) -> gym.Env:
    """Make one env with flat observations, true-return statistics and the reward wrapper.

    `keep_image`: an image observation (and MiniGrid's 7x7x3 view) keeps its shape, for a
    CNN encoder, instead of being flattened. `learning=False`: the env as evaluated, without
    the transforms that are for learning only (Atari's reward clipping).
    """
    gym_id = registered_id(env_id)  # MODULE:ID imports MODULE: its gym.register runs
    try:
        add_reward_wrapper = parse_reward_wrapper(wrapper)
    except ValueError as err:
        raise UserError(str(err)) from None
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        prepare_headless_rendering()
        kwargs["render_mode"] = render_mode
    is_atari = atari.is_atari_id(gym_id)
    if is_atari:  # records its true score itself, below its episodic-life and clipping wrappers
        env = atari.make_atari(_make, gym_id, kwargs, learning=learning)
    else:
        env = _make(gym_id, kwargs)

    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and "image" in space.spaces:
        from minigrid.wrappers import ImgObsWrapper

        mission = space.spaces.get("mission")
        if mission is not None and _mission_can_vary(env_id, mission):
            _warn_once("mission", env_id, f"'{env_id}': the mission text is dropped; the policy sees only the "
                       "image, so tasks whose goal varies by mission cannot be solved from observations")
        env = ImgObsWrapper(env)  # MiniGrid's symbolic view: flattened by default, see the docstring
        space = env.observation_space
    elif _is_image(space) and not keep_image:
        _warn_once("image", env_id, f"'{env_id}': the image observation of shape {space.shape} is flattened "
                   f"into {int(np.prod(space.shape))} inputs of an MLP policy, which is slow and large; "
                   "--set encoder=cnn (the default for image observations) reads it with a CNN")
    if keep_image and _is_image(space):
        pass  # the CNN encoder reads it as it is
    elif not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        try:
            env = gym.wrappers.FlattenObservation(env)
        except Exception:
            raise UserError(f"observation space {space} of '{env_id}' cannot be flattened for an MLP policy") from None
    is_continuous(env.action_space)
    if isinstance(env.action_space, gym.spaces.Box) and len(env.action_space.shape) != 1:
        raise UserError(f"action space {env.action_space} of '{env_id}': only flat (1-D) Box actions are supported")

    if not is_atari:
        env = gym.wrappers.RecordEpisodeStatistics(env)
    if add_reward_wrapper is not None:
        try:
            env = add_reward_wrapper(env)
        except ValueError as err:  # a wrapper that does not fit this env (velocity-cost's speed limit)
            env.close()
            raise UserError(str(err)) from None
    return env


def _make_training_env(env_id, wrapper, env_kwargs, norm_obs, norm_reward, clip_obs, clip_reward, gamma,
                       keep_image=False, wrap=None):
    env = make_env(env_id, wrapper=wrapper, env_kwargs=env_kwargs, keep_image=keep_image)
    if wrap is not None:  # what a trainer adds to each env (hppo's agent cell)
        env = wrap(env)
    # info["state_key"] for the exploration metrics, from the raw observation; SimHash keys are
    # deferred to the trainer, which hashes a rollout's at once (exploration.RolloutKeys)
    env = StateKey(env, env_id, deferred=True)
    if norm_obs:
        env = NormalizeObservation(env)
        env = ClipObservation(env, clip_obs)
    if norm_reward:
        env = NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.ClipReward(env, -clip_reward, clip_reward)
    return env


def make_vector_env(cfg, seed_offset: int = 0, wrap=None) -> gym.vector.SyncVectorEnv:
    """The training envs of a resolved RunConfig, autoresetting in the same step.

    Same-step autoreset returns the next episode's first observation at once and the
    finished episode's last one in `info["final_obs"]`, which is what bootstrapping from the
    value at truncation needs. `backend=envpool`: EnvPool's vector env behind the same
    interface (envpool_backend.py). `wrap`: a wrapper class applied to each env under the
    normalising wrappers (Gymnasium backend only).
    """
    if cfg.backend == "envpool":
        from reflectrl.envs import envpool_backend

        return envpool_backend.make_vector_env(cfg)
    from reflectrl.config import env_settings

    p = env_settings(cfg)
    fn = functools.partial(
        _make_training_env, cfg.env_id, cfg.wrapper, dict(cfg.env), p.norm_obs, p.norm_reward,
        p.clip_obs, p.clip_reward, p.gamma, keep_image=p.encoder == "cnn", wrap=wrap,
    )
    envs = FastSyncVectorEnv([fn] * p.num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    if not has_time_limit(envs.envs[0]):
        _warn_once("time limit", cfg.env_id, f"'{cfg.env_id}' has no time limit, so its episodes may never end "
                   "and no episode return may be logged; add one with --set env.max_episode_steps=N")
    return envs


def find_wrapper(env: gym.Env, cls: type) -> gym.Wrapper | None:
    """The outermost wrapper of type `cls` in an env's chain, or None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None
