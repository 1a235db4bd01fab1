"""The host side of the JAX backend: S seeds of one configuration trained as one compiled
program (trainers/ppo_jax/ppo.py), each seed writing an ordinary run directory.

`JaxGroup` holds the seeds' stacked training state and advances it a chunk of iterations per
call of the program; between calls it writes each seed's rows (metrics.jsonl, TensorBoard),
its checkpoints (checkpoint.pt: the seed's state as numpy leaves, atomically replaced) and
honours SIGTERM at a chunk's end. Chunks are fixed by the config (never by where a run was
resumed), and an iteration past the end is computed but not applied, so a run killed at any
instant and resumed from its last checkpoint ends with the same parameters as one never
stopped. `JaxTrainer` is one seed of it, behind the interface `reflectrl train` drives.

A seed whose loss turns non-finite stops logging and checkpointing (its last good
checkpoint is kept and its run marked failed); the others go on.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections import deque

import numpy as np

from reflectrl.config import RunConfig, trainer_knobs
from reflectrl.errors import NonFiniteError, UserError
from reflectrl.runs.progress import RECENT_EPISODES, progress_bar, recent_return_text
from reflectrl.runs.rundir import MetricsLogger, RunDir
from reflectrl.runs.session import stop_requested, stopped

CHECKPOINT_FORMAT = "reflectrl-jax-ppo-1"
CHUNK_STEPS = 32_768  # env steps per seed per call of the program (at most; at least one iteration)
INT_METRICS = ("episodes", "unique_states", "unique_states_total", "achievements_total")


def knob_value(cfg: RunConfig, name: str):
    """A run's value of a vectorisable knob: PPO's `NAME` or a signal's `SIGNAL.KNOB`."""
    if "." in name:
        section, knob = name.split(".", 1)
        return getattr(cfg.sections[section], knob)
    return getattr(trainer_knobs(cfg), name)


def vectorisable_knobs(signal_names) -> tuple[str, ...]:
    """The knobs that may differ between the runs of one program: PPO's (ppo.VECTOR_KNOBS) and the
    signals' own (each JAX signal's vector_knobs, as SIGNAL.KNOB)."""
    from reflectrl.trainers.ppo_jax.ppo import VECTOR_KNOBS

    return VECTOR_KNOBS + _signal_knobs(signal_names, "vector_knobs")


def _signal_knobs(signal_names, kind: str) -> tuple[str, ...]:
    """SIGNAL.KNOB for each knob the named JAX signals list in their class attribute `kind`."""
    from reflectrl.trainers.ppo_jax.resolve import jax_signal_class, jax_signal_names

    have = jax_signal_names()
    return tuple(f"{name}.{knob}" for name in signal_names if name in have
                 for knob in getattr(jax_signal_class(name), kind))


def fits_at_learning_rate(signal_names) -> list[str]:
    """The signals that fit a network at lr_multiplier x learning_rate, a constant of the program: with
    them, learning_rate cannot differ between a program's runs."""
    from reflectrl.config import section_types

    return [name for name in signal_names if hasattr(section_types().get(name, object)(), "lr_multiplier")]


def varying_knobs(cfgs: list[RunConfig], signals=()) -> tuple[str, ...]:
    """The knobs whose values differ between a group's runs, which must otherwise differ only in their
    seed: the vectorisable ones (vectorisable_knobs)."""
    from reflectrl.config import add_algo_section
    from reflectrl.trainers.ppo_jax.ppo import VECTOR_KNOBS

    own = {s.name: tuple(s.vector_knobs) for s in signals}
    allowed = vectorisable_knobs([s.name for s in signals])

    def rest(cfg):
        add_algo_section(cfg)
        d = cfg.to_dict()
        d.pop("seed")
        d["ppo"] = {k: v for k, v in d.get("ppo", {}).items() if k not in VECTOR_KNOBS}
        d["sections"] = {name: {k: v for k, v in section.items() if k not in own.get(name, ())}
                         if isinstance(section, dict) else section for name, section in d.get("sections", {}).items()}
        return d

    first = rest(cfgs[0])
    if any(rest(cfg) != first for cfg in cfgs[1:]):
        raise UserError(f"the runs of one JAX group must differ only in their seed and in {', '.join(allowed)}")
    varying = tuple(k for k in allowed if len({knob_value(c, k) for c in cfgs}) > 1)
    for name in positive_knobs([s.name for s in signals]):
        if name in varying and any(knob_value(c, name) <= 0 for c in cfgs):
            raise UserError(f"{name} is 0 in some runs of this JAX group and not in others: at 0 the signal has no "
                            "reward stream, another program; train those runs apart")
    return varying


def positive_knobs(signal_names) -> tuple[str, ...]:
    """The vectorisable signal knobs whose 0 is another program (RND's int_coef: at 0 no reward stream):
    they may differ between a program's runs only where every run's is > 0."""
    return _signal_knobs(signal_names, "positive_knobs")


def _check_varying(varying: tuple[str, ...], signals) -> None:
    fitting = fits_at_learning_rate([s.name for s in signals])
    if "learning_rate" in varying and fitting:
        raise UserError(f"learning_rate differs between the runs of this JAX group, and {', '.join(fitting)} fit "
                        "their networks at lr_multiplier x learning_rate, a constant of the program: vectorise "
                        "ent_coef, vf_coef, clip_coef or max_grad_norm here, or train each learning_rate apart")


CACHE_ENV = "REFLECTRL_JAX_CACHE"  # the compiled programs' cache folder; "0" or "" turns it off


def enable_compilation_cache() -> str | None:
    """JAX's persistent compilation cache, so that the runs of an experiment, a sweep's trials and a
    resumed run load a program compiled before instead of compiling it again (10-40 s each here).
    The folder is $REFLECTRL_JAX_CACHE, by default ~/.cache/reflectrl/jax; "0" turns it off."""
    import os

    import jax

    folder = os.environ.get(CACHE_ENV, os.path.join(os.path.expanduser("~"), ".cache", "reflectrl", "jax"))
    if folder in ("", "0"):
        return None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None  # a read-only home: compile every time
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def chunk_length(iterations: int, target: int) -> int:
    """Iterations per call of the program: `target` or a little less where that divides the run
    (so the last chunk computes no iteration past the end), never more than the run."""
    target = min(target, iterations)
    for c in range(target, max(1, target // 2) - 1, -1):
        if iterations % c == 0:
            return c
    return target


def record_jax_version(runs: list[RunDir | None]) -> None:
    """The JAX version a run started with, in its run.json beside torch's (the compiled program's rounding
    and speed depend on it; report/provenance.py counts it)."""
    from importlib import metadata

    for run in runs:
        if run is not None and "jax_version" not in run.status():
            run.record(jax_version=metadata.version("jax"))


class JaxGroup:
    def __init__(self, cfgs: list[RunConfig], runs: list[RunDir | None]):
        import jax
        import jax.numpy as jnp

        from reflectrl.envs.jax_envs import make_env
        from reflectrl.trainers.ppo_jax import ppo
        from reflectrl.trainers.ppo_jax.resolve import build_signals

        enable_compilation_cache()
        self.cfgs, self.runs = cfgs, runs
        record_jax_version(runs)
        cfg = self.cfg = cfgs[0]
        self.knobs = trainer_knobs(cfg)
        self.env = make_env(cfg.env_id, cfg.env)
        self.signals = build_signals(cfg)
        varying = varying_knobs(cfgs, self.signals)
        _check_varying(varying, self.signals)
        self.batch_size = self.knobs.batch_size
        self.num_iterations = math.ceil(cfg.total_steps / self.batch_size)
        from reflectrl.runs.state_samples import snapshot_iterations

        self.setup = ppo.Setup(env=self.env, knobs=self.knobs, signals=self.signals,
                               total_iterations=self.num_iterations,
                               snapshots=tuple(snapshot_iterations(self.num_iterations, cfg.state_map_snapshots)),
                               varying=varying)
        self.chunk = chunk_length(self.num_iterations, max(1, min(CHUNK_STEPS // self.batch_size,
                                                                  cfg.checkpoint_every // self.batch_size)))
        self._jax, self._ppo = jax, ppo
        hyper = {k: jnp.asarray([knob_value(c, k) for c in cfgs], jnp.float32) for k in varying}
        self.states = ppo.make_init(self.setup)(jnp.stack([ppo.seed_key(c.seed) for c in cfgs]), hyper)
        self.iteration = 0
        self.recent = [deque(maxlen=RECENT_EPISODES) for _ in cfgs]  # the returns of each seed's last episodes
        self.failed: dict[int, str] = {}
        self.loggers: list[MetricsLogger | None] = [None] * len(cfgs)
        self._program = None
        self.compile_seconds = 0.0

    # ------------------------------------------------------------------ state

    @property
    def global_step(self) -> int:
        return self.iteration * self.batch_size

    def _saved(self) -> dict:
        """The part of the stacked state a checkpoint keeps: all but the varying knobs ("hyper"), which
        come from the runs' configs, so that a run's checkpoint loads in any group (alone, with other
        trials, with a subset of its own) and has the layout it had before knobs were vectorised."""
        return {k: v for k, v in self.states.items() if k != "hyper"}

    def host_leaves(self) -> list[np.ndarray]:
        """The saved state's leaves on the host, in one transfer (indexing device arrays leaf by leaf
        compiles a gather per leaf shape: dozens of programs)."""
        return [np.asarray(leaf) for leaf in self._jax.device_get(self._jax.tree_util.tree_leaves(self._saved()))]

    def seed_state(self, i: int, leaves: list[np.ndarray] | None = None) -> dict:
        leaves = self.host_leaves() if leaves is None else leaves
        state = {"format": CHECKPOINT_FORMAT, "config": self.cfgs[i].to_dict(), "global_step": self.global_step,
                 "iteration": self.iteration, "leaves": [leaf[i].copy() for leaf in leaves],
                 "recent_returns": list(self.recent[i])}
        if self.knobs.norm_obs:  # as the torch PPO's checkpoint: env 0's statistics, which eval freezes
            rms = self._jax.device_get(self.states["normalizer"]["obs"])
            state["obs_normalizer"] = {"mean": np.asarray(rms["mean"][i, 0]), "var": np.asarray(rms["var"][i, 0]),
                                       "count": float(rms["count"][i, 0])}
        return state

    def load_seed_states(self, states: list[dict]) -> None:
        import jax.numpy as jnp

        steps = {s.get("iteration") for s in states}
        if len(steps) != 1:
            raise UserError("the runs of one JAX group must resume from the same iteration")
        for state in states:
            if state.get("format") != CHECKPOINT_FORMAT:
                raise UserError("this checkpoint was not written by backend=jax (or by another version of it); "
                                "resume it with the backend that wrote it")
        leaves, treedef = self._jax.tree_util.tree_flatten(self._saved())
        saved = [s["leaves"] for s in states]
        if any(len(s) != len(leaves) for s in saved):
            raise UserError("the checkpoint does not fit this run's program (written by another reflectrl?)")
        stacked = [jnp.asarray(np.stack([s[j] for s in saved])).astype(leaf.dtype) for j, leaf in enumerate(leaves)]
        restored = self._jax.tree_util.tree_unflatten(treedef, stacked)
        if "hyper" in self.states:
            restored["hyper"] = self.states["hyper"]  # the runs' knobs, from their configs
        self.states = restored
        self.iteration = int(states[0]["iteration"])
        self.recent = [deque(s.get("recent_returns", []), maxlen=RECENT_EPISODES) for s in states]

    def params_sha256(self, i: int) -> str:
        """A hash of seed i's policy parameters, in path order (trainers/policies.params_sha256's role)."""
        h = hashlib.sha256()
        flat = self._jax.tree_util.tree_flatten_with_path(self._jax.device_get(self.states["params"]))[0]
        for path, leaf in sorted(flat, key=lambda kv: self._jax.tree_util.keystr(kv[0])):
            h.update(self._jax.tree_util.keystr(path).encode())
            h.update(np.ascontiguousarray(np.asarray(leaf)[i]).tobytes())
        return h.hexdigest()

    def save_checkpoints(self) -> None:
        """Every seed's checkpoint, in two phases so that the set stays at one iteration whenever a kill
        comes: all are staged (written whole beside the current ones), then put in place; a resume
        completes a put-in-place that a kill cut short (settle_checkpoints)."""
        leaves = self.host_leaves()
        live = [(i, run) for i, run in enumerate(self.runs) if run is not None and i not in self.failed]
        for i, run in live:
            run.stage_checkpoint(self.seed_state(i, leaves))
        for _, run in live:
            run.commit_checkpoint()

    # ------------------------------------------------------------------ training

    def program(self):
        if self._program is None:
            self._program = self._ppo.make_program(self.setup, self.chunk, total=self.num_iterations)
        return self._program

    def _rows(self, rows: dict, first: int, count: int, seconds: float) -> list[list[dict]]:
        host = {k: np.asarray(v) for k, v in rows.items()}
        out = []
        for i in range(len(self.cfgs)):
            seed_rows = []
            for j in range(count):
                it = first + j + 1
                row = {"global_step": it * self.batch_size, "iteration": it}
                for key, values in host.items():
                    v = values[i, j]
                    if key == "first_reward_step":
                        row[key] = int(v) if v >= 0 else None
                    elif key in INT_METRICS:
                        row[key] = int(v)
                    else:
                        f = float(v)
                        row[key] = f if math.isfinite(f) else None
                row["steps_per_second"] = count * self.batch_size / seconds
                seed_rows.append(row)
            out.append(seed_rows)
        return out

    def record_snapshots(self, before: int) -> None:
        """Hand the state-map snapshots taken in iterations (before, self.iteration] to each seed's
        StateSampler (runs/state_samples.py: it samples the rows and rewrites state_samples.npz)."""
        from reflectrl.runs.state_samples import StateSampler

        due = [(slot, it) for slot, it in enumerate(self.setup.snapshots) if before < it <= self.iteration]
        if not due:
            return
        snaps = {k: np.asarray(v) for k, v in self._jax.device_get(self.states["snapshots"]).items()}
        for i, run in enumerate(self.runs):
            if run is None or i in self.failed:
                continue
            sampler = StateSampler(run.path, self.cfgs[i].seed, self.num_iterations, self.cfg.state_map_snapshots)
            for slot, it in due:
                terms = {k[5:]: v[i, slot] for k, v in snaps.items() if k.startswith("term:")}
                obs = snaps["obs"][i, slot] if "obs" in snaps else np.zeros(snaps["rewards"][i, slot].shape + (65,))
                sampler.record(it, int(snaps["global_step"][i, slot]), obs,
                               snaps["state_keys"][i, slot].astype(np.int64), snaps["rewards"][i, slot], terms)

    def open_loggers(self) -> None:
        for i, run in enumerate(self.runs):
            if run is not None and self.loggers[i] is None:
                self.loggers[i] = MetricsLogger(run, resume_step=self.global_step)

    def close(self) -> None:
        for logger in self.loggers:
            if logger is not None:
                logger.close()
        self.loggers = [None] * len(self.cfgs)

    def train(self, progress: bool = True, on_failed=None) -> None:
        fresh = self.iteration == 0
        self.open_loggers()
        if fresh:
            self.save_checkpoints()  # a good checkpoint before the first update
        total = self.num_iterations * self.batch_size
        bar = progress_bar(total, "env steps", initial=self.global_step, enabled=progress, smoothing=0.3)
        program = self.program()
        try:
            while self.iteration < self.num_iterations:
                before = self.global_step
                start = time.perf_counter()
                states, rows = program(self.states, self.iteration)
                rows = {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in rows.items()}  # (S, chunk)
                ended = rows.pop(self._ppo.ENDED_RETURNS)  # (S, chunk, RECENT_EPISODES): not a metric
                self._jax.block_until_ready(states)
                seconds = time.perf_counter() - start
                if self.iteration == 0 or self.compile_seconds == 0.0:
                    self.compile_seconds = seconds  # the first call compiles (reported apart by the benchmarks)
                count = min(self.chunk, self.num_iterations - self.iteration)
                host_rows = self._rows(rows, self.iteration, count, seconds)
                self.states = states
                for i, seed_rows in enumerate(host_rows):
                    if i in self.failed:
                        continue
                    for j, row in enumerate(seed_rows):
                        loss = row.get("loss")
                        if loss is None:
                            self.failed[i] = str(NonFiniteError("loss", row["global_step"]))
                            if on_failed is not None:
                                on_failed(i, self.failed[i])
                            break
                        if self.loggers[i] is not None:
                            self.loggers[i].log(row)
                        self.recent[i].extend(float(r) for r in ended[i, j] if np.isfinite(r))
                self.iteration += count
                self.record_snapshots(before // self.batch_size)
                bar.update(self.global_step - before)
                done = self.iteration >= self.num_iterations
                saved = done or self.global_step // self.cfg.checkpoint_every > before // self.cfg.checkpoint_every
                if saved:
                    self.save_checkpoints()
                if len(self.failed) == len(self.cfgs):
                    break
                if stop_requested() and not done:
                    if not saved:
                        self.save_checkpoints()  # between chunks the state is whole: nothing is lost
                    raise stopped()
        finally:
            bar.close()
            self.close()


class JaxTrainer:
    """One run of backend=jax behind the interface `reflectrl train` drives (runs/session.py)."""

    unit = "env steps"  # what global_step counts (the closing line of an interrupted run)

    def __init__(self, cfg: RunConfig, run: RunDir | None):
        self.cfg, self.run = cfg, run
        self.group = JaxGroup([cfg], [run])

    @property
    def global_step(self) -> int:
        return self.group.global_step

    @property
    def recent_returns(self) -> list:
        return list(self.group.recent[0])

    def load_state_dict(self, state: dict) -> None:
        self.group.load_seed_states([state])

    def state_dict(self) -> dict:
        return self.group.seed_state(0)

    def params_sha256(self) -> str:
        return self.group.params_sha256(0)

    def train(self, progress: bool = True) -> None:
        self.group.train(progress)
        if self.group.failed:
            raise NonFiniteError("loss", self.global_step)

    def close(self) -> None:
        self.group.close()

    def finish(self, run: RunDir) -> None:
        """The run's end (`reflectrl train`'s, as EnvStepTrainer.finish): its status, its signals' end-of-run
        steps, one line saying what it reached."""
        finish_run(self.group, 0, run)


def finish_run(group: JaxGroup, i: int, run: RunDir) -> None:
    """A group's run i finished: its status, its signals' end-of-run pictures, the one-line summary."""
    from reflectrl.registry import finish_signals

    cfg = group.cfgs[i]
    run.set_status("finished", global_step=group.global_step, params_sha256=group.params_sha256(i))
    finish_signals(cfg.algo, "control", run.path)
    print(f"finished {cfg.algo} on {cfg.env_id} (backend=jax, seed {cfg.seed}): {group.global_step} steps, "
          f"{recent_return_text(group.recent[i])}; run: {run.path}")


def settle_checkpoints(runs: list[RunDir], states: list[dict | None]) -> list[dict]:
    """The checkpoints a group resumes from (`states`: each run's committed checkpoint, None where it has
    only a staged one). A kill between two of save_checkpoints' commits leaves some runs one checkpoint
    behind (or, at the first checkpoint, with none) and the next one staged: those are committed, so that
    the group resumes from one iteration; staged checkpoints no run needs (a kill while staging) are
    discarded. Where the iterations still differ (a seed that failed, seeds added to the entry, a group
    checkpointed before checkpoints were staged), they are returned as they are, and train_group resumes
    each iteration's runs as a group of their own."""
    staged = [run.staged_checkpoint() for run in runs]
    known = [s.get("iteration", -1) for s in states if s is not None]
    latest = max(known) if known else max(s.get("iteration", -1) for s in staged if s is not None)
    settled = []
    for run, state, next_state in zip(runs, states, staged, strict=True):
        behind = state is None or state.get("iteration") != latest
        if behind and next_state is not None and next_state.get("iteration") == latest:
            run.commit_checkpoint(next_state["global_step"])
            state = next_state
        else:
            run.discard_staged_checkpoint()
        if state is None:
            raise UserError(f"no checkpoint in {run.path} to resume from (none, or only a staged one of another "
                            "iteration); delete the run directory and train it again")
        settled.append(state)
    return settled


def train_group(items: list[tuple[str, RunConfig | None, list[str]]], progress: bool = False) -> int:
    """`reflectrl train-group`: train several runs of one configuration (differing only in their
    seed, and in the knobs a program vectorises) as one program. Each item is (run directory, its
    resolved config for a new run or None to resume it, the `reflectrl train` arguments that made
    it). Returns the exit code (0 when every run finished)."""
    from reflectrl.errors import EXIT_FAILED
    from reflectrl.runs.session import open_to_resume, sigterm_stops_training

    cfgs, runs, states = [], [], []
    try:
        for path, cfg, argv in items:
            if cfg is None:
                run = open_to_resume(path, [], "control")
                if run is None:
                    continue
                cfg = RunConfig.from_dict(run.config())
                states.append(run.load_checkpoint() if run.has_checkpoint() else None)  # None: staged only
                run.set_status("running")
            else:
                run = RunDir.create(path, cfg.to_dict(), command=["reflectrl", "train", *argv])
            cfgs.append(cfg)
            runs.append(run)
        if not cfgs:
            return 0
        if states and len(states) != len(cfgs):
            raise UserError("a JAX group resumes all its runs or none")
        parts = [list(range(len(cfgs)))]
        if states:
            states = settle_checkpoints(runs, states)
            iterations = sorted({s.get("iteration") for s in states})
            parts = [[i for i, s in enumerate(states) if s.get("iteration") == it] for it in iterations]
            if len(parts) > 1:
                where = "; ".join(f"seeds {', '.join(str(cfgs[i].seed) for i in part)} at iteration {it}"
                                  for it, part in zip(iterations, parts, strict=True))
                print(f"reflectrl: warning: this group's checkpoints are at different iterations ({where}); each "
                      "iteration's seeds resume as a group of their own, vmapped with fewer seeds, so their float "
                      "rounding is not the one group's", file=sys.stderr)
        failed = False
        with sigterm_stops_training():  # one for every part: a SIGTERM during one stops the rest too
            for n, part in enumerate(parts):
                try:
                    if n and stop_requested():
                        raise stopped()
                    failed |= _train_one_group([cfgs[i] for i in part], [runs[i] for i in part],
                                               [states[i] for i in part] if states else [], progress)
                except BaseException as err:
                    for later in parts[n + 1:]:  # not started: they stay at their checkpoints
                        for i in later:
                            runs[i].set_status("interrupted", global_step=states[i]["global_step"],
                                               reason=f"{type(err).__name__} in another part of the group")
                    raise
        return EXIT_FAILED if failed else 0
    finally:
        for run in runs:
            run.unlock()


def _train_one_group(cfgs: list[RunConfig], runs: list[RunDir], states: list[dict], progress: bool) -> bool:
    """Train runs as one program (from their checkpoints where `states` are given); True where one failed.
    Inside the caller's sigterm_stops_training block."""

    def failed(i, reason):
        runs[i].set_status("failed", reason=reason)
        print(f"reflectrl: error: {runs[i].path}: {reason}", file=sys.stderr)

    group = None
    try:
        group = JaxGroup(cfgs, runs)
        if states:
            group.load_seed_states(states)
        group.train(progress=progress, on_failed=failed)
    except KeyboardInterrupt:
        for i, run in enumerate(runs):
            if group is None or i not in group.failed:
                # the step it resumes from: its checkpoint's (written where a graceful stop stopped)
                step = run.checkpoint_step if run.checkpoint_step is not None else (
                    states[i]["global_step"] if states else 0)
                run.set_status("interrupted", global_step=step)
        raise
    except Exception as err:  # a crash says so in every run's status; each resumes from its checkpoint
        for i, run in enumerate(runs):
            if group is None or i not in group.failed:
                run.set_status("failed", reason=f"{type(err).__name__}: {err}"[:500])
        raise
    for i, run in enumerate(runs):
        if i not in group.failed:
            finish_run(group, i, run)
    return bool(group.failed)
