"""The registry: which trainers and signals exist, what each needs and supports, and how an
`--algo` is read. Everything that lists or checks algos (config validation, building the
signals, the CLI's help, `compare`'s entries, `reflectrl knobs`, the README's table) reads
it; nothing else keeps a list of them. It holds the machinery only: each trainer and signal
registers itself where it lives, and the registry names no module above it.

A signal registers itself in its package, reflectrl/signals/NAME/__init__.py (its knobs and
`register_signal(SignalSpec(...))`, importing no torch or JAX, so that checking a command line
needs neither), beside its torch form (NAME/torch.py) and its JAX form (NAME/jax.py) where it
has one. A trainer registers itself in its package's __init__ (reflectrl/trainers/NAME/), with
`register_trainer(TrainerSpec(...))` naming its parts by module path, once per backend form: the
JAX PPO (trainers/ppo_jax/) is the form of `ppo` that trains on backend=jax. The built-in ones are
loaded as Gymnasium loads its envs: `import reflectrl` imports reflectrl.trainers and
reflectrl.signals, whose __init__ import each package's registration. A signal from outside this
package is a module named by an entry point in the group `reflectrl.signals` (loaded on the
first look-up of the signals), or any module that calls register_signal.

`--algo` is TRAINER[+SIGNAL...]: `ppo`, `ppo+gear`, `ppo+calibration+gear`, `grpo+gear`.
Signals apply in the order written (see signals/base.py for how their outputs combine).
The names the project started with stay as aliases: `refgrpo` = `ppo+calibration` (under
`llm train`: `grpo+calibration`), `sdrs` = `ppo+shaping`, `gear` = `ppo+gear` (`grpo+gear`).
Any part may carry knobs in brackets, `ppo+calibration[mode=uncertainty]`: config.split_algo reads
them, for every command that takes an algo.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from reflectrl.errors import UserError

# What a signal may ask of its trainer: the policy's features (with gradients), s' of each step,
# the exploration state keys of each step (Batch.state_keys), value heads on its own reward streams,
# the policy's next-token distributions and a ground-truth-conditioned teacher's (Batch.teacher_fn),
# the env's per-step costs (Batch.costs, from info["cost"]: envs/cost.py), the current policy's actions on
# any observations (Batch.act_fn: imagined rollouts), a multi-agent team's rewards and value (Batch.team_rewards,
# Batch.team_value_fn: per-agent signals distilled from the team).
# Each, in the words a refusal uses:
WANT_TEXT = {
    "features": "the policy's hidden features",
    "feature_grad": "gradients through the policy's features (a shared trunk)",
    "next_obs": "each step's next observation",
    "state_keys": "a key per visited state (the exploration state keys)",
    "value_stream": "a value head of its own beside the policy's (for its intrinsic return)",
    "teacher": "a ground-truth-conditioned teacher's token distributions",
    "costs": "the env's per-step costs (info['cost'])",
    "policy": "the current policy's actions on any observation (imagined rollouts)",
    "team": "a team's rewards and value (multi-agent)",
}
WANTS = tuple(WANT_TEXT)
# What one step of a signal's batch is: an env step, a generated token, an agent turn, or a
# transition a replay trainer sampled from its buffer (at learning time, out of trajectory order);
# each in the words a refusal uses.
STEP_TEXT = {"env_step": "env steps", "token": "generated tokens", "turn": "agent turns",
             "transition": "replayed transitions"}
STEP_KINDS = tuple(STEP_TEXT)


def wants_text(wants) -> str:
    return ", ".join(f"{WANT_TEXT.get(w, w)} [{w}]" for w in sorted(wants))


@dataclass(frozen=True)
class SignalSpec:
    name: str                          # its name in --algo (ppo+NAME) and its --set section (NAME.KNOB)
    config: type                       # the knob dataclass: every default lives there
    factory: Callable | str            # factory(config) -> Signal, or "module:attribute" naming it (imported
                                       # when a run builds the signal: checking its knobs imports no torch)
    step_kinds: tuple[str, ...]        # the step kinds it can work on, in order of preference
    summary: str                       # one line: what it does
    wants: frozenset | Callable = frozenset()  # what it needs from the trainer (WANTS), or config -> that set
    aliases: dict = field(default_factory=dict)  # {family: the legacy algo name of its DEFAULT_TRAINER+NAME}
    neutral: str = ""                  # the knob setting under which it changes nothing, e.g. "alpha=0"
    step_checks: dict = field(default_factory=dict)  # {step kind: check(config) raising UserError}: what its
                                                     # knobs must be where it works on that kind of step
    run_check: Callable | None = None  # check(config, the run's whole config) raising UserError: what its
                                       # knobs need of the rest of the run (e.g. the policy's encoder)
    on_finish: dict | str = field(default_factory=dict)  # {step kind: "module:function(run_dir)"} (or one for all)
    refusals: dict = field(default_factory=dict)  # {step kind it cannot work on: why} (said when refused)
    task_options: dict = field(default_factory=dict)  # what it needs of an LLM task, e.g. {"reflect": "verdict"}
    resolve: Callable | None = None    # resolve(config, provides): set its 'auto' knobs to what the trainer gives
    jax: str = ""                      # "module:Class" of its JAX form (signals/jax_base.py), "" where it has none
    jax_torch_only: Callable | None = None  # config -> [(refused, knob as said, why)]: knobs only its torch form runs

    def __post_init__(self):
        if isinstance(self.factory, str):
            object.__setattr__(self, "factory", _imported(self.factory))

    def __hash__(self):
        return hash(self.name)

    def wants_for(self, config) -> set:
        return set(self.wants(config) if callable(self.wants) else self.wants)

    def check(self, config, trainer: str, text: str, run=None) -> None:
        """Resolve the config's 'auto' knobs for the trainer, then one line naming what this
        signal, so configured, needs and the trainer lacks."""
        if self.resolve is not None:
            self.resolve(config, TRAINERS[trainer].provides)
        missing = self.wants_for(config) - set(TRAINERS[trainer].provides)
        if missing:
            raise UserError(f"--algo {text}: the {self.name} signal, as configured, needs "
                            f"{wants_text(missing)}, which trainer '{trainer}' does not provide; "
                            + _where_it_runs(self, missing))
        kind = _step_kind(self, TRAINERS[trainer])
        if kind in self.step_checks:
            self.step_checks[kind](config)
        if self.run_check is not None and run is not None:
            self.run_check(config, run)


def _imported(target: str) -> Callable:
    """A function named as "module:attribute", imported on its first call."""
    module, _, attr = target.partition(":")

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.target = target  # what it stands for (two registrations of one signal name the same target)
    return call


@dataclass(frozen=True)
class TrainerSpec:
    """A trainer, in one of its backend forms: what it gives signals, and where its parts are. The parts
    are named as "module:attribute" and imported on first use, so listing or checking algos imports no
    trainer. A trainer with forms on several backends registers each (same name and family): the form
    registered first holds the trainer's knobs and what it gives signals, which a later form may leave
    empty to share (`ppo` on backend=jax reads PPOConfig and gives signals what `ppo` gives them).

    backends      the env backends (config.BACKENDS) this form trains on; `registry.trainer_spec(name,
                  backend)` finds the form of a run
    config        its knob dataclass (the run's `knobs`: --set NAME.KNOB or bare names, config.json's NAME
                  section), with validate(total_steps) and env_settings() (what building its envs reads)
    resolve       resolve(cfg) -> cfg: the env-dependent defaults filled in (by probing the env) and the
                  trainer's own refusals (e.g. continuous actions for dqn); the shared checks follow it
    check         check(cfg): its refusals that need no env (e.g. a knob this form does not run), made as the
                  command line is read, before torch, JAX or an env package is imported
    entry         the trainer class: Trainer(cfg, run) runs the train loop (trainers/base.py); the object
                  has train(progress) and finish(run), which records the finished run
    load_policy   load_policy(cfg, state, env) -> a policy with act(obs, generator) and deterministic_action(obs)
                  that `reflectrl eval` steps ("" where eval does not take its runs: `no_eval` says why)
    evaluate      evaluate(run, episodes, deterministic, seed, video, max_steps) -> eval's result, where the
                  form evaluates its runs itself ("": `reflectrl eval` steps its load_policy's policy)
    train_group   train_group(items, progress) -> exit code: several runs of one configuration trained as one
                  program (`reflectrl train-group`); with groups_seeds, compare gives it an entry's seeds
    """

    name: str
    family: str                        # "control" (reflectrl train) or "llm" (reflectrl llm train)
    step_kinds: tuple[str, ...] = ()   # what it can give a signal as a step
    provides: frozenset = frozenset()  # what signals may ask of it (WANTS)
    summary: str = ""
    entry: str = ""
    config: str = ""
    resolve: str = ""
    load_policy: str = ""
    no_eval: str = ""                  # why `reflectrl eval` does not take its runs (with load_policy "")
    multiagent: bool = False           # trains multi-agent (PettingZoo) envs
    runs_signals: bool = True          # False: --algo takes the trainer alone (no +SIGNAL yet)
    backends: tuple[str, ...] = ("gymnasium", "envpool")
    check: str = ""
    evaluate: str = ""
    train_group: str = ""
    groups_seeds: bool = False         # compare trains an entry's seeds as one group (its train_group)
    callbacks: bool = True             # calls the Python API's callbacks after each iteration (False: it trains
                                       # in compiled chunks with no Python between iterations)

    def load(self, part: str):
        """One of its parts (config, resolve, check, entry, load_policy, evaluate, train_group), imported."""
        target = getattr(self, part)
        if not target:
            raise UserError(f"trainer '{self.name}' has no {part}")
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def config_class(self) -> type:
        return self.load("config")


# Each trainer by name: its form registered first (the trainer's knobs, what it gives signals); and
# each trainer's forms by the backend they train on.
TRAINERS: dict[str, TrainerSpec] = {}
_FORMS: dict[str, dict[str, TrainerSpec]] = {}


def register_trainer(spec: TrainerSpec) -> TrainerSpec:
    """Add a trainer, or another backend form of one, to the registry (its name joins --algo, `reflectrl
    knobs` and the checks). Called by the trainer's package (its __init__), or from outside this package."""
    if "+" in spec.name or "[" in spec.name or spec.name in _SIGNALS:
        raise ValueError(f"trainer name '{spec.name}' clashes with a signal or the --algo syntax")
    if spec.family not in FAMILY_COMMANDS:
        raise ValueError(f"trainer '{spec.name}': family must be one of {', '.join(FAMILY_COMMANDS)}")
    bad = [k for k in spec.step_kinds if k not in STEP_KINDS] + [w for w in spec.provides if w not in WANTS]
    if bad:
        raise ValueError(f"trainer '{spec.name}' declares unknown step kinds or provides: {bad}")
    if not spec.backends:
        raise ValueError(f"trainer '{spec.name}' names no backend it trains on")
    first = TRAINERS.get(spec.name)
    if first is None:
        if not (spec.step_kinds and spec.summary):
            raise ValueError(f"trainer '{spec.name}': its first form declares its step kinds and summary")
        TRAINERS[spec.name] = spec
        _FORMS[spec.name] = {}
    else:
        if spec.family != first.family:
            raise ValueError(f"trainer '{spec.name}' is registered under family '{first.family}'")
        spec = dataclasses.replace(spec, **{part: getattr(first, part) for part in SHARED_PARTS
                                            if not getattr(spec, part)})
        if set(first.backends) <= set(spec.backends):  # registered again: it replaces its first form
            TRAINERS[spec.name] = spec
    _FORMS[spec.name].update(dict.fromkeys(spec.backends, spec))
    _parse_cached.cache_clear()
    return spec


# what a later form of a trainer may leave empty to share with its first
SHARED_PARTS = ("step_kinds", "provides", "summary", "config")


def trainer_spec(name: str, backend: str) -> TrainerSpec:
    """The form of a registered trainer that trains on an env backend; one line naming the backends it
    has where it has none on this one."""
    forms = _FORMS[name] if name in TRAINERS else {}
    if backend in forms:
        return forms[backend]
    hosts = [n for n in TRAINERS if backend in _FORMS[n]]
    has = list(forms)
    where = f"{name} trains on backend={' or '.join(has)} (use backend={has[0]} for it)" if has else \
        f"{name} is not a registered trainer"
    if not hosts:
        raise UserError(f"no trainer trains on backend={backend}; {where}")
    raise UserError(f"backend={backend} trains --algo {' or '.join(hosts)} and its signals; {where}")


def trainer_forms(name: str) -> dict[str, TrainerSpec]:
    """{backend: the form of a registered trainer that trains on it}."""
    return dict(_FORMS[name])


FAMILY_COMMANDS = {"control": "reflectrl train", "llm": "reflectrl llm train"}
# the trainer each family's command runs when --algo names none, and the legacy names' trainer
DEFAULT_TRAINER = {"control": "ppo", "llm": "grpo"}

_SIGNALS: dict[str, SignalSpec] = {}
# entry-point groups whose plug-ins register signals (the signals package adds its own, `reflectrl.signals`),
# each loaded on the first look-up of the signals after it is added
_PLUGIN_GROUPS: dict[str, bool] = {}


def trainer_class(name: str) -> type:
    """The class of a registered trainer (imported on first use)."""
    return TRAINERS[name].load("entry")


def register_signal(spec: SignalSpec) -> SignalSpec:
    """Called at import time by a signal's module."""
    if spec.name in TRAINERS or "+" in spec.name or "[" in spec.name:
        raise ValueError(f"signal name '{spec.name}' clashes with a trainer or the --algo syntax")
    static_wants = () if callable(spec.wants) else spec.wants
    bad = [k for k in spec.step_kinds if k not in STEP_KINDS] + [w for w in static_wants if w not in WANTS]
    if bad:
        raise ValueError(f"signal '{spec.name}' declares unknown step kinds or wants: {bad}")
    old = _SIGNALS.get(spec.name)
    if old is not None and getattr(old.factory, "target", old.factory) != getattr(spec.factory, "target", spec.factory):
        raise ValueError(f"two signals are named '{spec.name}'")
    _SIGNALS[spec.name] = spec
    _parse_cached.cache_clear()
    return spec


def add_plugin_group(group: str) -> None:
    """Load the modules the entry points of `group` name (each registers what it brings) on the first
    look-up of the signals: a package of signals says which group its plug-ins join."""
    _PLUGIN_GROUPS.setdefault(group, False)


def _load_plugins() -> None:
    for group, loaded in list(_PLUGIN_GROUPS.items()):
        if loaded:
            continue
        _PLUGIN_GROUPS[group] = True
        try:
            from importlib.metadata import entry_points

            for ep in entry_points(group=group):
                ep.load()
        except Exception as err:  # a broken plug-in must not take the built-in signals down
            import warnings

            warnings.warn(f"a {group} entry point failed to load: {type(err).__name__}: {err}")


def signals() -> dict[str, SignalSpec]:
    """Every registered signal by name, in a stable order."""
    _load_plugins()
    return dict(sorted(_SIGNALS.items()))


def signal_spec(name: str) -> SignalSpec:
    table = signals()
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"unknown signal '{name}'{hint}; signals: {', '.join(table)}")
    return table[name]


def section_types() -> dict[str, type]:
    """{--set section: its dataclass} of every signal."""
    return {name: spec.config for name, spec in signals().items()}


def aliases(family: str) -> dict[str, str]:
    """{legacy algo name: the composition it stands for} under a family's command."""
    out = {}
    for trainer in (t for t in TRAINERS.values() if t.family == family):
        out[trainer.name] = trainer.name
        for spec in signals().values():
            if trainer.name == DEFAULT_TRAINER[family] and family in spec.aliases:
                out[spec.aliases[family]] = f"{trainer.name}+{spec.name}"
    return out


@dataclass(frozen=True)
class Algo:
    """A parsed --algo: a trainer and the signals it runs, in order."""

    trainer: str
    signals: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "+".join((self.trainer, *self.signals))

    @property
    def sections(self) -> tuple[str, ...]:
        return self.signals


def algo_names(family: str) -> list[str]:
    """What --algo accepts under a family's command: the trainers, every trainer+signal, the aliases."""
    names = list(aliases(family))
    for trainer in (t for t in TRAINERS.values() if t.family == family and t.runs_signals):
        names += [f"{trainer.name}+{s}" for s, spec in signals().items()
                  if _step_kind(spec, trainer) and (callable(spec.wants) or spec.wants <= trainer.provides)]
    return list(dict.fromkeys(names))


def _step_kind(spec: SignalSpec, trainer: TrainerSpec) -> str | None:
    return next((k for k in spec.step_kinds if k in trainer.step_kinds), None)


def step_kind(signal: str, trainer: str) -> str:
    """The kind of step a signal works on under a trainer (e.g. calibration under grpo: turn)."""
    kind = _step_kind(signal_spec(signal), TRAINERS[trainer])
    assert kind is not None, (signal, trainer)
    return kind


def parse_algo(text: str, family: str = "control") -> Algo:
    """Read an --algo for a family's command; one line naming what is wrong otherwise. Read once per
    text (an Algo is immutable); a registration empties the memo."""
    return _parse_cached(text, family)


@functools.lru_cache(maxsize=256)
def _parse_cached(text: str, family: str) -> Algo:
    command = FAMILY_COMMANDS[family]
    raw = text.strip()
    names = aliases(family)
    if raw in names:
        raw = names[raw]
    parts = [p.strip() for p in raw.split("+")]
    if not raw or any(not p for p in parts):
        raise UserError(f"--algo '{text}' is not TRAINER[+SIGNAL...] (e.g. ppo+gear)")
    trainer_name, signal_names = parts[0], tuple(parts[1:])
    trainer = TRAINERS.get(trainer_name)
    if trainer is None or trainer.family != family:
        other = next((f for f in FAMILY_COMMANDS if f != family and trainer_name in aliases(f)), None)
        if other is not None:
            raise UserError(f"unknown --algo '{text}' for '{command}': it is an algo of '{FAMILY_COMMANDS[other]}' "
                            f"(run '{FAMILY_COMMANDS[other]} --algo {text.strip()}'); {command} takes: "
                            f"{', '.join(algo_names(family))}")
        choices = algo_names(family)
        close = difflib.get_close_matches(trainer_name, choices, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"unknown --algo '{text}'{hint}; {command} takes: {', '.join(choices)}")
    if signal_names and not trainer.runs_signals:
        raise UserError(f"--algo {text}: trainer '{trainer.name}' runs no signals yet; use --algo {trainer.name} "
                        f"alone, or ppo+{'+'.join(signal_names)}")
    seen = set()
    for name in signal_names:
        spec = signal_spec(name)
        if name in seen:
            raise UserError(f"--algo {text} names signal '{name}' twice")
        seen.add(name)
        if _step_kind(spec, trainer) is None:
            why = next((spec.refusals[k] for k in trainer.step_kinds if k in spec.refusals), None)
            works = " or ".join(STEP_TEXT[k] for k in spec.step_kinds)
            gives = " and ".join(STEP_TEXT[k] for k in trainer.step_kinds)
            raise UserError(f"signal '{name}' cannot run on trainer '{trainer.name}': "
                            + (why if why else f"it works on {works}, and {trainer.name} trains on {gives}; "
                               + _where_it_runs(spec)))
        missing = (set() if callable(spec.wants) else set(spec.wants)) - set(trainer.provides)
        if missing:
            raise UserError(f"signal '{name}' cannot run on trainer '{trainer.name}': it needs "
                            f"{wants_text(missing)}, which {trainer.name} does not have; " + _where_it_runs(spec))
    return Algo(trainer.name, signal_names)


def _where_it_runs(spec: SignalSpec, missing: set | None = None) -> str:
    """The end of a refusal: the knob that lifts it where one does (a callable `wants`), and the
    trainers that run the signal as it is, with the command that takes each."""
    hosts = [t for t in TRAINERS.values() if t.runs_signals and _step_kind(spec, t) is not None
             and (missing <= t.provides if missing is not None else callable(spec.wants) or spec.wants <= t.provides)]
    by_family: dict[str, list[str]] = {}
    for t in hosts:
        by_family.setdefault(t.family, []).append(f"{t.name}+{spec.name}")
    where = "; ".join(f"{FAMILY_COMMANDS[f]} --algo {' | '.join(names)}" for f, names in by_family.items())
    if missing is not None:
        return (f"change the knob that asks for it, or run it so configured with: {where}" if where
                else "change the knob that asks for it")
    return f"it runs with: {where}" if where else "no trainer runs it yet"


def check_sections(algo: Algo, sections: dict, text: str) -> None:
    """Knob sections given for signals the algo does not run are a mistake: say which algo reads them."""
    for name in sections:
        if name not in algo.signals:
            users = [a for a, comp in aliases(TRAINERS[algo.trainer].family).items() if comp.split("+")[1:] == [name]]
            users.append(f"{algo.trainer}+{name}")
            raise UserError(f"--set {name}.* knobs apply to --algo {' or '.join(users)} (any algo with the {name} "
                            f"signal), not --algo {text}")


def finish_signals(algo_text: str, family: str, run_dir) -> None:
    """Run each signal's end-of-run step (e.g. the calibration picture) for a finished run."""
    algo = parse_algo(algo_text, family)
    for name in algo.signals:
        on_finish = signal_spec(name).on_finish
        target = on_finish.get(step_kind(name, algo.trainer)) if isinstance(on_finish, dict) else on_finish
        if target:
            module, _, function = target.partition(":")
            try:
                getattr(importlib.import_module(module), function)(run_dir)
            except (UserError, OSError, ValueError) as err:  # a picture must not fail a finished run
                import warnings

                warnings.warn(f"the {name} signal's end-of-run step ({target}) failed: {err}")


