"""Run configuration: dataclasses with one name per knob, `--set key=value` parsing, validation.

A run's config holds the run knobs (`checkpoint_every`, ...), its trainer's knobs (`knobs`: the
dataclass its TrainerSpec names, e.g. PPOConfig; also reachable as `cfg.NAME` by the trainer's name)
and its signals' sections. No trainer is named here: each is read from the registry.

`--set` keys: a bare name sets a knob of the run's trainer or a run knob (`num_envs=8`,
`checkpoint_every=10000`); `env.NAME=VALUE` passes a keyword to the env's constructor;
`TRAINER.NAME=VALUE` a knob of the run's trainer; `SECTION.NAME=VALUE` a knob of a signal's section.
The same knobs may follow a part of the --algo in brackets, `ppo+calibration[mode=uncertainty]`
(split_algo: one grammar for every command).

A command line is read by `new_config`, which checks all that needs no env (check_config) from the
config dataclasses and the registry alone, importing no torch, JAX or env package: a bad one is refused
in about the time of `--help`. trainers/resolve.py then probes the env and checks the rest.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from reflectrl import overrides as overrides_mod
from reflectrl.errors import UserError
from reflectrl.registry import (
    DEFAULT_TRAINER,
    TRAINERS,
    aliases,
    check_sections,
    parse_algo,
    section_types,
    signal_spec,
    trainer_spec,
)


def __getattr__(name: str):
    # the lists the project started with, now read from the registry
    if name == "SECTION_TYPES":
        return section_types()
    if name == "ALGOS":
        return tuple(aliases("control"))
    if name == "ALGO_SECTIONS":
        return {a: comp.split("+")[1] for a, comp in aliases("control").items() if "+" in comp}
    raise AttributeError(name)


ENCODERS = ("auto", "mlp", "cnn")
BACKENDS = ("gymnasium", "envpool", "jax")


@dataclass(frozen=True)
class EnvSettings:
    """What building a run's training envs reads of its trainer's knobs (each trainer's config gives
    its own: `env_settings()`)."""

    num_envs: int
    norm_obs: bool
    norm_reward: bool
    clip_obs: float
    clip_reward: float
    gamma: float
    encoder: str


@dataclass
class RunConfig:
    algo: str = DEFAULT_TRAINER["control"]
    """the trainer and its signals, TRAINER[+SIGNAL...] or an alias such as refgrpo (--algo)"""
    env_id: str = "reflectrl/GridWorld-v0"
    """Gymnasium env id (--env)"""
    seed: int = 1
    """random seed (--seed)"""
    total_steps: int = 100_000
    """env steps to train for (--total-steps)"""
    wrapper: str | None = None
    """env wrapper: sparse, delayed:K, velocity-cost[:V] (a cost channel) or mask_velocity (the velocities hidden: a
    memory task), or several joined by commas (--wrapper)"""
    env: dict[str, Any] = field(default_factory=dict)
    """keywords for the env's constructor (--set env.NAME=VALUE)"""
    checkpoint_every: int = 50_000
    """env steps between checkpoints"""
    torch_threads: int = 1
    """torch's intra-op threads"""
    backend: str = "gymnasium"
    """training envs: gymnasium, envpool (EnvPool's C++ vector envs for Atari and MiniGrid: the envpool extra), or
    jax (PPO and its signals compiled end to end on gymnax:, navix:, xminigrid:, craftax: envs and
    reflectrl:GridWorld-v0: the jax extra; docs/jax.md)"""
    envpool_threads: int = 0
    """EnvPool's worker threads with backend=envpool (0: EnvPool's default, min(num_envs, cores))"""
    state_map_snapshots: int = 5
    """points of training whose visited states, rewards and signal terms are kept for `plot state-map`"""
    cost_limit: float = 25.0
    """the limit on the expected episode cost (info["cost"]) that constrained algos keep to (ppo_lag, shaping's
    safety term); also what `cost_limit_violations` counts against"""
    knobs: Any = None
    """the trainer's knobs (its TrainerSpec's config class; None: its defaults, made on first use); config.json
    holds them under the trainer's name"""
    sections: dict[str, Any] = field(default_factory=dict)
    """the signals' knobs, by section"""

    # cfg.ppo, cfg.dqn, ...: the run's trainer's knobs by its name (None for any other trainer)
    def __getattr__(self, name: str):
        spec = TRAINERS.get(name)
        if spec is None or spec.family != "control" or name.startswith("_"):
            raise AttributeError(name)
        return trainer_knobs(self) if trainer_name(self) == name else None

    def __setattr__(self, name: str, value) -> None:
        if name in TRAINERS and name not in RunConfig.__dataclass_fields__:
            if trainer_name(self) != name:
                raise AttributeError(f"a run of --algo {self.algo} has no {name} knobs")
            name = "knobs"
        object.__setattr__(self, name, value)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("knobs")
        sections = d.pop("sections")
        knobs = dataclasses.asdict(trainer_knobs(self))
        d[trainer_name(self)] = {k: list(v) if isinstance(v, tuple) else v for k, v in knobs.items()}
        d["sections"] = sections
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        names = tuple(t.name for t in TRAINERS.values() if t.family == "control")
        check_saved_config(d, cls, REQUIRED_KEYS, "reflectrl train", optional_sections=names)
        d = dict(d)
        algo = d.get("algo")
        trainer = parse_algo(algo, "control").trainer if isinstance(algo, str) else None
        values = {name: d.pop(name) for name in names if name in d}  # a section of another trainer: an older
        own = values.get(trainer)                                   # reflectrl wrote PPO's into every run
        if trainer == DEFAULT_TRAINER["control"] and own and "stream_heads" not in own:
            own = {**own, "stream_heads": "separate"}  # written before the knob: its heads were separate
        knobs = overrides_mod.from_dict(TRAINERS[trainer].config_class(), own) if own is not None else None
        sections = sections_from_dict(d.pop("sections", {}))
        known = {f.name for f in dataclasses.fields(cls)} - {"knobs"}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"config has unknown keys {sorted(unknown)}; was it written by a newer reflectrl?")
        return cls(**d, knobs=knobs, sections=sections)


# what every saved config of `reflectrl train` holds (to_dict writes them all): a file without them
# was not written by it, and filling them with defaults would rebuild some other run's network
REQUIRED_KEYS = ("algo", "env_id")


def check_saved_config(d, cls, required: tuple[str, ...], command: str,
                       optional_sections: tuple[str, ...] = ()) -> None:
    """One line, not a traceback, for a saved config of the wrong shape: not an object, keys
    its writer always writes missing, or a section (a field with a default factory, or one of
    `optional_sections`) that is not an object."""
    if not isinstance(d, dict):
        raise UserError(f"the saved config is a JSON {type(d).__name__}, not the object '{command}' writes")
    missing = [k for k in required if k not in d]
    if missing:
        raise UserError(f"the saved config lacks {', '.join(missing)}: it was not written by '{command}' "
                        "(train the run again)")
    nested = {f.name for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING}
    for key in sorted((nested | set(optional_sections)) & set(d)):
        if d[key] is not None and not isinstance(d[key], dict):
            raise UserError(f"the saved config's '{key}' is a JSON {type(d[key]).__name__}, not an object: it was "
                            f"not written by '{command}' (train the run again)")


def sections_from_dict(values: dict) -> dict:
    """The signals' knob sections of a saved config, as their dataclasses."""
    types = section_types()
    sections = {}
    for name, knobs in values.items():
        if name not in types:
            raise UserError(f"config has an unknown section '{name}'; was it written by a newer reflectrl?")
        sections[name] = overrides_mod.from_dict(types[name], knobs)
    return sections


_dataclass_from_dict = overrides_mod.from_dict  # the name other modules used


RUN_KNOBS = ("checkpoint_every", "torch_threads", "backend", "envpool_threads", "state_map_snapshots", "cost_limit")
EVAL_MAX_STEPS = 10_000  # `eval`'s cap on an episode's steps when the env has no time limit
SEED_MAX = 2**32 - 1     # numpy's and Gymnasium's seeds are unsigned 32-bit integers



def trainer_name(cfg: RunConfig) -> str:
    """The trainer a control run's --algo names."""
    return parse_algo(cfg.algo, "control").trainer


def trainer_knobs(cfg: RunConfig):
    """The run's trainer's knobs (made with their defaults on first use)."""
    if cfg.knobs is None:
        object.__setattr__(cfg, "knobs", TRAINERS[trainer_name(cfg)].config_class()())
    return cfg.knobs


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `--set key=value` strings to a config, in order (routing: overrides.py). Bare
    names go to the run's trainer's knobs, then to the run knobs."""
    _apply(cfg, overrides)
    return cfg


def _apply(cfg: RunConfig, overrides: list[str]) -> list[tuple[Any, str]]:
    """apply_overrides, saying what each item set (overrides.apply)."""
    types = section_types()
    sections = {name: (lambda name=name: cfg.sections.setdefault(name, types[name]())) for name in types}
    own = trainer_knobs(cfg)
    trainer = trainer_name(cfg)

    def refuse(name):
        def knobs():
            raise UserError(f"--set {name}.* knobs apply to --algo {name}, not --algo {cfg.algo}")
        return knobs

    prefixed = {name: (own if name == trainer else refuse(name))
                for name, spec in TRAINERS.items() if spec.family == "control"}
    return overrides_mod.apply(overrides, bare=[(trainer.upper(), own, None), ("run", cfg, RUN_KNOBS)],
                               prefixed={"env": cfg.env, **prefixed, **sections})


# ------------------------------------------------------------------ an --algo's knobs in brackets

def split_top_level(text: str, sep: str = ",", what: str = "--algos") -> list[str]:
    """Split on `sep` where it is not inside brackets."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"{what} '{text}': unbalanced ']'")
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise UserError(f"{what} '{text}': unbalanced '['")
    parts.append("".join(current))
    return [p.strip() for p in parts]


def algo_knob(section: str | None, item: str, signal_first: bool, trainer: str,
              run_knobs: tuple[str, ...] = RUN_KNOBS) -> str:
    """A bare key in an --algo's brackets as a --set item: a knob of `section` (a signal) or a knob of
    the trainer or the run (`run_knobs`). In a signal's own brackets (`signal_first`) its knob wins."""
    key = item.split("=", 1)[0].strip()
    if "." in key or section is None:
        return item.strip()
    own = {f.name for f in dataclasses.fields(signal_spec(section).config)}
    general = key in {f.name for f in dataclasses.fields(TRAINERS[trainer].config_class())} or key in run_knobs
    if (signal_first and key in own) or not general:
        return f"{section}.{item.strip()}"
    return item.strip()


def split_algo(text: str, family: str = "control", run_knobs: tuple[str, ...] = RUN_KNOBS,
               what: str = "--algo") -> tuple[str, tuple[str, ...]]:
    """An --algo with knobs in brackets, TRAINER[key=v;...]+SIGNAL[key=v;...]... (or ALIAS[...]): the algo
    without them, and the --set items they stand for, in order. `ppo+calibration[mode=uncertainty]` ->
    ("ppo+calibration", ("calibration.mode=uncertainty",)). In a signal's brackets a bare key is its knob
    where it has one, else a knob of the trainer or the run; in the trainer's, a knob of the trainer or
    the run, else (an alias's) of its one signal: `refgrpo[alpha=0]` is calibration.alpha. One grammar
    for every command that takes an algo: train, llm train, compare's entries, sweep, knobs."""
    if "[" not in text and "]" not in text:
        return text, ()
    names, brackets = [], []
    for part in split_top_level(text, "+", what):
        m = re.fullmatch(r"([A-Za-z0-9_-]+)(?:\[(.*)\])?", part)
        if not m:
            raise UserError(f"{what} '{text}' is not ALGO[key=value;...] or TRAINER[...]+SIGNAL[...]... "
                            "(e.g. ppo+calibration[mode=uncertainty])")
        items = [kv.strip() for kv in (m.group(2) or "").split(";") if kv.strip()]
        bad = next((kv for kv in items if "=" not in kv), None)
        if bad is not None:
            raise UserError(f"{what} '{text}': '{bad}' is not key=value")
        names.append(m.group(1))
        brackets.append(items)
    algo = "+".join(names)
    parsed = parse_algo(algo, family)  # unknown names, signals a trainer cannot run: one line
    first = parse_algo(names[0], family)  # an alias's bare keys go to its one signal
    section = first.signals[0] if len(first.signals) == 1 and len(names) == 1 else None
    knobs = [algo_knob(section, kv, False, parsed.trainer, run_knobs) for kv in brackets[0]]
    for name, items in zip(names[1:], brackets[1:]):
        knobs += [algo_knob(name, kv, True, parsed.trainer, run_knobs) for kv in items]
    return algo, tuple(knobs)


# ------------------------------------------------------------------ a new run's config, before its env

def new_config(*, algo: str | None = None, env_id: str | None = None, seed: int | None = None,
               total_steps: int | None = None, wrapper: str | None = None,
               overrides: list[str] | None = None) -> RunConfig:
    """A new run's config from what a command line gave (None: RunConfig's default), checked as far as it
    can be without its env (check_config). The --algo's bracket knobs apply first, then --set; a knob
    given both ways with different values is refused. Imports no torch, JAX or env package, so a bad
    command line is refused in about the time of `--help` (bench/refusal_time.py); the env is probed,
    and the rest checked, by trainers/resolve.py's resolve_config."""
    text = algo or RunConfig.algo
    algo, from_algo = split_algo(text)
    given = dict(env_id=env_id, seed=seed, total_steps=total_steps, wrapper=wrapper)
    cfg = RunConfig(algo=algo, **{k: v for k, v in given.items() if v is not None})
    overrides_mod.apply_after_algo(lambda items: _apply(cfg, items), list(from_algo), list(overrides or []), text)
    check_config(cfg)
    return cfg


def check_config(cfg: RunConfig) -> None:
    """Every check of a config that needs no env: the seed, the budget, the run knobs, the signals'
    sections (their 'auto' knobs resolved for the trainer), that the trainer has a form on the run's
    backend (registry.trainer_spec) and what that form refuses (its TrainerSpec.check). The trainer's
    knobs are checked once resolved for the env."""
    algo = parse_algo(cfg.algo, "control")
    check_seed(cfg.seed)
    check_budget(cfg.total_steps, "--total-steps", "env steps")
    _validate_run_knobs(cfg)
    validate_sections(cfg.algo, algo, cfg.sections)
    spec = trainer_spec(algo.trainer, cfg.backend)
    if spec.check:
        spec.load("check")(cfg)


def env_settings(cfg: RunConfig) -> EnvSettings:
    return trainer_knobs(cfg).env_settings()


# --------------------------------------------------------------------------- validation

def finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise UserError(f"{name}={value} must be a finite number")



# The largest budget a run takes: 10^12 env steps is about 12 days at a million steps per second and
# 30 years at a thousand, and far inside the int64 counters every log and checkpoint keeps.
MAX_BUDGET = 10**12


def check_budget(value: int, flag: str, unit: str) -> None:
    if value <= 0:
        raise UserError(f"{flag} {value}: must be a positive integer")
    if value > MAX_BUDGET:
        raise UserError(f"{flag} {value}: above the limit of 10^12 {unit} (about 12 days at a million per second, "
                        "years on one machine); give a budget a run can finish")


def check_seed(seed: int, flag: str = "--seed") -> None:
    if not 0 <= seed <= SEED_MAX:
        raise UserError(f"{flag} {seed}: must be between 0 and 2**32 - 1 ({SEED_MAX})")


def validate(cfg: RunConfig) -> None:
    """Check a resolved config; raise UserError naming the first bad value and the fix."""
    algo = parse_algo(cfg.algo, "control")
    check_seed(cfg.seed)
    check_budget(cfg.total_steps, "--total-steps", "env steps")
    _validate_run_knobs(cfg)
    trainer_knobs(cfg).validate(cfg.total_steps)
    validate_sections(cfg.algo, algo, cfg.sections, run=cfg)


def _validate_run_knobs(cfg: RunConfig) -> None:
    if cfg.checkpoint_every < 1:
        raise UserError(f"checkpoint_every={cfg.checkpoint_every}: must be a positive number of env steps")
    if cfg.torch_threads < 1:
        raise UserError(f"torch_threads={cfg.torch_threads}: must be >= 1")
    if cfg.state_map_snapshots < 0:
        raise UserError(f"state_map_snapshots={cfg.state_map_snapshots}: must be >= 0 (0 keeps none)")
    if cfg.envpool_threads < 0:
        raise UserError(f"envpool_threads={cfg.envpool_threads}: must be >= 0 (0: EnvPool's default)")
    if not (math.isfinite(cfg.cost_limit) and cfg.cost_limit >= 0):
        raise UserError(f"cost_limit={cfg.cost_limit}: must be a finite number >= 0 (an episode's cost budget)")
    if cfg.backend not in BACKENDS:
        raise UserError(f"backend='{cfg.backend}': use one of {', '.join(BACKENDS)}")


# ------------------------------------------------------------------ a signal's knobs, checked once

# A run's config check validates each signal's knob section, then its trainer builds the signals
# from those very sections; a signal built by hand is validated when it is built. So that a
# section is validated once either way, a validate() that passed is remembered (by the section's
# id, with the values it passed on: a section changed since is validated again).
_PASSED: dict[int, tuple] = {}


def _values(config) -> tuple:
    return copy.deepcopy(tuple(getattr(config, f.name) for f in dataclasses.fields(config)))


def remember_valid(config) -> None:
    """Record that `config`, as it is now, is valid (forgotten when it is garbage: ids are reused)."""
    key = id(config)
    if key not in _PASSED:
        try:
            weakref.finalize(config, _PASSED.pop, key, None)
        except TypeError:  # no weak references to it (__slots__): not remembered, validated each time
            return
    _PASSED[key] = _values(config)


def passed(config) -> bool:
    """Whether `config`, as it is now, passed its validate()."""
    return _PASSED.get(id(config)) == _values(config)


def checked_once(cls: type) -> type:
    """Class decorator of a signal's knob dataclass: a validate() that passes is remembered, and
    `validate_once` does not run it again on the same values."""
    check = cls.validate

    @functools.wraps(check)
    def validate(self, *args, **kwargs):
        check(self, *args, **kwargs)
        remember_valid(self)

    cls.validate = validate
    return cls


def validate_once(config) -> None:
    """`config.validate()`, unless this config passed it already with the values it has now."""
    if not passed(config):
        config.validate()


def validate_sections(text: str, algo, sections: dict, run=None) -> None:
    """The knob sections of an algo's signals: none for a signal it does not run, each valid,
    and each asking only for what the trainer provides."""
    check_sections(algo, sections, text)
    for name in algo.signals:
        section = sections.setdefault(name, signal_spec(name).config())  # kept: its resolved knobs are saved
        validate_once(section)  # (checked as the command line was read, unchanged since: not again)
        signal_spec(name).check(section, algo.trainer, text, run=run)


def add_algo_section(cfg: RunConfig, family: str = "control") -> None:
    """Record every knob of the algo's signals (defaults included) in the config."""
    for name in parse_algo(cfg.algo, family).signals:
        cfg.sections.setdefault(name, signal_spec(name).config())
