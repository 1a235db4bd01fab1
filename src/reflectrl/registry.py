"""The registry: which trainers and signals exist, what each needs and supports, and how an
`--algo` is read. Everything that lists or checks algos (config validation, building the
signals, the CLI's help, `compare`'s entries, `reflectrl knobs`, the README's table) reads
it; nothing else keeps a list of them.

A signal registers itself in its package, reflectrl/signals/NAME/__init__.py (its knobs and
`register_signal(SignalSpec(...))`, importing no torch or JAX, so that checking a command line
needs neither), beside its torch form (NAME/torch.py) and its JAX form (NAME/jax.py) where it
has one; every package under `reflectrl.signals` is imported on the first look-up, so a new
signal is one package (or, outside this one, a module named by an entry point in the group
`reflectrl.signals`). Trainers are listed in
`TRAINERS` below: a new trainer is its package plus one entry.

`--algo` is TRAINER[+SIGNAL...]: `ppo`, `ppo+gear`, `ppo+calibration+gear`, `grpo+gear`.
Signals apply in the order written (see signals/base.py for how their outputs combine).
The names the project started with stay as aliases: `refgrpo` = `ppo+calibration` (under
`llm train`: `grpo+calibration`), `sdrs` = `ppo+shaping`, `gear` = `ppo+gear` (`grpo+gear`).
Any part may carry knobs in brackets, `ppo+calibration[mode=uncertainty]`: config.split_algo reads
them, for every command that takes an algo.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
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
    """A trainer: what it gives signals, and where its parts are. The parts are named as
    "module:attribute" and imported on first use, so listing or checking algos imports no trainer.

    config        its knob dataclass (the run's `knobs`: --set NAME.KNOB or bare names, config.json's NAME
                  section), with validate(total_steps) and env_settings() (what building its envs reads)
    resolve       resolve(cfg) -> cfg: the env-dependent defaults filled in (by probing the env) and the
                  trainer's own refusals (e.g. continuous actions for dqn); the shared checks follow it
    entry         the trainer class: Trainer(cfg, run) runs the train loop (trainers/base.py)
    load_policy   load_policy(cfg, state) -> a policy with act(obs, generator) and deterministic_action(obs)
                  that `reflectrl eval` steps ("" where eval does not take its runs: `no_eval` says why)
    jax           resolve(cfg) -> cfg of the trainer's JAX version (--set backend=jax; reflectrl/trainers/ppo_jax)
    jax_check     check(cfg): what its JAX version refuses that needs no env (a torch-only knob), made as the
                  command line is read, before torch, JAX or an env package is imported
    """

    name: str
    family: str                        # "control" (reflectrl train) or "llm" (reflectrl llm train)
    step_kinds: tuple[str, ...]        # what it can give a signal as a step
    provides: frozenset                # what signals may ask of it (WANTS)
    summary: str
    entry: str = ""
    config: str = ""
    resolve: str = ""
    load_policy: str = ""
    no_eval: str = ""                  # why `reflectrl eval` does not take its runs (with load_policy "")
    multiagent: bool = False           # trains multi-agent (PettingZoo) envs
    runs_signals: bool = True          # False: --algo takes the trainer alone (no +SIGNAL yet)
    jax: str = ""                      # backend=jax: the resolve of its compiled version ("": torch only)
    jax_check: str = ""                # backend=jax: its refusals that need no env

    def load(self, part: str):
        """One of its parts (config, resolve, entry, load_policy), imported."""
        target = getattr(self, part)
        if not target:
            raise UserError(f"trainer '{self.name}' has no {part}")
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def config_class(self) -> type:
        return self.load("config")


# The trainers. A new one is its package under reflectrl/trainers/ (or anywhere importable) and one
# entry here, or one register_trainer(TrainerSpec(...)) call from outside this package.
_T = "reflectrl.trainers."
TRAINERS: dict[str, TrainerSpec] = {}


def register_trainer(spec: TrainerSpec) -> TrainerSpec:
    """Add a trainer to the registry (its name joins --algo, `reflectrl knobs` and the checks)."""
    if "+" in spec.name or "[" in spec.name or spec.name in _SIGNALS:
        raise ValueError(f"trainer name '{spec.name}' clashes with a signal or the --algo syntax")
    if spec.family not in FAMILY_COMMANDS:
        raise ValueError(f"trainer '{spec.name}': family must be one of {', '.join(FAMILY_COMMANDS)}")
    bad = [k for k in spec.step_kinds if k not in STEP_KINDS] + [w for w in spec.provides if w not in WANTS]
    if bad:
        raise ValueError(f"trainer '{spec.name}' declares unknown step kinds or provides: {bad}")
    TRAINERS[spec.name] = spec
    _parse_cached.cache_clear()
    return spec


FAMILY_COMMANDS = {"control": "reflectrl train", "llm": "reflectrl llm train"}
# the trainer each family's command runs when --algo names none, and the legacy names' trainer
DEFAULT_TRAINER = {"control": "ppo", "llm": "grpo"}

_SIGNALS: dict[str, SignalSpec] = {}
_loaded = False



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


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # found by name, as an entry point is: the signals sit above the registry and import it. Each signal's
    # package (reflectrl/signals/NAME/) registers itself in its __init__, which imports no torch or JAX:
    # its forms are imported when a run builds them
    package = importlib.import_module("reflectrl.signals")
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="reflectrl.signals"):
            ep.load()
    except Exception as err:  # a broken plug-in must not take the built-in signals down
        import warnings

        warnings.warn(f"a reflectrl.signals entry point failed to load: {type(err).__name__}: {err}")


def signals() -> dict[str, SignalSpec]:
    """Every registered signal by name, in a stable order."""
    _load()
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


# the built-in trainers
for _spec in (
    TrainerSpec("ppo", "control", ("env_step",),
                frozenset({"features", "feature_grad", "next_obs", "state_keys", "value_stream", "costs", "policy"}),
                "PPO on Gymnasium envs (CleanRL's details)", entry=_T + "ppo.trainer:PPOTrainer",
                config=_T + "ppo.config:PPOConfig", resolve=_T + "ppo.resolve:resolve",
                load_policy=_T + "ppo.resolve:load_policy", jax="reflectrl.trainers.ppo_jax.resolve:resolve",
                jax_check="reflectrl.trainers.ppo_jax.resolve:check"),
    TrainerSpec("dqn", "control", ("transition",), frozenset({"features", "next_obs"}),
                "DQN on Gymnasium envs with discrete actions (CleanRL's dqn.py / dqn_atari.py)",
                entry=_T + "replay.dqn:DQNTrainer", config=_T + "replay.config:DQNConfig",
                resolve=_T + "replay.resolve:resolve_dqn", load_policy=_T + "replay.resolve:load_dqn_policy"),
    TrainerSpec("sac", "control", ("transition",), frozenset({"next_obs"}),
                "SAC on Gymnasium envs with continuous actions (CleanRL's sac_continuous_action.py)",
                entry=_T + "replay.sac:SACTrainer", config=_T + "replay.config:SACConfig",
                resolve=_T + "replay.resolve:resolve_sac", load_policy=_T + "replay.resolve:load_sac_policy"),
    TrainerSpec("impala", "control", ("env_step",), frozenset({"features", "next_obs", "state_keys", "value_stream"}),
                "IMPALA on Ray: actors step envs in parallel, one learner applies V-trace (Espeholt et al. 2018)",
                entry=_T + "impala.trainer:IMPALATrainer", config=_T + "impala.config:IMPALAConfig",
                resolve=_T + "impala.config:resolve", load_policy=_T + "ppo.resolve:load_policy"),
    TrainerSpec("mappo", "control", ("env_step",), frozenset({"next_obs", "team"}),
                "MAPPO on PettingZoo parallel envs (--env pettingzoo:MODULE): PPO per agent, shared weights, "
                "a centralised critic (Yu et al. 2022)", entry=_T + "mappo.trainer:MAPPOTrainer",
                config=_T + "mappo.config:MAPPOConfig", resolve=_T + "mappo.envs:resolve_multiagent",
                no_eval="is a multi-agent (mappo) run, which `reflectrl eval` does not evaluate yet; its "
                        "metrics.jsonl holds the team's and each agent's returns over training", multiagent=True),
    TrainerSpec("hppo", "control", ("env_step",), frozenset({"features", "next_obs", "state_keys"}),
                "two-level PPO on grids (the grid world, MiniGrid): a sub-goal policy over regions and a "
                "goal-conditioned one that reaches them; a signal runs at each level (seed 002 section 6.1)",
                entry=_T + "hppo.trainer:HPPOTrainer", config=_T + "hppo.config:HPPOConfig",
                resolve=_T + "hppo.goals:resolve", load_policy=_T + "hppo.trainer:load_policy"),
    TrainerSpec("grpo", "llm", ("token", "turn"), frozenset({"features", "teacher"}),
                "GRPO on language models (group-normalised advantages, clipped token objective)",
                entry=_T + "grpo.trainer:GRPOTrainer", config=_T + "grpo.config:GRPOConfig"),
):
    register_trainer(_spec)
