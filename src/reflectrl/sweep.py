"""`reflectrl sweep`: hyperparameter search with Optuna, each trial an ordinary experiment.

A search space is a list of `KEY=DIST` knobs, KEY a `--set` key (`calibration.alpha`,
`learning_rate`) and DIST one of `uniform(a,b)`, `loguniform(a,b)`, `int(a,b)` or
`choice(x,y,...)`. Each trial is one `compare` experiment (one env, one algo, seeds 1..K)
in DIR/trials/NNNN, run as a `reflectrl compare` subprocess so that it is exactly what
`compare` does (local processes or Ray, resumable runs) and so that a pruned trial is
stopped the way Ctrl-C stops a `compare`: its runs end at their last checkpoint.

* Sampler: TPE, seeded with SAMPLER_SEED + the trial's number, so a sweep is repeatable and
  an interrupted one suggests what it would have suggested uninterrupted.
* Pruner: the median rule on the mean true return so far (the mean over the trial's seeds of
  each run's mean episodic return up to the step), reported to Optuna at every tenth of
  training once every seed has passed it: a trial below the completed trials' median at the
  same step is stopped (`below_median`); none before 5 trials completed or 30% of training.
* Objective: the IQM over the trial's seeds of each run's AUC (mean of its learning curve)
  or final return (`--objective auc|final`), in the env's return units. A sweep has one env,
  so normalising by any fixed range would be an affine map: it changes no ranking, and TPE
  and the median rule only use rankings.
* Storage: DIR/sweep.db (SQLite), DIR/sweep.json (what the sweep is; a rerun must match it,
  except --trials, which may grow). Rerunning continues the study: finished trials are not
  rerun, a trial the last process was running is resumed with the same knobs and directory.
* `--vmap-trials N` (backend=jax): N trials at a time, asked of the sampler together (TPE with
  its constant liar, so that they spread), their runs (N trials x K seeds) trained as one
  compiled program with each run's knobs read from its own state (trainers/ppo_jax/ppo.py VECTOR_KNOBS:
  learning_rate, ent_coef, vf_coef, clip_coef, max_grad_norm; and the signals' vector_knobs:
  count.beta, calibration.alpha, calibration.beta, shaping.eta, gear.temperature, rnd.int_coef
  (above 0) and rnd.ext_coef). A batch runs to its end: no pruning. Each trial's directory is
  the compare experiment it would otherwise be.
* Winner's curse: the best knobs are re-run on fresh seeds K+1..K+M in DIR/best (an
  experiment whose seeds start at K+1: ExperimentSpec.first_seed), optionally beside the
  tuned baseline of another sweep (`--baseline`), and that experiment gets the ordinary report.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from reflectrl.config import new_config, split_algo
from reflectrl.errors import UserError
from reflectrl.experiments.spec import ExperimentSpec, parse_algos
from reflectrl.registry import DEFAULT_TRAINER, parse_algo, signals
from reflectrl.runs.jsonfile import read_json_object

SAMPLER_SEED = 0
PRUNE_POINTS = 10          # intermediate values at every tenth of training
PRUNE_STARTUP_TRIALS = 5   # trials that run in full before any is pruned
PRUNE_WARMUP = 0.3         # share of training before a trial can be pruned
POLL_S = 2.0               # how often a running trial's learning curves are read
SWEEP_FILE, STUDY_FILE, BEST_FILE = "sweep.json", "sweep.db", "best.json"
STUDY_NAME = "sweep"
DISTS = "uniform(a,b), loguniform(a,b), int(a,b) or choice(x,y,...)"
_FINISHED = ("COMPLETE", "PRUNED", "FAIL")


# --------------------------------------------------------------------------- search space

@dataclass(frozen=True)
class Knob:
    """One dimension of the search space: a `--set` key and the distribution of its values."""

    key: str
    dist: str                   # uniform | loguniform | int | choice
    low: float = 0.0
    high: float = 0.0
    choices: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """KEY=DIST, written so that parsing it gives this knob back (bounds in full precision)."""
        if self.dist == "choice":
            args = ",".join(self.choices)
        elif self.dist == "int":
            args = f"{int(self.low)},{int(self.high)}"
        else:
            args = f"{self.low!r},{self.high!r}"
        return f"{self.key}={self.dist}({args})"

    def suggest(self, trial):
        """This knob's value for an Optuna trial (the stored one when the trial is resumed)."""
        if self.dist == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.dist == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, self.low, self.high, log=self.dist == "loguniform")

    def extremes(self) -> list:
        """The values that validating the space tries: both ends of a range, every choice."""
        if self.dist == "choice":
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.dist == "int" else [self.low, self.high]


def set_item(key: str, value) -> str:
    """A knob value as a `--set KEY=VALUE` item (floats in full precision)."""
    return f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"


def _number(text: str, what: str, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise UserError(f"{what}: '{text}' is not {kind}") from None
    if not math.isfinite(value):
        raise UserError(f"{what}: bounds must be finite numbers")
    return value


def parse_knob(text: str, where: str = "--space") -> Knob:
    """`KEY=DIST` -> Knob, or a UserError naming what is wrong with it and how to write it."""
    what = f"{where} {text.strip()}"
    key, eq, dist = text.partition("=")
    key, dist = key.strip(), dist.strip()
    if not eq or not key:
        raise UserError(f"{what}: not KEY=DIST; write e.g. --space 'calibration.alpha=loguniform(1e-3,1)'")
    m = re.fullmatch(r"([A-Za-z]+)\s*\((.*)\)", dist)
    if not m:
        raise UserError(f"{what}: '{dist}' is not a distribution; use {DISTS}")
    name, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
    if name == "choice":
        if args == [""]:
            raise UserError(f"{what}: choice() is empty; list the values, e.g. choice(direct,potential)")
        if "" in args:
            raise UserError(f"{what}: choice has an empty value; separate values with single commas")
        if len(set(args)) != len(args):
            raise UserError(f"{what}: choice lists a value twice")
        return Knob(key, "choice", choices=tuple(args))
    if name not in ("uniform", "loguniform", "int"):
        raise UserError(f"{what}: unknown distribution '{name}'; use {DISTS}")
    if len(args) != 2:
        raise UserError(f"{what}: {name} takes two bounds, {name}(a,b)")
    low, high = (_number(a, what, integer=name == "int") for a in args)
    if not low < high:
        raise UserError(f"{what}: needs a < b (got a={args[0]}, b={args[1]}); a fixed value belongs in --set")
    if name == "loguniform" and low <= 0:
        raise UserError(f"{what}: loguniform needs 0 < a (got a={args[0]}); use uniform(a,b) for a range from 0")
    return Knob(key, name, float(low), float(high))


def read_space_file(path: str) -> list[tuple[str, str]]:
    """(where, KEY=DIST) for each line of a space file; blank lines and # comments are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise UserError(f"--space-file {path}: cannot read it ({why})") from None
    items = [(f"--space-file {path}:{n}:", line.split("#", 1)[0].strip()) for n, line in enumerate(lines, 1)]
    return [(where, text) for where, text in items if text]


def parse_space(items: list[str], space_file: str | None = None) -> list[Knob]:
    """The knobs of --space items and a --space-file, each key once."""
    given = [("--space", text) for text in items] + (read_space_file(space_file) if space_file else [])
    if not given:
        raise UserError("sweep needs a search space: --space KEY=DIST (or --space-file F), "
                        "e.g. --space 'calibration.alpha=loguniform(1e-3,1)'")
    knobs = [parse_knob(text, where) for where, text in given]
    keys = [k.key for k in knobs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise UserError(f"the search space lists {', '.join(dupes)} more than once; give each knob one DIST")
    return knobs


# --------------------------------------------------------------------------- what a sweep is

@dataclass
class SweepSpec:
    """Everything that fixes what a trial's numbers mean; a rerun on DIR must match it."""

    env: str
    algo: str
    space: list[str]            # Knob.text of each knob, in order
    seeds: int
    total_steps: int
    objective: str = "auc"
    wrapper: str | None = None
    sets: list[str] = field(default_factory=list)

    def knobs(self) -> list[Knob]:
        return [parse_knob(text) for text in self.space]

    def experiment(self, params: dict, seeds: int | None = None) -> ExperimentSpec:
        """The compare experiment of one trial: the sweep's --set, then the trial's knob values."""
        sets = [*self.sets, *(set_item(k.key, params[k.key]) for k in self.knobs())]
        return ExperimentSpec(envs=[self.env], algos=[self.algo], seeds=seeds or self.seeds,
                              total_steps=self.total_steps, wrapper=self.wrapper, sets=sets)

    def overrides(self, params: dict) -> list[str]:
        """The resolved overrides of one trial's runs (--set routed to the algo, knobs last)."""
        return list(self.experiment(params).runs(Path("."))[0].overrides)

    def validate(self) -> None:
        """Every check that needs no directory: the algo, the env, --set, and each knob at the
        ends of its range (each choice), one line naming the --space item that fails; what needs
        no env first (check), then each run resolved for its env."""
        self._validate(with_env=True)

    def check(self) -> None:
        """The checks of validate() that need no env: no torch, JAX or env package is imported."""
        self._validate(with_env=False)

    def _validate(self, with_env: bool) -> None:
        if "," in self.env:
            raise UserError(f"--env {self.env}: a sweep tunes on one env; run one sweep per env")
        if "[" in self.algo or len(parse_algos(self.algo)) != 1:
            raise UserError(f"--algo {self.algo}: give one TRAINER[+SIGNAL...] without brackets; "
                            "fixed knobs go in --set, tuned ones in --space")
        knobs = self.knobs()
        fixed = {item.partition("=")[0].strip() for item in self.sets}
        both = [k.key for k in knobs if k.key in fixed]
        if both:
            raise UserError(f"{', '.join(both)} is both in --set and in the search space; keep it in one (knobs in "
                            "the --algo's brackets are fixed, as --set's)")
        base = ExperimentSpec(envs=[self.env], algos=[self.algo], seeds=self.seeds, total_steps=self.total_steps,
                              wrapper=self.wrapper, sets=list(self.sets))
        base.validate()
        runs_signals = parse_algo(self.algo).signals
        for knob in knobs:
            section = knob.key.partition(".")[0]
            if section in signals() and section not in runs_signals:
                raise UserError(f"--space {knob.text}: --algo {self.algo} does not run the '{section}' signal; "
                                f"tune {section}.* knobs on an algo that does (e.g. ppo+{section})")
        first = {k.key: k.extremes()[0] for k in knobs}
        trials = [(knob, self.experiment({**first, knob.key: value})) for knob in knobs for value in knob.extremes()]
        # what needs no env first, for every trial (no torch imported yet: a bad knob is refused at once) ...
        for knob, trial in trials:
            try:
                trial.validate()
            except UserError as err:
                raise UserError(f"--space {knob.text}: {err}") from None
        if not with_env:
            return
        from reflectrl.experiments.runner import validate_runs

        validate_runs(base, Path("."))  # ... then each run resolved for its env
        for knob, trial in trials:
            try:
                validate_runs(trial, Path("."))
            except UserError as err:
                raise UserError(f"--space {knob.text}: {err}") from None


def fixed_knobs(algo: str, sets: list[str]) -> tuple[str, list[str]]:
    """A sweep's --algo and --set as its algo and fixed knobs: the knobs in the --algo's brackets are fixed
    knobs, as --set's, and come first (config.split_algo); one given both ways with different values is
    refused, as `train` refuses it."""
    bare, from_algo = split_algo(algo)
    if from_algo:
        routed = ExperimentSpec(envs=["-"], algos=[bare], seeds=1, total_steps=1, sets=sets).runs(Path("."))[0]
        new_config(algo=algo, overrides=list(routed.overrides))
    return bare, [*from_algo, *sets]


def load_or_create_sweep(root: Path, sweep: SweepSpec) -> bool:
    """Record the sweep in DIR, or check that DIR holds this sweep; True when it is resumed."""
    from reflectrl.runs import atomic_write_bytes
    from reflectrl.runs.rundir import make_dir

    path = root / SWEEP_FILE
    if path.exists():
        old = read_json_object(path, "use another --out")
        diff = [k for k, v in asdict(sweep).items() if old.get(k) != v]
        if diff:
            raise UserError(f"--out {root} holds a different sweep (differs in: {', '.join(diff)}); repeat its "
                            "arguments to resume it (--trials may grow), or use another --out")
        return True
    if root.exists() and any(root.iterdir()):
        raise UserError(f"--out {root} exists and is not a sweep directory; choose another --out")
    make_dir(root)
    atomic_write_bytes(path, (json.dumps(asdict(sweep), indent=2) + "\n").encode())
    return False


def read_sweep(root: Path) -> tuple[SweepSpec, dict]:
    """A finished sweep's spec and best.json (for --baseline)."""
    try:
        spec = SweepSpec(**json.loads((root / SWEEP_FILE).read_text()))
        best = json.loads((root / BEST_FILE).read_text())
        if not isinstance(best, dict):
            raise TypeError(BEST_FILE)
    except (OSError, ValueError, TypeError):
        raise UserError(f"--baseline {root} is not a finished sweep (no readable {SWEEP_FILE} and {BEST_FILE}); "
                        "run 'reflectrl sweep' for the baseline first") from None
    return spec, best


# --------------------------------------------------------------------------- one trial

def trial_dir(root: Path, number: int) -> Path:
    return root / "trials" / f"{number:04d}"


def _mean_return_so_far(rows: list[dict], step: int) -> float:
    """The mean episodic return a run logged up to `step` (nan before its first episode)."""
    total = count = 0.0
    for row in rows:
        if row.get("global_step", 0) > step:
            break
        if row.get("episodic_return") is not None:
            n = row.get("episodes", 1)
            total, count = total + row["episodic_return"] * n, count + n
    return total / count if count else math.nan


class PruneCheck:
    """Reports a running trial's mean return so far to Optuna at every tenth of training
    that all its seeds have passed; True from `__call__` when `decide(step, value)` says to
    prune at the latest one."""

    def __init__(self, trial, run_paths: list[Path], total_steps: int, decide):
        self.trial, self.paths, self.decide = trial, run_paths, decide
        self.points = [total_steps * j // PRUNE_POINTS for j in range(1, PRUNE_POINTS)]
        self.pruned_at: int | None = None

    def __call__(self) -> bool:
        from reflectrl.runs.files import last_logged_step, read_logged_rows

        reached = min(last_logged_step(p) for p in self.paths)
        due = [s for s in self.points if s <= reached]
        if not due:
            return False
        self.points = [s for s in self.points if s > reached]
        rows = [read_logged_rows(p) for p in self.paths]
        latest = None
        for step in due:
            values = [v for v in (_mean_return_so_far(r, step) for r in rows) if math.isfinite(v)]
            if values:
                latest = (step, float(np.mean(values)))
                self.trial.report(latest[1], step)
        if latest is not None and self.decide(*latest):
            self.pruned_at = latest[0]
            return True
        return False


def below_median(study, warmup_steps: int, step: int, value: float) -> bool:
    """The median rule on the current value: prune when it is below the median of the completed
    trials' values at the same step (from the PRUNE_STARTUP_TRIALS-th completed trial on, after
    `warmup_steps`). Optuna's MedianPruner compares a trial's best value over its steps, which
    for a running mean is its noisy start."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    others = [t.intermediate_values[step] for t in done if step in t.intermediate_values]
    if len(done) < PRUNE_STARTUP_TRIALS or step < warmup_steps or not others:
        return False
    return value < float(np.median(others))


def _compare_argv(spec: ExperimentSpec, out: Path, backend: dict) -> list[str]:
    argv = ["compare", "--env", spec.envs[0], "--algos", spec.algos[0], "--seeds", str(spec.seeds),
            "--total-steps", str(spec.total_steps), "--out", str(out), "--no-report", "--no-progress"]
    if spec.wrapper:
        argv += ["--wrapper", spec.wrapper]
    if spec.sets:
        argv += ["--set", *spec.sets]
    for flag, value in (("--backend", backend.get("backend")), ("--workers", backend.get("workers")),
                        ("--ray-address", backend.get("ray_address"))):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _stop(proc: subprocess.Popen) -> None:
    """Stop a `compare` as Ctrl-C does (it stops its runs at their last checkpoint), and wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    proc.wait()


def run_compare(spec: ExperimentSpec, out: Path, backend: dict, should_stop) -> tuple[int, bool]:
    """Run one trial's experiment as `reflectrl compare` (its output in DIR/trials/NNNN.log);
    (exit code, whether should_stop stopped it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "reflectrl", *_compare_argv(spec, out, backend)]
    with open(out.with_suffix(".log"), "a") as log:
        log.write("$ reflectrl " + " ".join(cmd[3:]) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            while True:
                try:
                    return proc.wait(timeout=POLL_S), False
                except subprocess.TimeoutExpired:
                    if should_stop():
                        _stop(proc)
                        return proc.returncode, True
        except BaseException:  # Ctrl-C or SIGTERM on the sweep: the trial's runs stop too
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)  # a Ctrl-C at a terminal reached it already
            _stop(proc)
            raise


def trial_scores(out: Path) -> dict:
    """IQM over a finished trial's seeds of each run's final return and AUC (return units)."""
    from reflectrl.report import stats
    from reflectrl.report.analysis import load_experiment, run_scores

    scores = [run_scores(r) for r in load_experiment(out).finished]
    return {key: stats.iqm(np.array([[s[key]] for s in scores])) for key in ("final", "auc")}


def _log_tail(out: Path) -> str:
    try:
        lines = [x for x in out.with_suffix(".log").read_text().splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------- the study

@dataclass
class SweepResult:
    ran: int = 0            # trials this call ran (or resumed) to their end
    best: dict | None = None


def _open_study(root: Path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=f"sqlite:///{(root / STUDY_FILE).resolve()}", study_name=STUDY_NAME,
                               direction="maximize", pruner=optuna.pruners.NopPruner(), load_if_exists=True)


def _knob_text(knobs: list[Knob], params: dict) -> str:
    return " ".join(f"{k.key}={_short(params[k.key])}" for k in knobs)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_trial(study, trial, root: Path, sweep: SweepSpec, backend: dict, budget: int, prune: bool) -> str:
    """Run one trial to its end (complete, pruned or failed), tell Optuna, print one line."""
    import optuna

    spec, out, runs, head = _start_trial(study, trial, root, sweep, _finished(study), budget)
    if runs is None:
        return head
    warmup = int(PRUNE_WARMUP * sweep.total_steps)
    decide = functools.partial(below_median, study, warmup) if prune else (lambda step, value: False)
    check = PruneCheck(trial, [r.path for r in runs], sweep.total_steps, decide)
    code, stopped = run_compare(spec, out, backend, check)
    if stopped:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return f"{head} -> pruned at step {check.pruned_at:,} (mean return so far below the median){_best(study)}"
    if code != 0:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return f"{head} -> failed (see {out.with_suffix('.log')}): {_log_tail(out)}"
    return _complete_trial(study, trial, out, sweep, head)


def _start_trial(study, trial, root: Path, sweep: SweepSpec, done: int, budget: int):
    """(spec, its directory, its runs, the trial's line head); runs None, after telling Optuna the trial
    failed, where its knobs make a run that cannot start (the head then the whole line)."""
    import optuna

    from reflectrl.experiments.runner import validate_runs

    knobs = sweep.knobs()
    params = {k.key: k.suggest(trial) for k in knobs}
    spec, out = sweep.experiment(params), trial_dir(root, trial.number)
    head = f"trial {trial.number} ({done + 1}/{budget}): {_knob_text(knobs, params)}"
    try:
        return spec, out, validate_runs(spec, out), head
    except UserError as err:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return spec, out, None, f"{head} -> failed: {err}"


def _complete_trial(study, trial, out: Path, sweep: SweepSpec, head: str) -> str:
    """Tell Optuna a finished trial's objective (its scores kept as user attributes); its line."""
    scores = trial_scores(out)
    for key, value in scores.items():
        trial.set_user_attr(key, value)
    study.tell(trial, scores[sweep.objective])
    return f"{head} -> {sweep.objective} {_short(scores[sweep.objective])}{_best(study)}"


def _best(study) -> str:
    try:
        best = study.best_trial
    except ValueError:  # no trial completed yet
        return ""
    return f"; best so far {_short(best.value)} (trial {best.number})"


def _finished(study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name in _FINISHED)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM stops the sweep as Ctrl-C does (its running trial stops at its checkpoints)."""
    def interrupt(signum, frame):
        from reflectrl.runs.session import Terminated

        raise Terminated  # a KeyboardInterrupt: the same clean-up; the CLI exits 143, as train does

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sweep_lock(root: Path):
    from reflectrl.experiments.state import exclusive

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive(root))
        except UserError:
            raise UserError(f"another 'reflectrl sweep' is running on {root}; wait for it to finish (or stop it) "
                            "before resuming it") from None
        yield


def _at_most_zero(choice: str) -> bool:
    """Whether a choice() value is a number <= 0."""
    try:
        return float(choice) <= 0
    except ValueError:
        return False


def vectorised_keys(sweep: SweepSpec) -> list[str]:
    """Check that `sweep --vmap-trials` can train the sweep's trials as one program: a backend on which the
    trainer's form trains runs as one program (its TrainerSpec's groups_seeds: backend=jax), and a
    space of vectorisable knobs: PPO's (learning_rate only where no signal fits a network with it) and
    the signals' own (each JAX signal's vector_knobs, e.g. count.beta, calibration.alpha).
    Returns the space's keys."""
    from reflectrl.config import RunConfig
    from reflectrl.registry import trainer_forms, trainer_spec

    sets = dict(item.partition("=")[::2] for item in sweep.sets)
    trainer = parse_algo(sweep.algo).trainer
    if not trainer_spec(trainer, sets.get("backend", RunConfig.backend).strip()).groups_seeds:
        grouping = [backend for backend, form in trainer_forms(trainer).items() if form.groups_seeds]
        raise UserError("--vmap-trials trains a batch of trials as one compiled program: "
                        + (f"add --set backend={grouping[0]} (or drop --vmap-trials)" if grouping
                           else f"--algo {trainer} trains each run alone (drop --vmap-trials)"))
    # the knobs that form's program vectorises (the JAX PPO's)
    from reflectrl.trainers.ppo_jax.trainer import fits_at_learning_rate, positive_knobs, vectorisable_knobs

    keys = [k.key.removeprefix("ppo.") for k in sweep.knobs()]
    signals = parse_algo(sweep.algo).signals
    allowed = vectorisable_knobs(signals)
    other = [k for k in keys if k not in allowed]
    if other:
        raise UserError(f"--vmap-trials vectorises {', '.join(allowed)} here; the space also tunes "
                        f"{', '.join(other)}: drop --vmap-trials or tune those apart")
    positive = positive_knobs(signals)
    for knob in sweep.knobs():
        if knob.key not in positive:
            continue
        if any(_at_most_zero(c) for c in knob.choices) if knob.dist == "choice" else knob.low <= 0:
            raise UserError(f"--vmap-trials with {knob.text}: at {knob.key}=0 the signal has no reward stream, "
                            "another program; keep its range above 0, or tune it without --vmap-trials")
    if "learning_rate" in keys:
        fitting = fits_at_learning_rate(signals)
        if fitting:
            raise UserError(f"--vmap-trials with learning_rate in the space: {', '.join(fitting)} fit their "
                            "networks at lr_multiplier x learning_rate, a constant of the program; tune "
                            "learning_rate without --vmap-trials")
    return keys


def run_trial_batch(study, batch: list, root: Path, sweep: SweepSpec, budget: int) -> list[str]:
    """Run a batch of trials (sweep --vmap-trials) to their end as one program: each trial's runs
    in its own compare directory, all of them trained by one `reflectrl train-group` (their
    knobs vectorised); tell Optuna each trial's score. One line per trial."""
    import optuna

    from reflectrl.experiments.local import run_local, seed_groups
    from reflectrl.experiments.progress import Progress
    from reflectrl.experiments.spec import load_or_create
    from reflectrl.experiments.state import ExperimentResult, exclusive, runs_to_train

    knobs = sweep.knobs()
    done = _finished(study)
    lines, todo, members, result = [], [], [], ExperimentResult()
    with contextlib.ExitStack() as locks:
        for j, trial in enumerate(batch):
            spec, out, runs, head = _start_trial(study, trial, root, sweep, done + j, budget)
            if runs is None:
                lines.append(head)
                continue
            locks.enter_context(exclusive(out))
            load_or_create(out, spec)
            for run, state in runs_to_train(runs, result):
                run.path.parent.mkdir(parents=True, exist_ok=True)  # its log goes there
                todo.append((run, state))
            members.append((trial, out, runs, head))
        if todo:
            numbers = ", ".join(str(t.number) for t, *_ in members)
            logs = ", ".join(str(job[0][0].path.with_suffix(".log")) for job in seed_groups(todo))
            for _, out, _, _ in members:
                with open(out.with_suffix(".log"), "a") as log:
                    log.write(f"$ (--vmap-trials: trials {numbers} trained as one program; output in {logs})\n")
            bar = Progress(sweep.experiment({k.key: k.extremes()[0] for k in knobs}), [r for r, _ in todo], result,
                           False)
            try:
                run_local(todo, 1, result, bar)
            finally:
                bar.close()
    for trial, out, runs, head in members:
        failed = [(run, why) for run, why in result.failed if run in runs]
        if failed:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            lines.append(f"{head} -> failed (see {failed[0][0].path.with_suffix('.log')}): {failed[0][1]}")
            continue
        lines.append(_complete_trial(study, trial, out, sweep, head))
    return lines


def run_sweep(root: Path, sweep: SweepSpec, trials: int, backend: dict, prune: bool = True,
              echo=print, vmap_trials: int = 1) -> SweepResult:
    """Run trials until `trials` have ended, resuming a trial the last process left running;
    writes DIR/best.json and DIR/report/ (trials.csv, sensitivity plots). `vmap_trials` > 1:
    that many trials at a time as one program (run_trial_batch)."""
    from reflectrl.report.sweep_plots import write_sweep_report

    load_or_create_sweep(root, sweep)
    result = SweepResult()
    with _sweep_lock(root), _sigterm_as_interrupt():
        import optuna

        study = _open_study(root)
        if vmap_trials > 1:
            _run_batches(study, root, sweep, trials, vmap_trials, echo, result)
        else:
            for stale in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                # the process that ran it was stopped; its runs resume from their checkpoints
                echo(run_trial(study, optuna.trial.Trial(study, stale._trial_id), root, sweep, backend, trials,
                               prune))
                result.ran += 1
            while _finished(study) < trials:
                # a sampler seeded by the trial's number: the same suggestions whether or not the sweep was interrupted
                study.sampler = optuna.samplers.TPESampler(seed=SAMPLER_SEED + len(study.get_trials(deepcopy=False)))
                echo(run_trial(study, study.ask(), root, sweep, backend, trials, prune))
                result.ran += 1
        result.best = write_best(root, study, sweep, trials)
        write_sweep_report(root, sweep.knobs(), trial_rows(study, sweep.knobs()), result.best, sweep.objective)
    return result


def _run_batches(study, root: Path, sweep: SweepSpec, trials: int, size: int, echo, result: SweepResult) -> None:
    """Batches of `size` trials until `trials` have ended: first the trials the last process left
    running (their runs resume from their checkpoints), then new ones, asked together."""
    import optuna

    pending = [optuna.trial.Trial(study, t._trial_id)
               for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    while pending or _finished(study) < trials:
        batch, pending = pending[:size], pending[size:]
        while len(batch) < size and _finished(study) + len(batch) < trials:
            with warnings.catch_warnings():  # constant_liar is "experimental" in Optuna: not the user's concern
                warnings.simplefilter("ignore")
                study.sampler = optuna.samplers.TPESampler(
                    seed=SAMPLER_SEED + len(study.get_trials(deepcopy=False)), constant_liar=True)
            batch.append(study.ask())
        for line in run_trial_batch(study, batch, root, sweep, trials):
            echo(line)
        result.ran += len(batch)


def trial_rows(study, knobs: list[Knob]) -> list[dict]:
    """One row per trial: number, state, each knob, objective, final, auc (nan where none)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name.lower()}
        row.update({k.key: t.params.get(k.key) for k in knobs})
        row.update({"objective": t.value if t.value is not None and t.state.name == "COMPLETE" else math.nan,
                    "final": t.user_attrs.get("final", math.nan), "auc": t.user_attrs.get("auc", math.nan)})
        rows.append(row)
    return rows


def write_best(root: Path, study, sweep: SweepSpec, trials: int) -> dict | None:
    """DIR/best.json: the best trial's knobs and scores, and the sweep's budget (None before any
    trial completed)."""
    from reflectrl.runs import atomic_write_bytes

    try:
        best = study.best_trial
    except ValueError:
        return None
    knobs = sweep.knobs()
    data = {"trial": best.number, "objective": sweep.objective, "value": best.value,
            "final": best.user_attrs.get("final"), "auc": best.user_attrs.get("auc"),
            "knobs": {k.key: best.params[k.key] for k in knobs},
            "set": [set_item(k.key, best.params[k.key]) for k in knobs],
            "algo": sweep.algo, "env": sweep.env, "seeds": sweep.seeds, "total_steps": sweep.total_steps,
            "trials": trials, "dir": str(trial_dir(root, best.number).relative_to(root))}
    atomic_write_bytes(root / BEST_FILE, (json.dumps(data, indent=2) + "\n").encode())
    return data


# --------------------------------------------------------------------------- the re-run on fresh seeds

def rerun_spec(sweep: SweepSpec, best: dict, rerun_seeds: int, baseline: Path | None = None) -> ExperimentSpec:
    """The best knobs (and, with --baseline, the baseline sweep's best knobs as the `ppo` entry)
    on seeds K+1..K+M; with two entries each one's settings become ALGO.KEY items, so that
    each applies to its own entry only."""
    algos, sets = [sweep.algo], [*sweep.sets, *best["set"]]
    if baseline is not None:
        base, base_best = read_sweep(baseline)
        algos = [base.algo, sweep.algo]
        sets = ([f"{base.algo}.{item}" for item in base.overrides(base_best["knobs"])]
                + [f"{sweep.algo}.{item}" for item in sweep.overrides(best["knobs"])])
    return ExperimentSpec(envs=[sweep.env], algos=algos, seeds=rerun_seeds, total_steps=sweep.total_steps,
                          wrapper=sweep.wrapper, sets=sets, first_seed=sweep.seeds + 1)


def check_baseline(sweep: SweepSpec, trials: int, where: Path) -> None:
    """Tuned vs tuned only: the baseline is a finished sweep of plain ppo on the same env,
    steps, wrapper and seeds, with the same number of trials."""
    baseline = DEFAULT_TRAINER["control"]
    if sweep.algo == baseline:
        raise UserError(f"--baseline sets a tuned {baseline} beside a method's sweep, and this sweep is of "
                        f"{baseline} itself: drop --baseline here, and give this sweep's --out as --baseline to the "
                        "method's sweep")
    base, base_best = read_sweep(where)
    if base.algo != baseline:
        raise UserError(f"--baseline {where} is a sweep of --algo {base.algo}, not of plain {baseline}: give the "
                        f"--out of a 'reflectrl sweep --algo {baseline}' on the same --env, --total-steps, --seeds and "
                        "--trials")
    differ = [name for name in ("env", "total_steps", "wrapper", "seeds")
              if getattr(base, name) != getattr(sweep, name)]
    if differ:
        raise UserError(f"--baseline {where} differs from this sweep in {', '.join(differ)}; "
                        "sweep the baseline with the same --env, --total-steps, --wrapper and --seeds")
    if base_best["trials"] != trials:
        raise UserError(f"--baseline {where} had {base_best['trials']} trials and this sweep has {trials}: "
                        "give both the same --trials, so that the comparison is tuned vs tuned")


def prepare_rerun(out: Path, spec: ExperimentSpec, echo=print) -> None:
    """Clear DIR/best when it holds the re-run of another winner (the study grew since)."""
    from reflectrl.experiments.spec import SPEC_FILE

    path = out / SPEC_FILE
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except ValueError:
        old = {}
    if not isinstance(old, dict):
        old = {}
    new = spec.to_dict()
    if any(old.get(k) != new[k] for k in new if k != "seeds"):
        echo(f"the best knobs changed since {out} was run: re-running them there")
        shutil.rmtree(out)
