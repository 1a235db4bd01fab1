"""reflectrl's IMPALA against RLlib's IMPALA on CartPole-v1: the same budget, the same actors, one machine.

Each seed runs reflectrl (a `reflectrl train --algo impala` subprocess) and then RLlib (in this process,
one Ray instance for the whole script), alternately, so the machine's noise falls on both. It prints a
table (env steps/s, final return, time to return 195) and the ratio reflectrl / RLlib of env steps/s,
and writes per_run.json, summary.md and curves.png to --out.

Matched on both sides:
* CartPole-v1, the env-step budget --steps (RLlib: stopped at the first `train()` call after which
  env_runners/num_env_steps_sampled_lifetime >= --steps; reflectrl: --total-steps), seed s in 0..n-1.
* A actors (RLlib: A remote EnvRunners, 1 CPU each; the learner is local, in the driver's process,
  `num_learners=0`), E envs per actor (RLlib: a gymnasium "sync" vector env per EnvRunner), unroll
  length L (RLlib: rollout_fragment_length), one learner update = B trajectories of L steps = B*L
  env steps (RLlib: train_batch_size_per_learner = B*L, one epoch, no minibatches); B must be a
  multiple of E because an actor ships E trajectories at a time on both sides.
* MLP 256-256 tanh with separate policy and value trunks (RLlib: fcnet_hiddens=[256, 256],
  fcnet_activation="tanh", vf_share_layers=False), learning rate --lr, entropy coefficient 0.01,
  value-loss coefficient 0.5, gradient clip 40 by global norm, gamma 0.99, V-trace rho_bar = 1.0
  (RLlib: vtrace_clip_rho_threshold and vtrace_clip_pg_rho_threshold, the clip on rho in the targets
  and in the policy gradient) and c_bar = 1.0 (RLlib clips c at 1.0 without a knob).
* 1 torch thread in each learner and actor (OMP_NUM_THREADS=1 for the reflectrl subprocess; Ray
  gives each 1-CPU actor one thread), torch on the CPU.
* The return curve: each side's points are means of the episodes that finished in that point's data
  (reflectrl: one point per learner update, `episodic_return`; RLlib: one point per `train()` call,
  about --rllib-iteration-s seconds, from an on_episode_end callback that sums whole-episode returns
  and counts episodes, not RLlib's 100-episode running mean), and both sides are summarised the same
  way (means weighted by the env steps each point covers).

Not matched, or not matchable (read the numbers with these in mind):
* RLlib's learner batching: episode chunks go through its learner connector pipeline, which appends
  one bootstrap timestep to every chunk and re-cuts them into rows of L with zero padding (about 6%
  padding at L=50 on CartPole), and the V-trace bootstrap value comes from that extra timestep.
  Its num_env_steps_trained_lifetime counts the padded batch, so the x-axis here is env steps
  *sampled* (reflectrl's `global_step` is env steps the learner consumed; the two differ by the
  batches in flight, a few thousand steps at most).
* RLlib's connectors (env-to-module and module-to-env pipelines, run per step on the actors), its
  object store and actor RPCs, its learner thread with a queue of 3 batches
  (learner_queue_size), weights pushed to an EnvRunnerStateServer after every update and pulled by
  each EnvRunner at the start of each `sample()`, one sample request in flight per EnvRunner.
* Loss and optimiser details: RLlib uses Adam with torch's eps 1e-8 (reflectrl's IMPALA, as written
  when this script was: Adam eps 1e-5), takes each loss term's mean over the unpadded steps and
  uses 0.5 * vf_loss_coeff * mean(squared V-trace error) (reflectrl: the same form); its network
  init is RLlib's default, not reflectrl's CleanRL-style orthogonal init. Check reflectrl's IMPALA
  (trainers/impala/trainer.py) before reading return differences as algorithmic.
* Processes: both sides run their actors as 1-CPU Ray actors, but reflectrl's subprocess starts its
  own local Ray instance, while this script's instance (for RLlib) stays up, idle, during the
  reflectrl runs: a little background load on that side.
* Timing: wall time starts, on both sides, when training starts: RLlib's `build_algo()` (creating the
  EnvRunner actors) is reported separately as setup_s; reflectrl's `wall_time` is its own
  "seconds since training began" and its process start-up is in setup_s. "steady" env steps/s is
  measured between 10% and 100% of the budget, which leaves the start-up of either out.
* RLlib adds about one `train()` call of env steps past --steps (overshoot); rates use the real counts.

Needs RLlib's dependencies beside reflectrl's ray extra: pip install 'ray[rllib]' lz4 (without lz4 RLlib
turns sample compression off and says so; on CartPole it made no difference here).

    python bench/impala_vs_rllib.py                                   # 100k steps, 2 actors x 4 envs, 1 seed
    python bench/impala_vs_rllib.py --steps 200000 --seeds 3
    python bench/impala_vs_rllib.py --steps 20000 --only rllib --out /tmp/impala-rllib-smoke
    python bench/impala_vs_rllib.py --actors 4 --envs-per-actor 8 --unroll 20 --batch-trajectories 32
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENV_ID = "CartPole-v1"
SIDES = ("reflectrl", "rllib")
FINAL_FRACTION = 0.1  # final return: the last 10% of the env steps
STEADY_FROM = 0.1  # steady env steps/s: from 10% of the budget to the end


# ---------------------------------------------------------------- curve summaries (both sides alike)


def _weights(steps: np.ndarray) -> np.ndarray:
    """The env steps each point covers (from the previous point, or from 0)."""
    return np.diff(steps, prepend=0.0).clip(min=0.0)


def windowed_returns(curve: list[list], window: float) -> list[float | None]:
    """For each point, the step-weighted mean return of the points in (steps - window, steps]."""
    if not curve:
        return []
    steps = np.array([p[0] for p in curve], dtype=float)
    rets = np.array([np.nan if p[2] is None else p[2] for p in curve], dtype=float)
    w = _weights(steps)
    out: list[float | None] = []
    for i, s in enumerate(steps):
        sel = (steps > s - window) & (steps <= s) & ~np.isnan(rets) & (w > 0)
        out.append(float(np.average(rets[sel], weights=w[sel])) if sel.any() else None)
    return out


def final_return(curve: list[list]) -> float | None:
    """Step-weighted mean return over the points in the last FINAL_FRACTION of the env steps."""
    if not curve:
        return None
    steps = np.array([p[0] for p in curve], dtype=float)
    rets = np.array([np.nan if p[2] is None else p[2] for p in curve], dtype=float)
    w = _weights(steps)
    sel = (steps >= (1.0 - FINAL_FRACTION) * steps[-1]) & ~np.isnan(rets) & (w > 0)
    return float(np.average(rets[sel], weights=w[sel])) if sel.any() else None


def time_to_threshold(curve: list[list], threshold: float, window: float) -> tuple[float | None, float | None]:
    """(env steps, wall seconds) at the first point, at least `window` steps in, whose windowed
    return is >= threshold; (None, None) if it never is."""
    for p, r in zip(curve, windowed_returns(curve, window)):
        if p[0] >= window and r is not None and r >= threshold:
            return float(p[0]), float(p[1])
    return None, None


def steady_rate(curve: list[list]) -> float | None:
    """Env steps per second between the first point past STEADY_FROM of the steps and the last."""
    if len(curve) < 2:
        return None
    last = curve[-1]
    first = next((p for p in curve if p[0] >= STEADY_FROM * last[0]), None)
    if first is None or last[1] <= first[1]:
        return None
    return (last[0] - first[0]) / (last[1] - first[1])


def summarise(run: dict, threshold: float, window: float) -> dict:
    curve = run["curve"]
    run["final_return"] = final_return(curve)
    run["env_steps"] = curve[-1][0] if curve else 0
    run["train_wall_s"] = curve[-1][1] if curve else None
    run["env_steps_per_s"] = (curve[-1][0] / curve[-1][1]) if curve and curve[-1][1] > 0 else None
    run["env_steps_per_s_steady"] = steady_rate(curve)
    run["steps_to_threshold"], run["time_to_threshold_s"] = time_to_threshold(curve, threshold, window)
    return run


# ---------------------------------------------------------------- reflectrl (subprocess, the CLI contract)


def reflectrl_command(args, seed: int, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "reflectrl", "train", "--algo", "impala", "--env", ENV_ID,
            "--seed", str(seed), "--total-steps", str(args.steps), "--out", str(run_dir), "--no-progress",
            "--set", f"num_actors={args.actors}", f"envs_per_actor={args.envs_per_actor}",
            f"unroll_length={args.unroll}", f"batch_trajectories={args.batch_trajectories}",
            f"learning_rate={args.lr!r}", "hidden_sizes=256,256", "ent_coef=0.01", "vf_coef=0.5",
            "max_grad_norm=40", "gamma=0.99", "rho_bar=1.0", "c_bar=1.0"]


def _num(x) -> float | None:
    """A finite float, or None (JSON null, NaN, missing)."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_reflectrl_metrics(path: Path) -> dict:
    """The curve and the last reported rates from a reflectrl run's metrics.jsonl (one row per
    learner update: global_step, episodic_return, wall_time, actor_steps_per_second,
    learner_updates_per_second)."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not JSON ({err})") from None
    rows = [r for r in rows if "global_step" in r and "wall_time" in r]
    if not rows:
        raise ValueError(f"{path} has no rows with global_step and wall_time")
    rows.sort(key=lambda r: r["global_step"])
    curve = [[float(r["global_step"]), float(r["wall_time"]), _num(r.get("episodic_return"))] for r in rows]
    last = rows[-1]
    return {"curve": curve, "learner_updates": len(rows),
            "actor_steps_per_second": _num(last.get("actor_steps_per_second")),
            "learner_updates_per_second": _num(last.get("learner_updates_per_second"))}


def run_reflectrl(args, seed: int, runs_dir: Path) -> dict:
    run_dir = runs_dir / f"reflectrl-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    log = runs_dir / f"reflectrl-seed{seed}.log"
    cmd = reflectrl_command(args, seed, run_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    run = {"side": "reflectrl", "seed": seed, "command": cmd, "log": str(log), "curve": []}
    start = time.perf_counter()
    try:
        with open(log, "w") as fh:
            code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                   timeout=args.run_timeout or None)
    except subprocess.TimeoutExpired:
        code = f"killed after --run-timeout {args.run_timeout}s"
    elapsed = time.perf_counter() - start
    error = None
    if code != 0:
        error = f"`reflectrl train --algo impala` exited with {code}"
    else:
        try:
            run.update(read_reflectrl_metrics(run_dir / "metrics.jsonl"))
        except (OSError, ValueError, KeyError, TypeError) as err:
            error = f"could not read its metrics.jsonl: {err}"
    if error:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:] if log.exists() else []
        print(f"\nreflectrl seed {seed} FAILED: {error}\n  command: {' '.join(cmd)}\n  log: {log}\n  "
              + "\n  ".join(tail) + "\n", file=sys.stderr, flush=True)
        run.update(status="failed", error=error)
        return run
    run.update(status="ok", setup_s=max(0.0, elapsed - run["curve"][-1][1]))
    return run


# ---------------------------------------------------------------- RLlib (in process)

_RLLIB_CALLBACK = None


def _rllib_callback_class():
    """An RLlibCallback that sums whole-episode returns and counts finished episodes per
    `train()` call (RLlib's own episode_return_mean is a 100-episode running mean). The
    episode passed to on_episode_end is only its last chunk: add the earlier chunks' returns."""
    global _RLLIB_CALLBACK
    if _RLLIB_CALLBACK is None:
        from ray.rllib.callbacks.callbacks import RLlibCallback

        class EpisodeReturns(RLlibCallback):
            def on_episode_end(self, *, episode, prev_episode_chunks=None, metrics_logger=None, **kwargs):
                ret = float(episode.get_return()) + sum(float(c.get_return()) for c in (prev_episode_chunks or ()))
                metrics_logger.log_value("bench_return_sum", ret, reduce="sum")
                metrics_logger.log_value("bench_episodes", 1, reduce="sum")

        _RLLIB_CALLBACK = EpisodeReturns
    return _RLLIB_CALLBACK


def rllib_config(args, seed: int):
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        IMPALAConfig()
        .environment(ENV_ID)
        .framework("torch")
        .env_runners(num_env_runners=args.actors, num_envs_per_env_runner=args.envs_per_actor,
                     rollout_fragment_length=args.unroll, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=args.batch_trajectories * args.unroll, lr=args.lr,
                  entropy_coeff=0.01, vf_loss_coeff=0.5, grad_clip=40.0, grad_clip_by="global_norm", gamma=0.99,
                  vtrace_clip_rho_threshold=1.0, vtrace_clip_pg_rho_threshold=1.0, num_epochs=1)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256, 256], fcnet_activation="tanh",
                                                   vf_share_layers=False))
        .reporting(min_time_s_per_iteration=args.rllib_iteration_s)
        .callbacks(_rllib_callback_class())
        .debugging(seed=seed, log_level="ERROR")
    )


def _get(d: dict, *keys, default=None):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _throughput(x) -> float | None:
    """RLlib's lifetime throughput: a number, or {"throughput_since_last_reduce": ..., ...}."""
    return _num(x.get("throughput_since_last_reduce")) if isinstance(x, dict) else _num(x)


def run_rllib(args, seed: int) -> dict:
    import torch

    torch.set_num_threads(1)
    run = {"side": "rllib", "seed": seed, "api_stack": "new (RLModule + Learner, EnvRunner + ConnectorV2)",
           "curve": []}
    algo = None
    try:
        start = time.perf_counter()
        algo = rllib_config(args, seed).build_algo()
        run["setup_s"] = time.perf_counter() - start
        t0 = time.perf_counter()
        sampled = trained = 0.0
        updates = 0.0
        last_progress = t0
        while sampled < args.steps:
            result = algo.train()
            now = time.perf_counter() - t0
            er = result.get("env_runners", {})
            all_modules = _get(result, "learners", "__all_modules__", default={})
            new_sampled = _num(er.get("num_env_steps_sampled_lifetime")) or sampled
            trained = _num(all_modules.get("num_env_steps_trained_lifetime")) or trained
            # updates this call: padded steps trained / mean padded batch size (one update per batch)
            batch_mean = _num(_get(result, "learners", "default_policy", "module_train_batch_size_mean"))
            step_trained = _num(all_modules.get("num_env_steps_trained"))
            if batch_mean and step_trained:
                updates += step_trained / batch_mean
            episodes = _num(er.get("bench_episodes"))
            ret_sum = _num(er.get("bench_return_sum"))
            mean_ret = ret_sum / episodes if episodes and ret_sum is not None else None
            if new_sampled > sampled:
                sampled = new_sampled
                run["curve"].append([sampled, now, mean_ret])
                last_progress = time.perf_counter()
            elif time.perf_counter() - last_progress > 120:
                raise RuntimeError(f"no env steps sampled for 120 s (stuck at {sampled:.0f})")
        run.update(status="ok", env_steps_trained_lifetime_padded=trained, learner_updates_est=round(updates),
                   learner_updates_per_second=updates / now if now > 0 else None,
                   actor_steps_per_second=_throughput(er.get("num_env_steps_sampled_lifetime_throughput")),
                   learner_env_steps_dropped=_num(_get(result, "learner_group", "learner_group_ts_dropped_lifetime")))
    except Exception as err:  # a failed RLlib run is reported, and the other runs go on
        print(f"\nrllib seed {seed} FAILED: {type(err).__name__}: {err}\n", file=sys.stderr, flush=True)
        run.update(status="failed", error=f"{type(err).__name__}: {err}")
    finally:
        if algo is not None:
            algo.stop()
    return run


# ---------------------------------------------------------------- report


def _fmt(x, spec: str = ".0f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _seconds(x) -> str:
    return "not reached" if x is None else f"{x:.1f} s"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def side_stats(runs: list[dict], side: str, threshold: float) -> dict | None:
    ok = [r for r in runs if r["side"] == side and r.get("status") == "ok"]
    failed = [r for r in runs if r["side"] == side and r.get("status") != "ok"]
    if not ok and not failed:
        return None
    sps = [r["env_steps_per_s"] for r in ok if r["env_steps_per_s"] is not None]
    reached = [r for r in ok if r["time_to_threshold_s"] is not None]
    return {
        "side": side, "seeds": [r["seed"] for r in ok], "failed_seeds": [r["seed"] for r in failed],
        "sps_mean": _mean(sps), "sps_std": float(np.std(sps)) if len(sps) > 1 else None,
        "sps_steady_mean": _mean([r["env_steps_per_s_steady"] for r in ok]),
        "updates_per_s_mean": _mean([r.get("learner_updates_per_second") for r in ok]),
        "final_mean": _mean([r["final_return"] for r in ok]),
        "finals": [r["final_return"] for r in ok],
        "reached": f"{len(reached)}/{len(ok)}",
        "time_to_threshold_mean": _mean([r["time_to_threshold_s"] for r in reached]),
        "steps_to_threshold_mean": _mean([r["steps_to_threshold"] for r in reached]),
    }


def summary_markdown(args, runs: list[dict], threshold: float, window: float) -> tuple[str, float | None]:
    stats = [s for s in (side_stats(runs, side, threshold) for side in SIDES) if s]
    lines = [
        f"# IMPALA on {ENV_ID}: reflectrl vs RLlib {_ray_version()}",
        "",
        f"{args.steps:,} env steps, {args.actors} actors x {args.envs_per_actor} envs, unroll {args.unroll}, "
        f"{args.batch_trajectories} trajectories per update ({args.batch_trajectories * args.unroll} steps), "
        f"lr {args.lr:g}, MLP 256-256 tanh; {platform.machine()}, {os.cpu_count()} CPUs. RLlib: new API stack, "
        f"local learner. Final return: last {FINAL_FRACTION:.0%} of the steps; time to {threshold:g}: the first "
        f"point whose mean return over the last {window:,.0f} env steps is >= {threshold:g} (wall s from the start "
        f"of training; env steps in brackets).",
        "",
        "| side | seeds | env steps/s (mean ± sd) | steady env steps/s | learner updates/s | final return mean "
        f"| final return per seed | reached {threshold:g} | time to {threshold:g} (s) [env steps] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in stats:
        seeds = ",".join(map(str, s["seeds"])) or "-"
        if s["failed_seeds"]:
            seeds += f" (failed: {','.join(map(str, s['failed_seeds']))})"
        sps = _fmt(s["sps_mean"]) + (f" ± {s['sps_std']:.0f}" if s["sps_std"] is not None else "")
        upd = _fmt(s["updates_per_s_mean"], ".1f") + (" (est.)" if s["side"] == "rllib" else "")
        per_seed = ", ".join(_fmt(f, ".1f") for f in s["finals"]) or "-"
        ttt = _fmt(s["time_to_threshold_mean"], ".1f")
        if s["steps_to_threshold_mean"] is not None:
            ttt += f" [{s['steps_to_threshold_mean']:,.0f}]"
        lines.append(f"| {s['side']} | {seeds} | {sps} | {_fmt(s['sps_steady_mean'])} | {upd} | "
                     f"{_fmt(s['final_mean'], '.1f')} | {per_seed} | {s['reached']} | {ttt} |")
    by_side = {s["side"]: s for s in stats}
    ratio = steady = None
    if "reflectrl" in by_side and "rllib" in by_side:
        a, b = by_side["reflectrl"], by_side["rllib"]
        if a["sps_mean"] and b["sps_mean"]:
            ratio = a["sps_mean"] / b["sps_mean"]
        if a["sps_steady_mean"] and b["sps_steady_mean"]:
            steady = a["sps_steady_mean"] / b["sps_steady_mean"]
    times = lambda x: "n/a" if x is None else f"{x:.2f}x"  # noqa: E731
    lines += ["", f"Ratio reflectrl / RLlib of env steps/s: **{times(ratio)}** "
              f"(steady, 10%-100% of the budget: {times(steady)})."]
    if ratio is None:
        lines.append("(the ratio needs a successful run of each side)")
    return "\n".join(lines) + "\n", ratio


def plot_curves(runs: list[dict], path: Path, window: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"reflectrl": "tab:blue", "rllib": "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    labelled = set()
    for run in runs:
        if run.get("status") != "ok" or not run["curve"]:
            continue
        curve = run["curve"]
        smooth = [np.nan if r is None else r for r in windowed_returns(curve, window)]
        label = None if run["side"] in labelled else run["side"]
        labelled.add(run["side"])
        for ax, x in zip(axes, ([p[0] for p in curve], [p[1] for p in curve])):
            ax.plot(x, smooth, color=colors[run["side"]], alpha=0.8, lw=1.5, label=label)
    for ax, xlabel in zip(axes, ("env steps", "wall time since training began (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"episode return (mean over the last {window:,.0f} env steps)")
        ax.axhline(195, color="grey", ls=":", lw=1)
        ax.grid(alpha=0.3)
        if labelled:
            ax.legend()
    fig.suptitle(f"IMPALA on {ENV_ID}: reflectrl vs RLlib")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ray_version() -> str:
    try:
        import ray

        return ray.__version__
    except ImportError:
        return "(not installed)"


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per run")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--envs-per-actor", type=int, default=4)
    parser.add_argument("--unroll", type=int, default=50, help="trajectory length L")
    parser.add_argument("--batch-trajectories", type=int, default=8, help="trajectories per learner update B")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..n-1")
    parser.add_argument("--only", choices=SIDES, default=None, help="run one side only")
    parser.add_argument("--out", default="docs/results/impala-vs-rllib")
    parser.add_argument("--threshold", type=float, default=195.0, help="return for 'time to reach'")
    parser.add_argument("--runs-dir", default=None,
                        help="where reflectrl's run directories and logs go (default: a new temporary folder)")
    parser.add_argument("--run-timeout", type=float, default=0, help="seconds per reflectrl run, 0: none")
    parser.add_argument("--rllib-iteration-s", type=float, default=1.0,
                        help="RLlib's min_time_s_per_iteration: one curve point per train() call")
    args = parser.parse_args()
    if args.batch_trajectories % args.envs_per_actor:
        parser.error(f"--batch-trajectories {args.batch_trajectories} must be a multiple of "
                     f"--envs-per-actor {args.envs_per_actor}")
    if min(args.steps, args.actors, args.envs_per_actor, args.unroll, args.batch_trajectories, args.seeds) < 1:
        parser.error("--steps, --actors, --envs-per-actor, --unroll, --batch-trajectories and --seeds must be >= 1")
    sides = [s for s in SIDES if args.only in (None, s)]
    window = FINAL_FRACTION * args.steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path(tempfile.mkdtemp(prefix="impala-vs-rllib-"))
    runs_dir.mkdir(parents=True, exist_ok=True)
    if "reflectrl" in sides:
        print(f"reflectrl run directories and logs: {runs_dir}", flush=True)

    ray = None
    if "rllib" in sides:
        import ray

        logging.getLogger("ray").setLevel(logging.ERROR)
        # A env runner actors of 1 CPU; the driver runs the learner
        ray.init(num_cpus=args.actors + 1, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
    runs: list[dict] = []
    try:
        for seed in range(args.seeds):
            for side in sides:
                print(f"seed {seed} {side:9s} ...", flush=True)
                run = run_reflectrl(args, seed, runs_dir) if side == "reflectrl" else run_rllib(args, seed)
                if run["status"] == "ok":
                    summarise(run, args.threshold, window)
                    print(f"seed {seed} {side:9s} {run['env_steps']:>9,.0f} env steps in {run['train_wall_s']:.1f} s "
                          f"(+{run['setup_s']:.1f} s setup): {run['env_steps_per_s']:.0f} env steps/s, "
                          f"final return {_fmt(run['final_return'], '.1f')}, "
                          f"time to {args.threshold:g}: {_seconds(run['time_to_threshold_s'])}",
                          flush=True)
                runs.append(run)
    finally:
        if ray is not None:
            ray.shutdown()

    md, ratio = summary_markdown(args, runs, args.threshold, window)
    meta = {"env": ENV_ID, "steps": args.steps, "actors": args.actors, "envs_per_actor": args.envs_per_actor,
            "unroll": args.unroll, "batch_trajectories": args.batch_trajectories, "lr": args.lr,
            "threshold": args.threshold, "window_env_steps": window, "final_fraction": FINAL_FRACTION,
            "rllib_api_stack": "new", "rllib_iteration_s": args.rllib_iteration_s, "ray": _ray_version(),
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "ratio_env_steps_per_s": ratio,
            "curve_format": "[env_steps, wall_time_s_since_training_began, mean_return_or_null]"}
    with open(out / "per_run.json", "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    (out / "summary.md").write_text(md)
    plot_curves(runs, out / "curves.png", window)
    print("\n" + md)
    print(f"ratio reflectrl / RLlib env steps/s: {_fmt(ratio, '.2f', 'n/a')}"
          + ("" if ratio is not None else " (needs a successful run of each side)"))
    print(f"wrote {out / 'per_run.json'}, {out / 'summary.md'}, {out / 'curves.png'}")
    if any(r["status"] != "ok" for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
