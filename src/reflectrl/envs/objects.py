"""An env given to the Python API as an object (`reflectrl.train(algo, env, ...)`): a `gymnasium.Env` instance, a
`VectorEnv`, or a callable that makes an Env. A run names its env by an id that make_env makes, so the object
becomes one (`env_source`), and the env is then made, checked and wrapped as any other:

- where a new process can make the same env again, the id is Gymnasium's `MODULE:ATTR` form with ATTR a class or
  a factory at the top of MODULE, and the constructor's keywords become the run's `env` knobs (--set env.NAME).
  An instance is rebuilt from its class and its keywords: those its spec holds (gym.make), else those it keeps
  as attributes of the same name (scikit-learn's get_params convention; a keyword it does not keep takes its
  default), a TimeLimit around it the keyword max_episode_steps. `functools.partial(f, k=v)` is f with k=v.
  `registered_id` imports MODULE and registers ATTR under the id (`register_attribute`), in this process and in
  any later one (`reflectrl eval`, `--resume`);
- where none can (a lambda, a class or function defined in __main__ or inside a function, an instance with
  wrappers of its own or keywords that are no JSON values), the id is `object:LABEL`, registered in this process
  only: each env is a deep copy of the instance or a call of the factory. Another process refuses the id in one
  line saying why (`object_env_error`); `reflectrl.load(DIR, env=...)` gives it the object again.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import json
import re

import gymnasium as gym

from reflectrl.errors import UserError

OBJECT_MODULE = "object"  # the MODULE part of the ids of objects no other process can rebuild

# Where the ids a new `reflectrl train` process knows come from without being told: Gymnasium's own,
# and those of the packages make_env imports itself (MiniGrid, ale-py) and of reflectrl.
NEW_PROCESS_SOURCES = ("gymnasium", "minigrid", "ale_py", "reflectrl")

# The wrappers gym.make puts around an env, which make_env puts there again
_MAKE_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)


@dataclasses.dataclass(frozen=True)
class EnvSource:
    """What a run records of an env object: the id make_env makes, the constructor's keywords (the run's `env`
    knobs), a VectorEnv's width, and why no other process can make it (None: any can)."""

    env_id: str
    kwargs: dict
    num_envs: int | None = None
    why_not: str | None = None


def entry_module(spec) -> str:
    """The module of a registered env's entry point ("" where it has none)."""
    entry = spec.entry_point
    return entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "") or ""


def env_source(env) -> EnvSource:
    """The id (registered in this process) and keywords that make `env`: a gymnasium.Env, a VectorEnv or a
    callable returning an Env. Each call with a new object registers it anew."""
    if isinstance(env, gym.vector.VectorEnv):
        return _vector_source(env)
    if isinstance(env, gym.Env):
        return _instance_source(env)
    if callable(env):
        return _factory_source(env)
    raise UserError(f"env: a {type(env).__name__} is not an env: give an env id (str), a gymnasium.Env, a "
                    "gymnasium VectorEnv or a callable that returns a gymnasium.Env")


def _vector_source(envs: gym.vector.VectorEnv) -> EnvSource:
    """reflectrl builds its own vector env (same-step autoreset, its wrappers): of the given one it takes the
    single env (a SyncVectorEnv's first, else the spec of gym.make_vec) and the width."""
    inner = getattr(envs, "envs", None)
    if inner:
        source = _instance_source(inner[0])
    elif getattr(envs, "spec", None) is not None and envs.spec.id in gym.registry:
        source = _spec_source(envs.spec) or _object_source(envs.spec.id, gym.registry[envs.spec.id].entry_point,
                                                            "its id is registered only in this process", call=True)
    else:
        raise UserError(f"env: a {type(envs).__name__} without its single envs (a SyncVectorEnv's .envs) or a spec "
                        "(gym.make_vec's): give the env id, one env or a callable making one, and num_envs=N")
    return dataclasses.replace(source, num_envs=int(envs.num_envs))


def _instance_source(env: gym.Env) -> EnvSource:
    spec = env.spec
    own = _own_wrappers(env, spec is not None)
    if not own and spec is not None and not spec.additional_wrappers:
        found = _spec_source(spec, type(env.unwrapped))
        if found is not None:
            return found
    limit = _time_limit(env) if spec is None else None
    if limit is not None:  # TimeLimit(env, N): the class with env.max_episode_steps=N, which make_env wraps so
        own.remove("TimeLimit")
    if own:
        why = f"it is wrapped in {', '.join(own)}, which rebuilding its class would leave out"
    else:
        cls = type(env.unwrapped)
        kwargs, why = _kept_keywords(env.unwrapped)
        if limit is not None:
            kwargs["max_episode_steps"] = limit
        if why is None:
            where, why = _importable(cls)
            if why is None and _rebuilt_differs(cls, {k: v for k, v in kwargs.items() if k != "max_episode_steps"},
                                                env):
                why = (f"{cls.__name__}({_call_text(kwargs)}) has other spaces than the instance: a keyword of its "
                       "constructor is not kept as an attribute of the same name")
            if why is None:
                return _attribute_source(where, cls, kwargs)
    return _object_source(_label(type(env.unwrapped)), env, why, call=False)


def _factory_source(factory) -> EnvSource:
    kwargs: dict = {}
    target = factory
    if isinstance(factory, functools.partial) and not factory.args:
        target, kwargs = factory.func, dict(factory.keywords)
    why = _json_why(kwargs)
    where, why_import = _importable(target)
    why = why or why_import
    if why is None:
        return _attribute_source(where, target, kwargs)
    return _object_source(_label(target), factory, why, call=True)


def _spec_source(spec, cls: type | None = None) -> EnvSource | None:
    """An instance of gym.make (its spec): the id itself where a new process knows it, else its entry point's
    MODULE:ATTR form; None where neither can make it."""
    registered = gym.registry.get(spec.id)
    kwargs = {k: v for k, v in spec.kwargs.items() if k not in _NOT_CONSTRUCTOR_KEYWORDS}
    steps = spec.kwargs.get("max_episode_steps", spec.max_episode_steps)
    spec = dataclasses.replace(spec, max_episode_steps=steps)
    if registered is not None and entry_module(registered).split(".")[0] in NEW_PROCESS_SOURCES:
        kwargs = {k: v for k, v in kwargs.items() if registered.kwargs.get(k, _MISSING) != v}
        if spec.max_episode_steps != registered.max_episode_steps and spec.max_episode_steps is not None:
            kwargs["max_episode_steps"] = spec.max_episode_steps
        return EnvSource(spec.id, kwargs) if _json_why(kwargs) is None else None
    if spec.max_episode_steps is not None:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    entry = spec.entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        try:
            entry = _resolve(module, name)
        except Exception:  # an entry point that does not import: the object itself is trained
            return None
    target = entry if entry is not None else cls
    where, why = _importable(target)
    if why is None and _json_why(kwargs) is None:
        return _attribute_source(where, target, kwargs)
    return None


_MISSING = object()
# what gym.make and gym.make_vec put into a spec's kwargs beside the constructor's keywords
_NOT_CONSTRUCTOR_KEYWORDS = ("render_mode", "max_episode_steps", "num_envs", "vectorization_mode", "vector_kwargs",
                             "wrappers")


def _own_wrappers(env: gym.Env, made: bool) -> list[str]:
    """The wrappers around `env` other than gym.make's own (`made`: it has a spec; make_env wraps it so again)."""
    names = []
    while isinstance(env, gym.Wrapper):
        if not (made and isinstance(env, _MAKE_WRAPPERS)):
            names.append(type(env).__name__)
        env = env.env
    return names


def _time_limit(env: gym.Env) -> int | None:
    """The step limit of the one TimeLimit wrapper of an instance made without gym.make (None: none, or several)."""
    limits = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            limits.append(env._max_episode_steps)
        env = env.env
    return limits[0] if len(limits) == 1 else None


def _kept_keywords(env: gym.Env) -> tuple[dict, str | None]:
    """The constructor keywords an instance keeps as attributes of the same name (those it does not keep take
    their defaults), or why it cannot be rebuilt from them."""
    try:
        params = inspect.signature(type(env)).parameters.values()
    except (TypeError, ValueError):
        return {}, f"the signature of {type(env).__name__}'s constructor cannot be read"
    kwargs = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "render_mode":
            continue
        if hasattr(env, p.name):
            kwargs[p.name] = getattr(env, p.name)
        elif p.default is p.empty:
            return {}, (f"its constructor's '{p.name}' has no default and is not kept as an attribute "
                        f"'{p.name}' (the instance's class cannot be called again without it)")
    return kwargs, _json_why(kwargs)


def _json_why(kwargs: dict) -> str | None:
    """Why the keywords cannot be written to config.json (None: each is a JSON value that reads back equal)."""
    for key, value in kwargs.items():
        try:
            same = json.loads(json.dumps(value)) == (list(value) if isinstance(value, tuple) else value)
        except (TypeError, ValueError):
            same = False
        if not same:
            return f"its keyword '{key}' holds a {type(value).__name__}, not a JSON value config.json can keep"
    return None


def _importable(target) -> tuple[str, str | None]:
    """(MODULE:QUALNAME, None) where importing MODULE gives `target` back under QUALNAME; else ("", why not)."""
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not module or not qualname:
        return "", f"a {type(target).__name__} has no module and name to import it by"
    if "<lambda>" in qualname:
        return "", f"{module}.{qualname} is a lambda"
    if "<locals>" in qualname:
        return "", f"{module}.{qualname.replace('<locals>.', '')} is defined inside a function"
    if module == "__main__":
        return "", f"{qualname} is defined in __main__ (the script run), which no other process imports"
    try:
        found = _resolve(module, qualname)
    except Exception as err:
        return "", f"importing {module}.{qualname} fails ({type(err).__name__})"
    if found is not target:
        return "", f"importing {module}.{qualname} gives another object"
    return f"{module}:{qualname}", None


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _rebuilt_differs(cls: type, kwargs: dict, env: gym.Env) -> bool:
    try:
        fresh = cls(**kwargs)
    except Exception:
        return True
    try:
        return fresh.observation_space != env.observation_space or fresh.action_space != env.action_space
    finally:
        fresh.close()


def _call_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _attribute_source(where: str, target, kwargs: dict) -> EnvSource:
    if where not in gym.registry:
        gym.register(where, entry_point=target)
    return EnvSource(where, dict(kwargs))


def register_attribute(module: str, name: str, env_id: str) -> bool:
    """(registered_id) Register the class or factory NAME of an imported MODULE under `env_id` (MODULE:NAME);
    False where MODULE has no callable NAME."""
    try:
        target = _resolve(module, name)
    except (AttributeError, ImportError):
        return False
    if not callable(target) or isinstance(target, type) and not issubclass(target, gym.Env):
        return False
    gym.register(env_id, entry_point=target)
    return True


# --------------------------------------------------------------------------- objects only this process has

_OBJECTS: dict[str, object] = {}
"""object:LABEL id -> the object it was registered for, in this process."""


def _label(target) -> str:
    text = f"{getattr(target, '__module__', '') or ''}.{getattr(target, '__qualname__', type(target).__name__)}"
    return re.sub(r"[^\w.-]", "", text.replace("<locals>", "locals").replace("<lambda>", "lambda")).strip(".")


def _object_source(label: str, obj, why: str, call: bool) -> EnvSource:
    """Register `obj` under a new object:LABEL id of this process: each env made a deep copy of an instance
    (call=False) or the result of calling a factory (call=True)."""
    env_id, n = f"{OBJECT_MODULE}:{label}", 1
    while env_id in _OBJECTS and _OBJECTS[env_id] is not obj:
        n += 1
        env_id = f"{OBJECT_MODULE}:{label}_{n}"
    _OBJECTS[env_id] = obj

    def make(**kwargs):
        kwargs.pop("render_mode", None)  # an object is made as it is (no video of it)
        if not call:
            if kwargs:
                raise TypeError(f"unexpected keyword argument '{next(iter(kwargs))}'")
            return copy.deepcopy(obj)
        return obj(**kwargs)

    gym.register(env_id, entry_point=make)
    return EnvSource(env_id, {}, why_not=why)


def register_object(env_id: str, obj) -> None:
    """Give an object:LABEL id of a saved run its object again in this process (reflectrl.load(DIR, env=...))."""
    if _OBJECTS.get(env_id) is obj:
        return
    source = env_source(obj)
    spec = gym.registry[source.env_id]
    kwargs = {**spec.kwargs, **source.kwargs}
    steps = kwargs.pop("max_episode_steps", spec.max_episode_steps)
    gym.registry.pop(env_id, None)
    gym.register(env_id, entry_point=spec.entry_point, kwargs=kwargs, max_episode_steps=steps)
    _OBJECTS[env_id] = obj


def object_env_error(env_id: str) -> str:
    """The line for an object:LABEL id in a process that does not have the object."""
    label = env_id.split(":", 1)[1]
    what = ("a lambda" if label.endswith("lambda") else
            "defined in the script run (__main__)" if label.startswith("__main__.") else
            "defined inside a function" if ".locals." in f".{label}" else "not importable by its name")
    return (f"env '{env_id}' was an object given to reflectrl.train ({what}), which no other process can make: "
            "evaluate or resume the run in Python with reflectrl.load(DIR, env=THE_ENV), or train a class or factory "
            "defined at the top of an importable module (recorded as MODULE:NAME, which every command makes)")
