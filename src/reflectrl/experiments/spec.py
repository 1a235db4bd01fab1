"""What an experiment is: envs x algo entries x seeds, each a run with its own overrides.

An algo entry is an algo name with optional overrides in brackets, which is how ablations
are written: `refgrpo[alpha=0]`, `ppo[ent_coef=0;num_envs=8]` (`;` separates overrides).
`--set refgrpo.alpha=0.1` sets a knob for every refgrpo entry (bare knobs as in brackets).
A bare key in brackets is a PPO or run knob when it names one, else a knob of the algo's
own signal section (`alpha` -> `calibration.alpha` for refgrpo). The entry's label (its
text) names it in every table and plot.

`--set KEY=VALUE` applies to every run; `--set ALGO.KEY=VALUE` (ALGO one of the algos in
the list) applies to that algo's entries only.

Layout: DIR/experiment.json (this spec; a second `compare` with the same DIR must match it)
and DIR/runs/<env>/<entry>/seed<N>/ (run directories) with DIR/runs/<env>/<entry>/seed<N>.log.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from reflectrl.config import ALGO_SECTIONS, ALGOS, RUN_KNOBS, PPOConfig
from reflectrl.errors import UserError
_PPO_KNOBS = {f.name for f in dataclasses.fields(PPOConfig)}


@dataclass(frozen=True)
class AlgoEntry:
    label: str
    algo: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    env_id: str
    entry: AlgoEntry
    seed: int
    path: Path
    argv: tuple[str, ...]  # the `reflectrl train` arguments that create this run


def _section_key(algo: str, item: str) -> str:
    """A bare knob of a signal algo belongs to its section: alpha=0 -> calibration.alpha=0."""
    key = item.split("=", 1)[0].strip()
    if "." not in key and key not in _PPO_KNOBS and key not in RUN_KNOBS and algo in ALGO_SECTIONS:
        return f"{ALGO_SECTIONS[algo]}.{item.strip()}"
    return item.strip()


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"--algos '{text}': unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise UserError(f"--algos '{text}': unbalanced '['")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_algos(text: str) -> list[AlgoEntry]:
    entries = []
    for item in _split_top_level(text):
        m = re.fullmatch(r"([A-Za-z0-9_-]+)(?:\[(.*)\])?", item)
        if not m:
            raise UserError(f"--algos entry '{item}' is not ALGO or ALGO[key=value;...]")
        algo, inner = m.group(1), m.group(2)
        if algo not in ALGOS:
            raise UserError(f"unknown algo '{algo}' in --algos; available: {', '.join(ALGOS)}")
        overrides = []
        for kv in (inner or "").split(";"):
            kv = kv.strip()
            if not kv:
                continue
            if "=" not in kv:
                raise UserError(f"--algos entry '{item}': '{kv}' is not key=value")
            overrides.append(_section_key(algo, kv))
        entries.append(AlgoEntry(label=item, algo=algo, overrides=tuple(overrides)))
    if not entries:
        raise UserError("--algos is empty; give e.g. --algos ppo,refgrpo")
    labels = [e.label for e in entries]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise UserError(f"--algos lists {', '.join(dupes)} more than once; each entry must be distinct")
    return entries


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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def entries(self) -> list[AlgoEntry]:
        return parse_algos(",".join(self.algos))

    def validate(self) -> None:
        if not self.envs:
            raise UserError("--env is empty; give one or more env ids separated by commas")
        dupes = sorted({e for e in self.envs if self.envs.count(e) > 1})
        if dupes:
            raise UserError(f"--env lists {', '.join(dupes)} more than once")
        if self.seeds < 1:
            raise UserError(f"--seeds {self.seeds}: must be >= 1")
        if self.total_steps < 1:
            raise UserError(f"--total-steps {self.total_steps}: must be a positive integer")
        entries = self.entries()
        algos = {e.algo for e in entries}
        for item in self.sets:
            prefix = item.split("=", 1)[0].split(".", 1)[0]
            if "." in item.split("=", 1)[0] and prefix in ALGOS and prefix not in algos:
                raise UserError(f"--set {item}: algo '{prefix}' is not in --algos")
        slugs = [(_slug(e.label)) for e in entries]
        if len(set(slugs)) != len(slugs):
            raise UserError("--algos has entries whose names differ only in punctuation; rename one")

    def runs(self, root: Path) -> list[RunSpec]:
        out = []
        for env_id in self.envs:
            for entry in self.entries():
                sets = []
                for item in self.sets:
                    key = item.split("=", 1)[0]
                    prefix, _, rest = key.partition(".")
                    if rest and prefix in ALGOS:
                        if prefix == entry.algo:
                            sets.append(_section_key(entry.algo, item[len(prefix) + 1:]))
                    else:
                        sets.append(item)
                sets += list(entry.overrides)  # the entry's own overrides win
                for seed in range(1, self.seeds + 1):
                    path = root / "runs" / _slug(env_id) / _slug(entry.label) / f"seed{seed}"
                    argv = ["--algo", entry.algo, "--env", env_id, "--seed", str(seed),
                            "--total-steps", str(self.total_steps), "--out", str(path)]
                    if self.wrapper:
                        argv += ["--wrapper", self.wrapper]
                    if sets:
                        argv += ["--set", *sets]
                    out.append(RunSpec(env_id, entry, seed, path, tuple(argv)))
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
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise UserError(f"{path} is corrupt; use another --out") from None
        new = spec.to_dict()
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
                 + ([f"seeds {old['seeds'] + 1}-{spec.seeds}"] if spec.seeds > old["seeds"] else []))
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
        raise UserError(f"{root} is not an experiment directory (no {SPEC_FILE}); pass the --out of 'reflectrl compare'")
    try:
        return ExperimentSpec(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError):
        raise UserError(f"{path} is corrupt") from None
