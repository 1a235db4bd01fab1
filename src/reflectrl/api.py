"""reflectrl from Python, in the conventions SB3 and TRL users know:

    import reflectrl

    run = reflectrl.train("ppo+calibration", "CartPole-v1", 50_000, seed=1, calibration={"alpha": 0.05})
    action = run.policy.predict(obs)              # one observation, or a batch (N, ...)
    print(run.evaluate(episodes=10)["mean_return"])
    run.save("runs/cartpole")                     # a run directory: `reflectrl eval runs/cartpole` reads it
    run = reflectrl.load("runs/cartpole")

A run started here goes through the code `reflectrl train` runs (config.new_config and its checks, trainers/
resolve.py, runs/session.py's train_new_run / resume_run, training.py's make_trainer and finish): the same
run directory, status, `params_sha256` and end-of-run steps, and the same one-line UserError for a bad knob.

- `env`: an id (a registered one, Gymnasium's MODULE:ID, or MODULE:NAME naming a class or factory of an env),
  a `gymnasium.Env` instance, a `VectorEnv` (its single env and width: reflectrl builds its own vector env) or a
  callable that returns an Env. An object becomes an id the CLI can make again where it can (envs/objects.py:
  its class or factory as MODULE:NAME, its constructor's keywords as the run's `env` knobs); where it cannot
  (a lambda, a class defined in __main__ or in a function) the run trains all the same, run.json's warnings say
  why, and `reflectrl eval` / `--resume` refuse it in one line: `reflectrl.load(DIR, env=...)` reads it.
- knobs: what `--set` takes, as keywords: `learning_rate=1e-3`, `calibration={"alpha": 0.05}`,
  `**{"calibration.alpha": 0.05}`, `ppo={"num_envs": 8}`, `env={"size": 12}`; bracket knobs in `algo`
  (`"ppo+calibration[mode=uncertainty]"`) as on the command line.
- `out=None`: the run lives in a temporary directory, removed when its Run is garbage collected or Python
  exits; `run.save(path)` keeps a copy.
- callbacks: `f(run, row)` (or an object's `on_iteration(run, row)`) after each iteration, with its metrics
  row; returning False or raising StopTraining stops training there with a checkpoint (the run is then
  `interrupted`, as after Ctrl-C) and `run.resume()` continues it. `run.trainer` is the live trainer meanwhile.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from reflectrl.errors import EXIT_FAILED, UserError
from reflectrl.trainers.base import StopTraining
from reflectrl.training import trainer_form

__all__ = ["train", "load", "compare", "Run", "Policy", "StopTraining", "set_items"]

RESUME_COMMAND = "reflectrl train"  # what the closing line of an interrupted run says continues it


# --------------------------------------------------------------------------- knobs as --set items

def set_items(knobs: dict[str, Any]) -> list[str]:
    """Keyword knobs as the `--set KEY=VALUE` items the CLI takes, in order: `NAME=v` (a knob of the trainer or
    the run), `SECTION.NAME=v`, and `SECTION={NAME: v, ...}` (a signal's section, the trainer's by its name, or
    `env`: the env constructor's keywords)."""
    items = []
    for key, value in knobs.items():
        if isinstance(value, dict):
            items += [f"{key}.{name}={_text(f'{key}.{name}', v)}" for name, v in value.items()]
        else:
            items.append(f"{key}={_text(key, value)}")
    return items


def _text(key: str, value: Any) -> str:
    """A value as the text --set reads back into it (an env's keyword: JSON, which env.NAME reads first)."""
    from reflectrl.overrides import value_text

    return json.dumps(value) if key.startswith("env.") else value_text(value)


def _env_source(env):
    """An env id, or an env object as the id, keywords and width it is recorded by (envs/objects.py)."""
    from reflectrl.envs.objects import EnvSource, env_source

    return EnvSource(env, {}) if isinstance(env, str) else env_source(env)


# --------------------------------------------------------------------------- train

def train(algo: str, env, total_steps: int, *, seed: int | None = None, out: str | Path | None = None,
          backend: str | None = None, wrapper: str | None = None, callbacks: Iterable | Callable = (),
          progress: bool = False, **knobs) -> Run:
    """Train `algo` (TRAINER[+SIGNAL...], knobs in brackets allowed) on `env` for `total_steps` env steps, as
    `reflectrl train` does, and return its Run. seed, backend (gymnasium, envpool, jax) and wrapper: the CLI's
    --seed, --set backend=, --wrapper (None: their defaults); out: the run directory to create (None: a temporary
    one); knobs: --set items as keywords (set_items). A bad knob raises the CLI's one-line UserError."""
    from reflectrl.config import new_config
    from reflectrl.trainers.resolve import resolve_config

    calls = _callbacks(callbacks)
    source = _env_source(env)
    env_id, why_not = source.env_id, source.why_not
    env_items = [f"env.{k}={json.dumps(v)}" for k, v in source.kwargs.items()]
    env_items += [f"num_envs={source.num_envs}"] if source.num_envs is not None else []
    sets = [*env_items, *set_items(knobs), *([f"backend={backend}"] if backend is not None else [])]
    cfg = new_config(algo=algo, env_id=env_id, seed=seed, total_steps=total_steps, wrapper=wrapper, overrides=sets)
    if calls and not trainer_form(cfg).callbacks:
        raise UserError(f"callbacks: backend={cfg.backend} trains its iterations in compiled chunks, with no Python "
                        "between them; train with backend=gymnasium, or read run.metrics afterwards")
    cfg = resolve_config(cfg)  # the env probed, the trainer's per-env defaults: as `reflectrl train` does
    if why_not is not None:
        warnings.warn(f"env: the run's env {env_id} is an object only this process can make ({why_not}): "
                      "reflectrl eval and train --resume will refuse it; reflectrl.load(DIR, env=...) reads it",
                      UserWarning, stacklevel=2)
    temporary = out is None
    path = Path(tempfile.mkdtemp(prefix="reflectrl-run-")) if temporary else Path(out)
    run = Run(path, temporary=temporary)
    command = ["reflectrl", "train", "--algo", algo, "--env", env_id, "--seed", str(cfg.seed), "--total-steps",
               str(cfg.total_steps), "--out", str(path), *(["--wrapper", wrapper] if wrapper else []),
               *(["--set", *sets] if sets else [])]

    def build(run_dir):
        from reflectrl.training import make_trainer

        if why_not is not None:
            run_dir.add_warning(f"no other process can make env {env_id}: {why_not}")
        return run._with_callbacks(make_trainer(cfg, run_dir), calls)

    from reflectrl.runs.session import train_new_run
    from reflectrl.training import finish

    try:
        code = train_new_run(str(path), cfg.to_dict(), build, finish, progress=progress,
                             resume_command=RESUME_COMMAND, command=command)
    except BaseException:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
        raise
    run._ended(code)
    return run


def _callbacks(callbacks) -> list[Callable]:
    """Each callback as a callable of (run, row): a function, or an object's on_iteration."""
    if callable(callbacks) or hasattr(callbacks, "on_iteration"):
        callbacks = [callbacks]
    calls = []
    for cb in callbacks or ():
        method = getattr(cb, "on_iteration", None)
        if method is None and not callable(cb):
            raise UserError(f"callbacks: a {type(cb).__name__} is neither callable nor has an on_iteration(run, row) "
                            "method")
        calls.append(method or cb)
    return calls


# --------------------------------------------------------------------------- a run

class Run:
    """A run directory (the `--out` of `reflectrl train`) in Python: its config, metrics, policy and status;
    evaluate, save, resume it. `trainer`: the live trainer while it trains (in callbacks), else None."""

    def __init__(self, path: str | Path, *, temporary: bool = False):
        self.path = Path(path)
        self.trainer = None
        self._stop_asked = False
        self._policy: Policy | None = None
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True) if temporary else None

    def __repr__(self) -> str:
        status = self.status
        return (f"Run({str(self.path)!r}, {status.get('status', '?')} at step {status.get('global_step', 0):,}"
                f"{', temporary' if self._finalizer is not None else ''})")

    # -- what it holds

    def _dir(self):
        from reflectrl.runs import RunDir

        return RunDir.open(self.path, kind="control")

    @property
    def config(self):
        """The run's RunConfig (config.json, every default filled in)."""
        from reflectrl.config import RunConfig

        return RunConfig.from_dict(self._dir().config())

    @property
    def status(self) -> dict:
        """run.json: status (running, finished, interrupted, failed), global_step, params_sha256, ..."""
        return self._dir().status()

    @property
    def global_step(self) -> int:
        return int(self.status.get("global_step", 0))

    @property
    def params_sha256(self) -> str | None:
        """The hash of the final policy's parameters (a finished run's; None before)."""
        return self.status.get("params_sha256")

    @property
    def metrics(self) -> list[dict]:
        """The metrics rows (metrics.jsonl), one per iteration."""
        from reflectrl.runs.rundir import METRICS, read_metrics

        return read_metrics(self.path) if (self.path / METRICS).exists() else []

    @property
    def policy(self) -> Policy:
        """The policy of the latest checkpoint (reloaded when a newer one is written)."""
        run_dir = self._dir()
        if self._policy is None or self._policy._mtime != _checkpoint_mtime(run_dir):
            self._policy = Policy(run_dir)
        return self._policy

    # -- what it does

    def evaluate(self, episodes: int = 10, env=None, deterministic: bool = True, seed: int | None = None,
                 max_steps: int | None = None) -> dict:
        """`reflectrl eval`'s result (mean_return, returns, params_sha256, ...) over `episodes` fresh episodes of
        the latest checkpoint's policy; `env`: another env (id or object, as train takes) to evaluate in."""
        from reflectrl.evaluate import evaluate

        source = _env_source(env) if env is not None else None
        return evaluate(str(self.path), episodes=episodes, deterministic=deterministic, seed=seed,
                        max_steps=max_steps, env_id=source and source.env_id, env_kwargs=source and source.kwargs)

    def save(self, path: str | Path) -> Path:
        """Copy the run directory to `path` (a new or empty directory), which the CLI and load() read."""
        dest = Path(path)
        if dest.resolve() == self.path.resolve():
            return dest
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise UserError(f"save: {dest} exists and is not an empty directory; choose another path")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    def resume(self, total_steps: int | None = None, *, callbacks: Iterable | Callable = (),
               progress: bool = False) -> Run:
        """Continue training from the latest checkpoint, as `reflectrl train --resume` does, to the run's budget
        or to `total_steps` (a larger budget: it replaces the saved one, a finished run trains on; schedules
        over the budget, such as anneal_lr's, stretch to the new one from here)."""
        from reflectrl.config import RunConfig
        from reflectrl.runs.session import resume_run
        from reflectrl.training import finish, make_trainer

        if total_steps is not None:
            self._extend(total_steps)
        calls = _callbacks(callbacks)

        def build(run_dir):
            return self._with_callbacks(make_trainer(RunConfig.from_dict(run_dir.config()), run_dir), calls)

        self._stop_asked = False
        code = resume_run(str(self.path), [], "control", build, finish, progress=progress,
                          resume_command=RESUME_COMMAND)
        self._ended(code)
        return self

    # -- its training

    def _extend(self, total_steps: int) -> None:
        from reflectrl.config import check_budget

        run_dir = self._dir()
        config = run_dir.config()
        check_budget(total_steps, "resume(total_steps=...)", "env steps")
        if total_steps < config["total_steps"]:
            raise UserError(f"resume(total_steps={total_steps:,}): the run trains to {config['total_steps']:,} "
                            "already; give a larger budget, or none to finish this one")
        if total_steps == config["total_steps"]:
            return
        if run_dir.is_locked():
            raise UserError(f"{self.path} is being trained by another process; wait for it to finish")
        run_dir.write_json("config.json", {**config, "total_steps": total_steps})
        if run_dir.status().get("status") == "finished":
            run_dir.set_status("interrupted", global_step=run_dir.status().get("global_step", 0))

    def _with_callbacks(self, trainer, calls: list[Callable]):
        self.trainer = trainer
        if not calls:
            return trainer

        def call(callback):
            def after_iteration(_trainer, row):
                try:
                    answer = callback(self, row)
                except StopTraining:
                    self._stop_asked = True
                    raise
                if answer is False:
                    self._stop_asked = True
                return answer
            return after_iteration

        trainer.callbacks = [call(c) for c in calls]
        return trainer

    def _ended(self, code: int) -> None:
        """After train_new_run / resume_run: a failed run raises; an interrupted one raises KeyboardInterrupt
        unless a callback asked to stop (then it returns, resumable)."""
        self.trainer = None
        if code == 0 or self._stop_asked:
            return
        status = self.status
        if code == EXIT_FAILED or status.get("status") == "failed":
            raise RuntimeError(f"run {self.path} failed: {status.get('reason', 'see the messages above')}")
        raise KeyboardInterrupt(f"run {self.path} interrupted at step {status.get('global_step', 0):,}; "
                                "run.resume() continues it")


def _checkpoint_mtime(run_dir) -> float | None:
    path = run_dir.checkpoint_path
    return path.stat().st_mtime_ns if path.is_file() else None


def load(path: str | Path, env=None) -> Run:
    """The run directory at `path` (of `reflectrl train` or reflectrl.train). `env`: the env object of a run
    trained on one that no other process can make (its id object:...), to make it again in this process."""
    run = Run(path)
    env_id = run._dir().config().get("env_id", "")
    if env is not None:
        from reflectrl.envs.objects import OBJECT_MODULE, register_object

        if not env_id.startswith(f"{OBJECT_MODULE}:"):
            raise UserError(f"load(env=...): the run's env {env_id} is made from its id; to evaluate in another "
                            "env, give it to run.evaluate(env=...)")
        register_object(env_id, env)
    return run


# --------------------------------------------------------------------------- a policy

class Policy:
    """A run's policy at its latest checkpoint, acting on observations as its env gives them: the observation
    transforms of evaluation (flattening, MiniGrid's image, the frozen normaliser) are applied here. A
    backend=jax run's acts on its JAX env's flat observations."""

    def __init__(self, run_dir):
        from reflectrl.config import RunConfig

        self._mtime = _checkpoint_mtime(run_dir)
        cfg = RunConfig.from_dict(run_dir.config())
        self._transforms: list = []
        self.recurrent = False  # a policy with a memory (policy=gru, lstm): predict takes and gives it
        if not trainer_form(cfg).load_policy:  # a compiled trainer (backend=jax): its own actor
            self._jax_actor(cfg, run_dir.load_checkpoint())
        else:
            self._torch_actor(run_dir)

    def _torch_actor(self, run_dir) -> None:
        import torch

        from reflectrl.envs import is_continuous
        from reflectrl.evaluate import eval_env, load_policy
        from reflectrl.trainers.policies import params_sha256

        cfg, agent, state = load_policy(run_dir)
        self.recurrent = getattr(agent, "recurrent", False)
        if getattr(agent, "observe", None) is not None and not self.recurrent:
            raise UserError(f"predict: a {cfg.algo} agent keeps a state of its own between steps (its sub-goal); "
                            "evaluate it with run.evaluate()")
        self.global_step = int(state["global_step"])
        self.params_sha256 = params_sha256(agent)
        env = eval_env(cfg, state)
        self.action_space = env.action_space
        continuous = is_continuous(self.action_space)
        wrappers, inner = [], env
        while isinstance(inner, gym.Wrapper):
            if isinstance(inner, gym.ObservationWrapper):
                wrappers.append(inner)
            inner = inner.env
        self._transforms = wrappers[::-1]  # innermost first
        self.observation_space = wrappers[-1].env.observation_space if wrappers else env.observation_space
        generator = torch.Generator().manual_seed(cfg.seed)

        def numpy_action(action) -> np.ndarray:
            if continuous:
                return np.clip(action.numpy(), self.action_space.low, self.action_space.high)
            return action.numpy().astype(np.int64)

        def act(x: np.ndarray, deterministic: bool) -> np.ndarray:
            with torch.no_grad():
                t = torch.as_tensor(x)
                action = agent.deterministic_action(t) if deterministic else agent.act(t, generator)[0]
            return numpy_action(action)

        def act_recurrent(x: np.ndarray, state, episode_start, deterministic: bool):
            from reflectrl.trainers.policies import sample

            n = len(x)
            if state is None:
                memory = agent.initial_memory(n)
            else:
                memory = torch.as_tensor(np.asarray(state, dtype=np.float32))
                if tuple(memory.shape) != (agent.memory_rows, n, agent.memory_width):
                    raise UserError(f"predict: a state of shape {tuple(memory.shape)}; this policy's is "
                                    f"({agent.memory_rows}, {n}, {agent.memory_width}) for {n} observation(s) "
                                    "(None at the first step)")
            starts = torch.zeros(n, dtype=torch.bool) if episode_start is None else torch.as_tensor(
                np.asarray(episode_start, dtype=bool).reshape(n))
            with torch.no_grad():
                out, memory = agent.step(torch.as_tensor(x), memory, starts)
                logits = agent.actor(out)
                if deterministic:
                    action = logits if continuous else logits.argmax(-1)
                else:
                    action = sample(logits, agent.actor_logstd if continuous else None, generator)[0]
            return numpy_action(action), memory.numpy()

        self._act = act
        self._act_recurrent = act_recurrent

    def _jax_actor(self, cfg, state: dict) -> None:
        import jax
        import jax.numpy as jnp

        from reflectrl.trainers.ppo_jax.evaluate import act as jax_act
        from reflectrl.trainers.ppo_jax.evaluate import load_actor

        group, params, normalise = load_actor(cfg, state)  # as eval's
        setup, env = group.setup, group.env
        self.global_step = int(state["global_step"])
        self.params_sha256 = group.params_sha256(0)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (env.obs_dim,), np.float32)
        self.action_space = (gym.spaces.Discrete(env.action_dim) if env.discrete else
                             gym.spaces.Box(np.asarray(env.action_low), np.asarray(env.action_high)))
        keys = [jax.random.PRNGKey(cfg.seed)]

        def act(x: np.ndarray, deterministic: bool) -> np.ndarray:
            key = None
            if not deterministic:
                keys[0], key = jax.random.split(keys[0])
            action = np.asarray(jax_act(setup, params, normalise, jnp.asarray(x), deterministic, key))
            return action.astype(np.int64) if env.discrete else action

        def act_recurrent(x: np.ndarray, state, episode_start, deterministic: bool):
            from reflectrl.trainers.ppo_jax.evaluate import act_with_state

            key = None
            if not deterministic:
                keys[0], key = jax.random.split(keys[0])
            action, state = act_with_state(setup, params, normalise, x, state, episode_start, deterministic, key)
            return (action.astype(np.int64) if env.discrete else action), state

        self._act = act
        self.recurrent = setup.recurrent  # policy=gru: predict takes and gives its hidden state
        self._act_recurrent = act_recurrent

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        """The action for one observation, or the actions (N, ...) for a batch of N, as numpy (SB3's name).
        deterministic: the greedy / mean action, else a sample.

        A feed-forward policy's predict gives the actions alone. A recurrent one's (policy=gru, lstm) takes and
        gives its memory, as sb3-contrib's RecurrentPPO: `actions, state = predict(obs, state, episode_start)`,
        `state` None at the first step, then what the last call gave (numpy, (1, N, width) for gru, h and c
        stacked (2, N, width) for lstm; N is 1 for one observation), `episode_start` (N,) bool where an episode
        begins (its memory is cleared first; None: none does)."""
        if isinstance(state, bool) and episode_start is None:  # predict(obs, True): the earlier (obs, deterministic)
            state, deterministic = None, state
        rows, single = self._rows(observation)
        x = np.stack([self._transform(o) for o in rows]).astype(np.float32)
        if self.recurrent:
            actions, state = self._act_recurrent(x, state, episode_start, deterministic)
            return (np.asarray(actions[0]) if single else actions), state
        if state is not None or episode_start is not None:
            raise UserError("predict: this run's policy is feed-forward (policy=mlp) and keeps no state; call "
                            "predict(observation) without state and episode_start")
        actions = self._act(x, deterministic)
        return np.asarray(actions[0]) if single else actions

    def _transform(self, observation):
        for wrapper in self._transforms:
            observation = wrapper.observation(observation)
        return np.asarray(observation, dtype=np.float32)

    def _rows(self, observation) -> tuple[list, bool]:
        """The observations and whether one was given (not a batch)."""
        space = self.observation_space
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            return (list(observation), False) if isinstance(observation, list) else ([observation], True)
        arr = np.asarray(observation)
        shape = tuple(space.shape or ())
        if arr.shape == shape:
            return [arr], True
        if arr.ndim == len(shape) + 1 and arr.shape[1:] == shape:
            return list(arr), False
        raise UserError(f"predict: an observation of shape {arr.shape}; the env's have shape {shape} (one) or "
                        f"(N, {', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}) (a batch of N)")


# --------------------------------------------------------------------------- compare

def compare(envs: str | list[str], algos: str | list[str], *, total_steps: int | None = None, out: str | Path,
            seeds: int | None = None, first_seed: int = 1, preset: str | None = None, wrapper: str | None = None,
            backend: str = "local", workers: int | None = None, progress: bool = False, **knobs) -> dict:
    """Run what `reflectrl compare` runs (every env x algo entry x seed, in new processes; re-running resumes)
    and write its report; returns the report's data (its stats.json): `claims` (each a dict: statement,
    verdict, evidence, p_holm, estimate, entries, envs, ...), `table` (a row per env and entry), `runs` (the
    per-run scores), `spec`, `report` (the HTML page's path) and `failed` (the runs that failed, with why).
    `envs`: ids (strings: the runs are new processes, so an env of your own is MODULE:NAME); `preset`: a named
    experiment whose envs, algos, seeds and steps those not given take (its --set first); knobs: --set items
    for every run (`ALGO.KEY` for one entry's runs), as train's."""
    from reflectrl.experiments.runner import run_experiment
    from reflectrl.experiments.spec import compare_spec
    from reflectrl.report.render import write_report

    spec = compare_spec(_joined(envs), _joined(algos), seeds=seeds, total_steps=total_steps, sets=set_items(knobs),
                        wrapper=wrapper, first_seed=first_seed, preset=preset,
                        names=("envs", "algos", "total_steps", "preset"))

    root = Path(out)
    result = run_experiment(root, spec, backend=backend, workers=workers, progress=progress)
    path, _ = write_report(root)
    data = json.loads(path.with_name("stats.json").read_text())
    data["report"] = str(path)
    data["failed"] = [{"run": str(run.path), "why": why} for run, why in result.failed]
    return data


def _joined(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    value = list(value)
    if not all(isinstance(v, str) for v in value):
        raise UserError("compare: give envs and algos as strings (its runs are new processes: an env of your own is "
                        "MODULE:NAME, a class or factory at the top of an importable module)")
    return ",".join(value)
