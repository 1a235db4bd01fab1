"""What an experiment is: envs x algo entries x seeds, each a run with its own overrides.

An algo entry is an --algo (TRAINER[+SIGNAL...], or an alias such as `refgrpo`) with
optional overrides in brackets, which is how ablations are written: `refgrpo[alpha=0]`,
`ppo[ent_coef=0;num_envs=8]`, `ppo+calibration[alpha=0.01]+gear[temperature=4]` (`;`
separates overrides). Brackets after a signal hold that signal's knobs (a bare key is its
knob when it has one, else a PPO or run knob); brackets after the trainer or an alias hold
PPO or run knobs, or knobs of the alias's one signal (`alpha` -> `calibration.alpha` for
refgrpo). That is the grammar of every --algo (config.split_algo). The entry's label (its text)
names it in every table and plot.

`--set KEY=VALUE` applies to every run; `--set ALGO.KEY=VALUE` (ALGO an algo in the list,
e.g. `refgrpo.alpha=0.1`, `ppo.ent_coef=0`) applies to that algo's entries only, and
`--set SIGNAL.KEY=VALUE` (`gear.temperature=4`) to every entry that runs that signal.

Layout: DIR/experiment.json (this spec; a second `compare` with the same DIR must match it)
and DIR/runs/<env>/<entry>/seed<N>/ (run directories) with DIR/runs/<env>/<entry>/seed<N>.log.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from reflectrl.config import algo_knob, split_algo, split_top_level
from reflectrl.errors import UserError
from reflectrl.registry import aliases, parse_algo, signals
from reflectrl.runs.jsonfile import read_json_object


@dataclass(frozen=True)
class AlgoEntry:
    label: str
    algo: str                      # the --algo of its runs, brackets removed (e.g. ppo+calibration+gear)
    overrides: tuple[str, ...] = ()

    @property
    def canonical(self) -> str:
        """The trainer+signals it runs, whatever alias it was written with."""
        return parse_algo(self.algo).name

    @property
    def signals(self) -> tuple[str, ...]:
        return parse_algo(self.algo).signals


@dataclass(frozen=True)
class RunSpec:
    env_id: str
    entry: AlgoEntry
    seed: int
    path: Path
    total_steps: int
    wrapper: str | None = None
    overrides: tuple[str, ...] = ()  # --set items, the entry's own last

    def config(self):
        """The resolved, validated RunConfig of this run (built directly, no command line)."""
        from reflectrl.trainers.resolve import resolve_config

        return resolve_config(self.given_config())

    def given_config(self):
        """Its config checked as far as it can be without its env (config.new_config: no torch, JAX or env
        package imported)."""
        from reflectrl.config import new_config

        return new_config(algo=self.entry.algo, env_id=self.env_id, seed=self.seed, total_steps=self.total_steps,
                          wrapper=self.wrapper, overrides=list(self.overrides))

    @property
    def argv(self) -> tuple[str, ...]:
        """The `reflectrl train` arguments that create this run (for a subprocess or a Ray task)."""
        argv = ["--algo", self.entry.algo, "--env", self.env_id, "--seed", str(self.seed),
                "--total-steps", str(self.total_steps), "--out", str(self.path)]
        if self.wrapper:
            argv += ["--wrapper", self.wrapper]
        if self.overrides:
            argv += ["--set", *self.overrides]
        return tuple(argv)


def parse_entry(item: str) -> AlgoEntry:
    """One --algos entry: `refgrpo[alpha=0]`, `ppo+calibration[alpha=0.01]+gear[temperature=4]` (the
    grammar of every --algo: config.split_algo)."""
    first = re.match(r"\s*([A-Za-z0-9_-]*)", item).group(1)
    if first not in aliases("control"):
        raise UserError(f"unknown algo '{first}' in --algos entry '{item}'; an entry starts with one "
                        f"of: {', '.join(aliases('control'))}")
    algo, overrides = split_algo(item, what="--algos entry")
    parse_algo(algo)  # unknown names, signals a trainer cannot run: one line, before anything starts
    return AlgoEntry(label=item, algo=algo.replace(" ", ""), overrides=overrides)


def parse_algos(text: str) -> list[AlgoEntry]:
    entries = [parse_entry(item) for item in split_top_level(text) if item]
    if not entries:
        raise UserError("--algos is empty; give e.g. --algos ppo,refgrpo")
    labels = [e.label for e in entries]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise UserError(f"--algos lists {', '.join(dupes)} more than once; each entry must be distinct")
    return entries


def _set_target(item: str) -> tuple[str, str, str] | None:
    """('algo' | 'signal', name, rest) for a --set ALGO.KEY / SIGNAL.KEY item; None for one that applies to all."""
    key = item.split("=", 1)[0]
    prefix, dot, rest = key.partition(".")
    if not dot:
        return None
    if prefix in signals():
        return "signal", prefix, item[len(prefix) + 1:]
    if "+" in prefix or prefix in aliases("control"):
        return "algo", prefix, item[len(prefix) + 1:]
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_")


@dataclass
class ExperimentSpec:
    envs: list[str]
    algos: list[str]  # entry labels, in order
    seeds: int
    total_steps: int
    wrapper: str | None = None
    sets: list[str] = field(default_factory=list)
    # the seeds are first_seed .. first_seed + seeds - 1 (a re-run on fresh seeds starts past
    # the ones a search used); written to experiment.json only when it is not 1
    first_seed: int = 1

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if data["first_seed"] == 1:
            del data["first_seed"]  # experiment.json as before the field existed
        return data

    @property
    def seed_numbers(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)

    def entries(self) -> list[AlgoEntry]:
        return parse_algos(",".join(self.algos))

    def validate(self) -> None:
        if not self.envs:
            raise UserError("--env is empty; give one or more env ids separated by commas")
        dupes = sorted({e for e in self.envs if self.envs.count(e) > 1})
        if dupes:
            raise UserError(f"--env lists {', '.join(dupes)} more than once")
        if len({_slug(e) for e in self.envs}) != len(self.envs):  # reflectrl/GridWorld-v0, reflectrl:GridWorld-v0
            raise UserError(f"--env {','.join(self.envs)}: two of these name one env (their runs would share a "
                            "directory); keep one")
        if self.seeds < 1:
            raise UserError(f"--seeds {self.seeds}: must be >= 1")
        if self.first_seed < 1:
            raise UserError(f"--first-seed {self.first_seed}: must be >= 1")
        if self.total_steps < 1:
            raise UserError(f"--total-steps {self.total_steps}: must be a positive integer")
        entries = self.entries()
        for item in self.sets:
            target = _set_target(item)
            if target is None:
                continue
            kind, name, _ = target
            if kind == "algo" and not any(name in (e.algo, e.canonical) for e in entries):
                raise UserError(f"--set {item}: algo '{name}' is not in --algos")
            if kind == "signal" and not any(name in e.signals for e in entries):
                raise UserError(f"--set {item}: no entry of --algos runs the '{name}' signal")
        slugs = [(_slug(e.label)) for e in entries]
        if len(set(slugs)) != len(slugs):
            raise UserError("--algos has entries whose names differ only in punctuation; rename one")
        checked = set()
        for run in self.runs(Path(".")):  # each entry's knobs, before any env (or torch, or JAX) is imported
            if run.entry.label not in checked:
                checked.add(run.entry.label)
                run.given_config()

    def runs(self, root: Path) -> list[RunSpec]:
        out = []
        for env_id in self.envs:
            for entry in self.entries():
                sets = []
                for item in self.sets:
                    target = _set_target(item)
                    if target is None:
                        sets.append(item)
                    elif target[0] == "signal" and target[1] in entry.signals:
                        sets.append(item)
                    elif target[0] == "algo" and target[1] in (entry.algo, entry.canonical):
                        algo = parse_algo(target[1])
                        section = algo.signals[0] if len(algo.signals) == 1 else None
                        sets.append(algo_knob(section, target[2], False, algo.trainer))
                sets += list(entry.overrides)  # the entry's own overrides win
                for seed in self.seed_numbers:
                    path = root / "runs" / _slug(env_id) / _slug(entry.label) / f"seed{seed}"
                    out.append(RunSpec(env_id, entry, seed, path, self.total_steps, self.wrapper, tuple(sets)))
        return out


SPEC_FILE = "experiment.json"


# What an experiment may gain when `compare` is rerun on it; anything else changes what its
# existing runs mean (steps, wrapper, --set) and needs a new --out.
_EXTENSIBLE = ("envs", "algos", "seeds")


def load_or_create(root: Path, spec: ExperimentSpec) -> list[str]:
    """Record the spec in DIR, or check that DIR already holds this experiment.

    Rerunning with more envs, algo entries or seeds (and everything else equal) extends
    the experiment: the spec on disk is replaced by the larger one and its finished runs
    are kept. Returns what was added ([] for a new or resumed experiment)."""
    path = root / SPEC_FILE
    added: list[str] = []
    if path.exists():
        old = read_json_object(path, "use another --out")
        new = spec.to_dict()
        # a key left out when at its default (first_seed) compares as that default
        old, new = {"first_seed": 1, **old}, {"first_seed": 1, **new}
        diff = [k for k in new if old.get(k) != new[k]]
        if not diff:
            return added
        fixed = [k for k in diff if k not in _EXTENSIBLE]
        dropped = ([f"env {e}" for e in old["envs"] if e not in spec.envs]
                   + [f"algo entry {a}" for a in old["algos"] if a not in spec.algos])
        why = (f"differs in: {', '.join(fixed)}" if fixed
               else f"this command leaves out its {', '.join(dropped)}" if dropped
               else f"--seeds {spec.seeds} is fewer than its {old['seeds']}" if spec.seeds < old["seeds"]
               else None)
        if why:
            raise UserError(f"--out {root} holds a different experiment ({why}); repeat the original arguments "
                            "to resume it, add envs / algo entries / seeds to extend it, or use another --out")
        added = ([f"env {e}" for e in spec.envs if e not in old["envs"]]
                 + [f"algo entry {a}" for a in spec.algos if a not in old["algos"]]
                 + ([f"seeds {spec.first_seed + old['seeds']}-{spec.first_seed + spec.seeds - 1}"]
                    if spec.seeds > old["seeds"] else []))
    elif root.exists() and any(root.iterdir()):
        raise UserError(f"--out {root} exists and is not an experiment directory; choose another --out")
    from reflectrl.runs import atomic_write_bytes
    from reflectrl.runs.rundir import make_dir

    make_dir(root)

    atomic_write_bytes(path, (json.dumps(spec.to_dict(), indent=2) + "\n").encode())
    return added


def read_spec(root: Path) -> ExperimentSpec:
    path = root / SPEC_FILE
    if not path.is_file():
        raise UserError(f"{root} is not an experiment directory (no {SPEC_FILE}); "
                        "pass the --out of 'reflectrl compare'")
    data = read_json_object(path, "the experiment cannot be read (run 'reflectrl compare' again)")
    try:
        return ExperimentSpec(**data)
    except TypeError:
        raise UserError(f"{path} is corrupt: not the spec 'reflectrl compare' writes") from None


def compare_spec(envs: str | None, algos: str | None, *, seeds: int | None, total_steps: int | None, sets: list,
                 wrapper: str | None, first_seed: int, preset: str | None = None,
                 names: tuple[str, ...] = ("--env", "--algos", "--total-steps", "--preset")) -> ExperimentSpec:
    """What `reflectrl compare` (and reflectrl.compare) runs, checked: the envs and algo entries as
    comma-separated text, each value not given taken from the preset where one is named (its --set items
    first); `names`: how the caller calls envs, algos, total_steps and preset, for the line that says one is missing."""
    if preset is not None:
        from reflectrl.experiments.presets import get_preset

        found = get_preset(preset)
        envs = envs if envs is not None else ",".join(found.envs)
        algos = algos if algos is not None else ",".join(found.algos)
        seeds = seeds if seeds is not None else found.seeds
        total_steps = total_steps if total_steps is not None else found.total_steps
        sets = [*found.sets, *sets]
        wrapper = wrapper if wrapper is not None else found.wrapper
    missing = [name for name, value in zip(names, (envs, algos, total_steps)) if value is None]
    if missing:
        raise UserError(f"compare needs {', '.join(missing)} (or a {names[3]} that gives them)")
    spec = ExperimentSpec(envs=[e.strip() for e in envs.split(",") if e.strip()],
                          algos=[e.label for e in parse_algos(algos)], seeds=5 if seeds is None else seeds,
                          total_steps=total_steps, wrapper=wrapper, sets=sets, first_seed=first_seed)
    spec.validate()
    return spec
