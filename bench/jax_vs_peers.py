"""reflectrl's JAX PPO (`--set backend=jax`) side by side with rejax's PPO (issue 61): the same env,
the same knobs, the same network widths, whole processes, 1 and 16 seeds.

rejax (PyPI `rejax`, the PPO behind navix's published baselines) is not a dependency of the project:
`.venv/bin/pip install --no-deps rejax distrax`. Each side runs as its own process, started by this
script (so the whole process counts: imports, env build, compilation, training, files, exit), with
JAX's persistent compilation cache off on both. Seeds: reflectrl trains 16 seeds as one program
(`reflectrl train-group`), rejax as `jax.jit(jax.vmap(algo.train))`, as its README does.

The same env on both: reflectrl's own JAX env (src/reflectrl/envs/jax_envs.py, with its defaults;
for navix, MiniGrid's view, step limit and reward) handed to rejax through `ToRejax`, a few lines that
give it gymnax's old 5-value `step` (obs, state, reward, done, info: done = terminated or truncated),
which rejax 0.1 expects (gymnax 1.0 returns terminated and truncated apart). rejax's process imports
rejax (and with it gymnax) first, as its users do.

The same knobs: 16 envs x 128 steps, 4 epochs of 4 minibatches, learning rate 2.5e-4 (constant: rejax has
no annealing, so reflectrl runs with anneal_lr=false), entropy 0.01, clip 0.2 (ratio and value), vf 0.5,
gamma 0.99, lambda 0.95, gradient-norm clip 0.5, separate tanh MLPs 64x64 for actor and critic. What
stays each side's own: rejax's Adam eps (1e-8; reflectrl 1e-5), its init (lecun normal; reflectrl
orthogonal), its two optimisers (actor and critic clipped apart; reflectrl one global norm), its GAE
(no bootstrap at a time limit; reflectrl bootstraps a truncated step). rejax's periodic evaluation
is turned off (its eval_callback returns nothing), so that both sides do only the training.

Per row: whole-process seconds, compilation seconds (the union of JAX's own compile events in the process:
tracing, lowering and XLA compilation; jax.monitoring), the compiled rate (env steps/s over all seeds, of
the training calls with their compilation taken out, reflectrl's host work between calls included), the
final return (the mean of the last episodes ended in training: reflectrl's last 20 per seed as it
reports them; for rejax each env's last, 16 per seed; mean over seeds), and reflectrl / rejax: the speed
ratio of whole processes (rejax's seconds / reflectrl's: above 1, reflectrl is faster), of compiled rates,
and of compilation seconds (reflectrl's / rejax's: below 1, reflectrl compiles faster).

    python bench/jax_vs_peers.py [--envs cartpole,breakout,doorkey5,doorkey8] [--steps N] [--seeds 1,16]
                                 [--repeats 1] [--json OUT]
    python bench/jax_vs_peers.py --fixed-costs [--steps 500000]   # CartPole 1 seed: start-up, compilation,
                                                                   # compiled loop, ending of each side

--steps sets every env's budget per seed (default: each env's own, below, for 1 seed; 16 seeds run
MANY_SEEDS_SHARE of it per seed). Repeats keep each side's best whole process (and its other figures).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENVS = {  # name: (reflectrl's env id, env steps per seed for 1 seed by default)
    "cartpole": ("gymnax:CartPole-v1", 98_304),
    "breakout": ("gymnax:Breakout-MinAtar", 98_304),
    "doorkey5": ("navix:Navix-DoorKey-5x5-v0", 98_304),
    "doorkey8": ("navix:Navix-DoorKey-Random-8x8-v0", 98_304),
}
MANY_SEEDS_SHARE = 0.25  # 16 seeds run a quarter of the 1-seed budget per seed (16 x 0.25 = 4x the work)
FIXED_COSTS_STEPS = 500_000
BATCH = 16 * 128  # env steps per iteration: budgets are rounded to it
KNOBS = dict(num_envs=16, num_steps=128, update_epochs=4, num_minibatches=4, learning_rate=2.5e-4, ent_coef=0.01,
             clip_coef=0.2, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5)
HIDDEN = (64, 64)
REFLECTRL_SETS = ["backend=jax", "anneal_lr=false", f"hidden_sizes={','.join(map(str, HIDDEN))}",
                  *(f"{k}={v}" for k, v in KNOBS.items())]
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
INSTALL = "rejax is not installed: .venv/bin/pip install --no-deps rejax distrax (rejax 0.1.x; not a dependency)"


# ---------------------------------------------------------------- inside a side's process (--child)

class Clock:
    """What one process spent where: JAX's compile events (their union: nested traces overlap) and the
    training calls (start, end), in time.time(), which the parent's clock shares."""

    def __init__(self):
        import jax

        self.spans: list[tuple[float, float]] = []
        self.calls: list[tuple[float, float]] = []
        self.compiled: dict[str, float] = {}  # XLA compilation seconds by function (where the time goes)
        jax.monitoring.register_event_time_span_listener(self._on_span)

    def _on_span(self, event, start, end, fun_name="?", **_):
        if event in COMPILE_EVENTS:
            self.spans.append((start, end))
        if event == COMPILE_EVENTS[-1]:
            self.compiled[fun_name] = self.compiled.get(fun_name, 0.0) + end - start

    def timed(self, fn):
        import jax

        def call(*args):
            start = time.time()
            out = jax.block_until_ready(fn(*args))
            self.calls.append((start, time.time()))
            return out
        return call

    def report(self, path: str, **extra) -> None:
        Path(path).write_text(json.dumps({"compile_spans": merged(self.spans), "calls": self.calls,
                                          "compiled": self.compiled, **extra}))


def merged(spans):
    out = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def child_reflectrl(report: str, argv: list[str]) -> int:
    """`reflectrl ARGV` (train or train-group) with its program's calls timed."""
    clock = Clock()
    from reflectrl.trainers.ppo_jax import ppo

    make_program = ppo.make_program
    ppo.make_program = lambda *a, **k: clock.timed(make_program(*a, **k))
    from reflectrl.cli import main

    rc = main(argv)
    clock.report(report)
    return rc


def to_rejax(env):
    """reflectrl's JAX env as a gymnax env with the old 5-value step that rejax 0.1 expects (done =
    terminated or truncated; the env resets itself), and the return of each env's last ended episode."""
    import jax.numpy as jnp
    from gymnax.environments import environment, spaces

    class ToRejax(environment.Environment):
        @property
        def default_params(self):
            return environment.EnvParams(max_steps_in_episode=env.max_steps)

        def reset(self, key, params=None):
            obs, state, _ = env.reset(key)
            return obs, (state, jnp.float32(0.0), jnp.float32(jnp.nan))

        def step(self, key, state, action, params=None):
            inner, running, last = state
            out = env.step(key, inner, action)
            done = jnp.logical_or(out.terminated, out.truncated)
            running = running + out.reward
            last = jnp.where(done, running, last)
            return out.obs, (out.env_state, jnp.where(done, 0.0, running), last), out.reward, done, {}

        def observation_space(self, params):
            return spaces.Box(-jnp.inf, jnp.inf, (env.obs_dim,), jnp.float32)

        def action_space(self, params):
            return spaces.Discrete(env.action_dim)

    return ToRejax()


def child_rejax(report: str, env_id: str, steps: int, seeds: int) -> int:
    try:
        import rejax
    except ImportError:
        print(INSTALL)
        return 2
    clock = Clock()
    import jax
    import numpy as np

    from reflectrl.envs.jax_envs import make_env

    k = KNOBS
    algo = rejax.PPO.create(
        env=to_rejax(make_env(env_id)), total_timesteps=steps, eval_freq=steps, skip_initial_evaluation=True,
        num_envs=k["num_envs"], num_steps=k["num_steps"], num_epochs=k["update_epochs"],
        num_minibatches=k["num_minibatches"], learning_rate=k["learning_rate"], ent_coef=k["ent_coef"],
        clip_eps=k["clip_coef"], vf_coef=k["vf_coef"], gamma=k["gamma"], gae_lambda=k["gae_lambda"],
        max_grad_norm=k["max_grad_norm"], agent_kwargs={"activation": "tanh", "hidden_layer_sizes": HIDDEN})
    algo = algo.replace(eval_callback=lambda algo, ts, rng: ())  # no periodic evaluation: training only
    keys = jax.numpy.stack([jax.random.PRNGKey(s) for s in range(1, seeds + 1)])
    train = clock.timed(jax.jit(jax.vmap(algo.train)))
    ts, _ = train(keys)
    last = np.asarray(ts.env_state[2])  # (seeds, envs): each env's last ended episode's return
    per_seed = [float(np.nanmean(row)) if np.isfinite(row).any() else float("nan") for row in last]
    clock.report(report, returns=per_seed)
    return 0


# ---------------------------------------------------------------- the parent: run both sides, compare

def run_side(side: str, env_id: str, steps: int, seeds: int, tmp: Path) -> dict:
    """One whole process of a side: its seconds and where they went, its compiled rate, its final return."""
    tag = f"{side}-{env_id.replace(':', '_')}-{seeds}-{time.monotonic_ns()}"
    report = tmp / f"{tag}.json"
    if side == "rejax":
        cmd = [sys.executable, __file__, "--child", "rejax", str(report), env_id, str(steps), str(seeds)]
    else:
        argv = _reflectrl_argv(env_id, steps, seeds, tmp / tag)
        cmd = [sys.executable, __file__, "--child", "reflectrl", str(report), *argv]
    env = {**os.environ, "REFLECTRL_JAX_CACHE": "0", "JAX_ENABLE_COMPILATION_CACHE": "false"}
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{side} on {env_id} ({seeds} seeds) failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    data = json.loads(report.read_text())
    spans, calls = data["compile_spans"], data["calls"]
    first, last = calls[0][0], calls[-1][1]
    compiling = sum(e - s for s, e in spans)
    in_loop = sum(min(e, last) - max(s, first) for s, e in spans if e > first and s < last)
    before = sum(min(e, first) - s for s, e in spans if s < first)
    loop = last - first - in_loop
    returns = data.get("returns") or [float(x.replace(",", "")) for x in re.findall(
        r"mean return of the last \d+ episodes (-?[\d.,]+(?:e[-+]?\d+)?)", proc.stdout)]
    return {"side": side, "env": env_id, "seeds": seeds, "steps_per_seed": steps, "seconds": end - start,
            "compile_seconds": compiling, "startup_seconds": first - start - before, "loop_seconds": loop,
            "ending_seconds": end - last - (compiling - in_loop - before), "calls": len(calls),
            "compiled_steps_per_second": seeds * steps / loop if loop > 0 else float("nan"),
            "final_return": sum(returns) / len(returns) if returns else float("nan"), "returns": returns,
            "xla_compile_by_function": dict(sorted(data["compiled"].items(), key=lambda kv: -kv[1]))}


def _reflectrl_argv(env_id: str, steps: int, seeds: int, out: Path) -> list[str]:
    def train_args(seed: int, path: Path) -> list[str]:
        return ["--algo", "ppo", "--env", env_id, "--seed", str(seed), "--total-steps", str(steps),
                "--out", str(path), "--set", *REFLECTRL_SETS]

    if seeds == 1:
        return ["train", *train_args(1, out), "--no-progress"]
    items = [{"path": str(out / f"seed{s}"), "argv": train_args(s, out / f"seed{s}")} for s in range(1, seeds + 1)]
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "group.json"
    spec.write_text(json.dumps(items))
    return ["train-group", str(spec), "--no-progress"]


def best(results: list[dict]) -> dict:
    return min(results, key=lambda r: r["seconds"])


def row_text(name: str, seeds: int, steps: int, ours: dict, peer: dict) -> str:
    def side(r):
        return (f"{r['seconds']:6.1f} s, compile {r['compile_seconds']:5.1f} s, "
                f"{r['compiled_steps_per_second']:9,.0f} steps/s, return {r['final_return']:8.3g}")
    return (f"{name:9s} {seeds:2d} seed(s) x {steps:,}: reflectrl {side(ours)} | rejax {side(peer)} | "
            f"reflectrl/rejax: whole {peer['seconds'] / ours['seconds']:.2f}x, compiled rate "
            f"{ours['compiled_steps_per_second'] / peer['compiled_steps_per_second']:.2f}x, compile "
            f"{ours['compile_seconds'] / peer['compile_seconds']:.2f}x (time)")


def fixed_costs(steps: int, repeats: int, tmp: Path) -> list[dict]:
    env_id = ENVS["cartpole"][0]
    out = []
    print(f"fixed costs: {env_id}, 1 seed x {steps:,} steps, whole processes (best of {repeats}); seconds")
    print(f"{'side':9s} {'whole':>7s} {'start-up':>9s} {'compile':>8s} {'loop':>7s} {'ending':>7s}  compiled steps/s")
    for side in ("reflectrl", "rejax"):
        r = best([run_side(side, env_id, steps, 1, tmp) for _ in range(repeats)])
        out.append(r)
        print(f"{side:9s} {r['seconds']:7.1f} {r['startup_seconds']:9.1f} {r['compile_seconds']:8.1f} "
              f"{r['loop_seconds']:7.1f} {r['ending_seconds']:7.1f}  {r['compiled_steps_per_second']:,.0f}",
              flush=True)
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        side, report, rest = sys.argv[2], sys.argv[3], sys.argv[4:]
        if side == "rejax":
            return child_rejax(report, rest[0], int(rest[1]), int(rest[2]))
        return child_reflectrl(report, rest)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated, of {', '.join(ENVS)}")
    parser.add_argument("--steps", type=int, default=None, help="env steps per seed for 1 seed (every env)")
    parser.add_argument("--seeds", default="1,16", help="seed counts, e.g. 1,16")
    parser.add_argument("--repeats", type=int, default=1, help="whole processes per side and row (the best kept)")
    parser.add_argument("--json", default=None, help="write every row's figures to this file")
    parser.add_argument("--fixed-costs", action="store_true",
                        help=f"CartPole 1 seed x {FIXED_COSTS_STEPS:,} (or --steps): where each side's seconds go")
    args = parser.parse_args()
    try:
        import rejax  # noqa: F401
    except ImportError:
        print(INSTALL)
        return 2
    unknown = [e for e in args.envs.split(",") if e not in ENVS]
    if unknown:
        print(f"--envs: unknown {', '.join(unknown)}; use some of {', '.join(ENVS)}")
        return 2
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; PPO 16 envs x 128 steps, 4 epochs x 4 "
          "minibatches, both sides whole processes, no compilation cache", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.fixed_costs:
            rows = fixed_costs(_round(args.steps or FIXED_COSTS_STEPS), args.repeats, tmp)
        else:
            for name in args.envs.split(","):
                env_id, default_steps = ENVS[name]
                for seeds in (int(s) for s in args.seeds.split(",")):
                    steps = args.steps or default_steps
                    steps = _round(steps if seeds == 1 else steps * MANY_SEEDS_SHARE)
                    ours, peer = [], []
                    for _ in range(args.repeats):  # alternating, so that both meet the same load
                        ours.append(run_side("reflectrl", env_id, steps, seeds, tmp))
                        peer.append(run_side("rejax", env_id, steps, seeds, tmp))
                    ours, peer = best(ours), best(peer)
                    rows += [ours, peer]
                    print(row_text(name, seeds, steps, ours, peer), flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _round(steps: float) -> int:
    return max(BATCH, int(round(steps / BATCH)) * BATCH)


if __name__ == "__main__":
    raise SystemExit(main())
