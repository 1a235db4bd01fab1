"""The `reflectrl` command. Thin: parse, validate, call; every failure the user can fix is
one line on stderr with exit code 2 and no traceback.

    reflectrl train --algo ppo --env ID --seed N --total-steps N --out DIR [--wrapper W] [--set k=v ...]
    reflectrl train --resume DIR
    reflectrl eval DIR --episodes N [--deterministic] [--json] [--video FILE.mp4]
    reflectrl compare / report / plot ...          (multi-seed experiments and their report)
    reflectrl claims DIR... [--json] [--out FILE.md] (one ledger of every claim in the reports under DIR)
    reflectrl sweep --env ID --algo ALGO --space KEY=DIST ... --trials N --seeds K --total-steps N --out DIR
    reflectrl llm init-tiny | sft | train | eval   (language-model agents, see llm_cli.py)
    reflectrl sandbox run --code F.py --tests T.json
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import warnings

from reflectrl.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, UserError
from reflectrl.lazyhelp import LazyHelp
from reflectrl.outputs import HINTS, write_error
from reflectrl.report import BOOTSTRAP_REPS
from reflectrl.runs.health import format_return

ENV_HELP = ("env id: a Gymnasium id (CartPole-v1, HalfCheetah-v5, LunarLander-v3), a MiniGrid id "
            "(MiniGrid-DoorKey-8x8-v0), an Atari id (ALE/Breakout-v5), pettingzoo:MODULE for --algo mappo "
            "(pettingzoo:mpe2.simple_spread_v3), MODULE:ID for an env of your own (importing MODULE runs its "
            "gym.register), or reflectrl/GridWorld-v0, the built-in maze")
BACKEND_HELP = "where the runs go: local subprocesses (default local), or ray: one Ray task per run"
RUN_DIR_HELP = "a run directory (the --out of 'reflectrl train')"
WRAPPER_HELP = ("env wrapper: sparse, delayed:K, velocity-cost[:V] (a cost channel) or mask_velocity (velocities "
                "hidden: a memory task), or several joined by commas")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UserError(f"{message} (see '{self.prog} --help')")


def _flatten(sets: list[list[str]] | None) -> list[str]:
    return [item for group in (sets or []) for item in group]


def build_parser() -> argparse.ArgumentParser:
    from reflectrl._version import __version__
    from reflectrl.config import EVAL_MAX_STEPS, RunConfig
    from reflectrl.registry import algo_names

    d = RunConfig()  # help shows the dataclass's defaults; the options pass "not given" through

    parser = _Parser(prog="reflectrl", description="Agentic RL in which the agent learns its own learning signal.")
    parser.add_argument("--version", action="version", version=f"reflectrl {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, required=True)

    train = sub.add_parser("train", help="train one run (or continue one with --resume)")
    train.add_argument("--algo", default=None, help=LazyHelp(
        "TRAINER[+SIGNAL...]", lambda: f"TRAINER[+SIGNAL...]: {', '.join(algo_names('control'))} (default {d.algo}); "
        "knobs may follow a part in brackets, as in compare's entries: ppo+calibration[mode=uncertainty;alpha=0.02]"))
    train.add_argument("--env", default=None, help=ENV_HELP + f" (default {d.env_id})")
    train.add_argument("--seed", type=int, default=None, help=f"random seed (default {d.seed})")
    train.add_argument("--total-steps", type=int, default=None,
                       help=f"env steps to train for (default {d.total_steps})")
    train.add_argument("--out", default=None, help="run directory to create")
    train.add_argument("--wrapper", default=None, help=WRAPPER_HELP)
    train.add_argument("--set", action="append", nargs="+", metavar="KEY=VALUE",
                       help="override a knob, e.g. --set num_envs=8 learning_rate=1e-3 env.size=12")
    train.add_argument("--resume", metavar="DIR", default=None, help="continue the interrupted run in DIR")
    train.add_argument("--ray-address", default=None, help="--algo impala: the Ray cluster its actors run on (auto, "
                       "or HOST:PORT; default: start a local instance); with --resume it replaces the saved one")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    group = sub.add_parser("train-group", help="(compare's, backend=jax) train runs that differ only in their seed "
                           "as one compiled program")
    group.add_argument("runs", help="a JSON file: [{\"path\": DIR, \"argv\": [train arguments]}, ...]")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")

    cmp = sub.add_parser("compare", help="run every (env, algo, seed) and write the report")
    cmp.add_argument("--preset", default=None, help="a named experiment whose envs, algos, seeds, steps, --set and "
                     "--wrapper the other flags replace (--set adds to it): " + _presets_help())
    cmp.add_argument("--env", default=None, help="env id(s), comma-separated (required without --preset)")
    cmp.add_argument("--algos", default=None, help="algo entries, e.g. ppo,refgrpo,refgrpo[alpha=0] "
                     "(required without --preset)")
    cmp.add_argument("--seeds", type=int, default=None, help="seeds 1..N per (env, algo) (default 5, or the preset's)")
    cmp.add_argument("--first-seed", type=int, default=1,
                     help="number the seeds from this one (fresh seeds for a confirmation run: --first-seed 11; "
                          "default 1)")
    cmp.add_argument("--total-steps", type=int, default=None, help="env steps per run (required without --preset)")
    cmp.add_argument("--out", required=True, help="experiment directory (re-run to resume)")
    cmp.add_argument("--wrapper", default=None, help=WRAPPER_HELP + ", for every run")
    cmp.add_argument("--set", action="append", nargs="+", metavar="KEY=VALUE",
                     help="override for every run, or ALGO.KEY=VALUE for one algo's entries")
    cmp.add_argument("--backend", default="local", choices=["local", "ray"], help=BACKEND_HELP)
    cmp.add_argument("--workers", type=int, default=None, help="parallel runs (default: the cores)")
    cmp.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local one)")
    cmp.add_argument("--no-progress", action="store_true", help="no progress bar (the runs' logs still fill)")
    cmp.add_argument("--no-report", action="store_true", help="skip writing the report at the end")

    sw = sub.add_parser("sweep", help="tune an algo's knobs with Optuna, then re-run the best on fresh seeds")
    sw.add_argument("--env", required=True, help="the env id to tune on (one)")
    sw.add_argument("--algo", required=True, help="TRAINER[+SIGNAL...], e.g. ppo, refgrpo, ppo+shaping, "
                    "ppo+shaping[mode=potential] (knobs in brackets are fixed, as --set's)")
    sw.add_argument("--space", action="append", nargs="+", metavar="KEY=DIST",
                    help="a tuned knob (a --set key): KEY=uniform(a,b) | loguniform(a,b) | int(a,b) | choice(x,y,...)")
    sw.add_argument("--space-file", default=None, metavar="F", help="more KEY=DIST lines (# comments)")
    sw.add_argument("--trials", type=int, required=True, help="trials in the study (re-run with more to extend it)")
    sw.add_argument("--seeds", type=int, required=True, help="seeds 1..K per trial")
    sw.add_argument("--total-steps", type=int, required=True, help="env steps per run")
    sw.add_argument("--out", required=True, help="sweep directory (re-run to resume)")
    sw.add_argument("--objective", default="auc", choices=["auc", "final"],
                    help="IQM over the trial's seeds of the AUC or of the final return (default auc)")
    sw.add_argument("--rerun-seeds", type=int, default=5, metavar="M",
                    help="re-run the best knobs on fresh seeds K+1..K+M in DIR/best (default 5; 0: no re-run)")
    sw.add_argument("--baseline", default=None, metavar="DIR",
                    help="a finished ppo sweep with the same --trials: its best knobs join the re-run as 'ppo'")
    sw.add_argument("--no-prune", action="store_true", help="run every trial in full (no median pruning)")
    sw.add_argument("--vmap-trials", type=int, default=1, metavar="N",
                    help="backend=jax: N trials at a time trained as one compiled program, their knobs "
                         "vectorised (PPO's learning_rate, ent_coef, vf_coef, clip_coef, max_grad_norm; "
                         "count.beta, calibration.alpha, calibration.beta, shaping.eta, gear.temperature, "
                         "rnd.int_coef, rnd.ext_coef); no pruning (default 1: one trial at a time)")
    sw.add_argument("--wrapper", default=None, help=WRAPPER_HELP + ", for every run")
    sw.add_argument("--set", action="append", nargs="+", metavar="KEY=VALUE", help="a fixed knob for every run")
    sw.add_argument("--backend", default="local", choices=["local", "ray"], help=BACKEND_HELP)
    sw.add_argument("--workers", type=int, default=None, help="parallel runs (default: the cores)")
    sw.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local one)")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar for the re-run")

    rep = sub.add_parser("report", help="write the HTML and Markdown report of an experiment (or merge the reports "
                         "of an experiment run in parts)")
    rep.add_argument("exp_dir", metavar="DIR", nargs="+",
                     help="an experiment directory (the --out of 'reflectrl compare'); with --out, two or more parts "
                     "of one experiment (their experiment directories or report folders) to merge")
    rep.add_argument("--out", metavar="DIR", default=None,
                     help="merge the parts' reports into this folder: the table, verdicts and claims over every "
                     "part's finished runs (default: none; one experiment's report goes to DIR/report)")
    rep.add_argument("--reps", type=int, default=BOOTSTRAP_REPS,
                     help=f"bootstrap resamples (default {BOOTSTRAP_REPS:,})")

    cl = sub.add_parser("claims", help="one ledger of every claim in the reports under the folders")
    cl.add_argument("dirs", nargs="+", metavar="DIR",
                    help="a folder searched (recursively) for reports' stats.json, e.g. docs/results")
    cl.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown")
    cl.add_argument("--out", metavar="FILE.md", default=None,
                    help="write the ledger to this file (atomically; FILE.json with --json) instead of printing it")

    plot = sub.add_parser("plot", help="draw a run's pictures")
    plot_sub = plot.add_subparsers(dest="plot_command", parser_class=_Parser, required=True)
    cal = plot_sub.add_parser("calibration", help="predicted vs actual advantage and L_cal (refgrpo runs)")
    cal.add_argument("run_dir", metavar="DIR", help=RUN_DIR_HELP)
    cal.add_argument("--out", default=None, help="PNG file (default DIR/calibration.png)")
    rmap = plot_sub.add_parser("reward-map", help="the learned shaping per cell and action (sdrs on the grid world)")
    rmap.add_argument("run_dir", metavar="DIR", help=RUN_DIR_HELP)
    rmap.add_argument("--out", default=None, help="folder for the PNGs and the GIF (default DIR/reward_map)")
    smap = plot_sub.add_parser("state-map", help="visits, env reward and each signal's term over the states, "
                               "at a few points of training (any control run)")
    smap.add_argument("run_dir", metavar="DIR", help=RUN_DIR_HELP)
    smap.add_argument("--dims", default=None, help="two observation indices to project on, e.g. 0,1 (default: the "
                      "grid/MiniGrid cell, Montezuma's position, else obs 0,1: LunarLander's x, y)")
    smap.add_argument("--bins", type=int, default=40, help="bins per axis of a continuous projection (default 40)")
    smap.add_argument("--out", default=None, help="folder for the PNGs and the GIF (default DIR/state_map)")

    from reflectrl import llm_cli
    from reflectrl.sandbox import cli as sandbox_cli

    sandbox_cli.add_parser(sub)
    llm_cli.add_parser(sub)

    ev = sub.add_parser("eval", help="evaluate a run's latest checkpoint")
    ev.add_argument("run_dir", metavar="DIR", help=RUN_DIR_HELP + "; an unfinished run is evaluated at its last "
                    "checkpoint")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    ev.add_argument("--deterministic", action="store_true", help="greedy / mean actions")
    ev.add_argument("--seed", type=int, default=None, help="seed of the evaluation episodes")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--video", metavar="FILE.mp4", default=None, help="record the episodes")
    ev.add_argument("--max-steps", type=int, default=None,
                    help=f"cap on each episode's steps (default: the env's time limit, else {EVAL_MAX_STEPS:,}); "
                         "capped episodes are reported as such")

    kn = sub.add_parser("knobs", help="list every knob with its default and meaning (what --set takes)")
    from reflectrl.knobs import section_names

    kn.add_argument("section", nargs="?", default=None,
                    help=LazyHelp("one section", lambda: f"one section: {', '.join(section_names())}"))
    kn.add_argument("--algo", default=None, help="only the knobs an algo reads (e.g. refgrpo, or llm:gear)")
    kn.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def config_from_args(args):
    """The resolved, validated RunConfig of `reflectrl train` arguments (no --resume): what needs no env
    is checked before torch, JAX or an env package is imported (config.new_config), then the env is probed."""
    from reflectrl.config import new_config

    overrides = _flatten(args.set)
    if getattr(args, "ray_address", None) is not None:
        _check_ray_address(args.algo)
        overrides = [*overrides, f"ray_address={args.ray_address}"]
    cfg = new_config(algo=args.algo, env_id=args.env, seed=args.seed, total_steps=args.total_steps,
                     wrapper=args.wrapper, overrides=overrides)
    from reflectrl.trainers.resolve import resolve_config

    return resolve_config(cfg)


def _check_ray_address(algo: str | None) -> None:
    import dataclasses

    from reflectrl.config import split_algo
    from reflectrl.registry import DEFAULT_TRAINER, TRAINERS, parse_algo

    hosts = [t.name for t in TRAINERS.values() if t.family == "control" and t.config
             and "ray_address" in {f.name for f in dataclasses.fields(t.config_class())}]
    if algo is None or parse_algo(split_algo(algo)[0], "control").trainer not in hosts:
        raise UserError(f"--ray-address places an --algo {' or '.join(hosts)} run's actors on a Ray cluster; --algo "
                        f"{algo or DEFAULT_TRAINER['control']} runs in this process (to spread whole runs over Ray: "
                        "reflectrl compare --backend ray --ray-address ...)")


def config_from_train_argv(argv: list[str]):
    """Check a `reflectrl train` command line without running it."""
    args = build_parser().parse_args(["train", *argv])
    return config_from_args(args)


def _train_group(args) -> int:
    items = _group_items(args.runs)  # before JAX's import: a malformed file is refused at once
    from reflectrl.training import train_group

    runs = [(item["path"], None if item["argv"][:1] == ["--resume"] else config_from_train_argv(item["argv"]),
             item["argv"]) for item in items]
    return train_group(runs, progress=not args.no_progress)


GROUP_FILE_SHAPE = '[{"path": DIR, "argv": [train arguments]}, ...]'


def _group_items(path: str) -> list[dict]:
    """The runs a train-group file lists (what experiments/local.py writes), or one line saying
    what is wrong with its shape."""
    try:
        with open(path) as f:
            items = json.load(f)
    except (OSError, ValueError) as err:
        raise UserError(f"train-group: cannot read {path}: {err}") from None
    if not isinstance(items, list):
        kind = {dict: "an object", str: "a string", bool: "true or false", type(None): "null"}.get(type(items),
                                                                                                "a number")
        raise UserError(f"train-group: {path} holds {kind}, not a list; it must be {GROUP_FILE_SHAPE}")
    for n, item in enumerate(items, 1):
        if not (isinstance(item, dict) and isinstance(item.get("path"), str) and isinstance(item.get("argv"), list)
                and all(isinstance(a, str) for a in item["argv"])):
            raise UserError(f"train-group: item {n} of {path} is not {{\"path\": DIR, \"argv\": [train arguments "
                            f"as strings]}} (the file must be a list {GROUP_FILE_SHAPE})")
    return items


def _train_new(args) -> int:
    if args.out is None:
        raise UserError("train needs --out DIR (a new run directory), or --resume DIR to continue a run")
    cfg = config_from_args(args)  # every check that needs no run directory happens before we make one
    from reflectrl.runs.session import train_new_run  # (after the checks: it imports torch)
    from reflectrl.training import finish, make_trainer

    return train_new_run(args.out, cfg.to_dict(), lambda run: make_trainer(cfg, run), finish,
                         progress=not args.no_progress, resume_command="reflectrl train")


def _train_resume(args) -> int:
    from reflectrl.config import RunConfig
    from reflectrl.runs.session import resume_run
    from reflectrl.training import finish, make_trainer

    given = [("--algo", args.algo), ("--env", args.env), ("--seed", args.seed), ("--total-steps", args.total_steps),
             ("--out", args.out), ("--wrapper", args.wrapper), ("--set", args.set)]
    def build(run):
        cfg = RunConfig.from_dict(run.config())
        if args.ray_address is not None:
            _check_ray_address(cfg.algo)
            cfg.impala.ray_address = args.ray_address  # a cluster's address may change between sessions
        return make_trainer(cfg, run)

    return resume_run(args.resume, given, "control", build, finish, progress=not args.no_progress,
                      resume_command="reflectrl train")


def _eval(args) -> int:
    from reflectrl.evaluate import evaluate

    result = evaluate(args.run_dir, episodes=args.episodes, deterministic=args.deterministic,
                      seed=args.seed, video=args.video, max_steps=args.max_steps)
    if args.json:
        from reflectrl.runs.jsonfile import dumps

        print(dumps(result))  # strict JSON, as the run's files
    else:
        # An episode that reaches the env's own time limit has ended as the env defines it (every Pendulum
        # episode, a CartPole-v1 success): information. One that eval's cap stopped short has a partial return.
        n, capped = result["episodes"], result["capped_episodes"]
        at_limit = result["truncated_episodes"] - capped
        notes = ((f"; {at_limit} of {n} episode(s) ran to the env's time limit" if at_limit else "")
                 + (f"; {capped} of {n} episode(s) stopped at eval's {result['max_steps']:,}-step cap "
                    "(--max-steps): their return is a partial sum" if capped else ""))
        print(f"{result['env_id']} @ {result['global_step']} steps: mean return {format_return(result['mean_return'])} "
              f"+- {result['std_return']:.3g} over {n} episodes "
              f"({'deterministic' if args.deterministic else 'stochastic'}){notes}; "
              f"params_sha256 {result['params_sha256'][:16]}" + (f"; video: {args.video}" if args.video else ""))
    return 0


def _compare(args) -> int:
    from pathlib import Path

    from reflectrl.experiments.spec import compare_spec

    # checked before the runner's imports (torch): a bad entry or --set is refused at once
    spec = compare_spec(args.env, args.algos, seeds=args.seeds, total_steps=args.total_steps, sets=_flatten(args.set),
                        wrapper=args.wrapper, first_seed=args.first_seed, preset=args.preset)
    from reflectrl.experiments.runner import run_experiment

    root = Path(args.out)
    result = run_experiment(root, spec, backend=args.backend, workers=args.workers,
                            ray_address=args.ray_address, progress=not args.no_progress)
    print(result.summary())
    for run, why in result.failed:
        print(f"  failed: {run.path} ({why}); see {run.path.with_suffix('.log')}", file=sys.stderr)
    if not args.no_report:
        _print_report(root, reps=BOOTSTRAP_REPS)
    return EXIT_FAILED if result.failed else 0


def _sweep(args) -> int:
    from pathlib import Path

    from reflectrl import sweep as sw

    if args.trials < 1:
        raise UserError(f"--trials {args.trials}: must be >= 1")
    if args.rerun_seeds < 0:
        raise UserError(f"--rerun-seeds {args.rerun_seeds}: must be >= 0 (0: no re-run)")
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers {args.workers}: must be >= 1")
    if args.backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError("--backend ray needs Ray: pip install 'reflectrl[ray]'") from None
    knobs = sw.parse_space(_flatten(args.space), args.space_file)
    algo, sets = sw.fixed_knobs(args.algo.strip(), _flatten(args.set))  # knobs in --algo's brackets: fixed ones
    spec = sw.SweepSpec(env=args.env, algo=algo, space=[k.text for k in knobs], seeds=args.seeds,
                        total_steps=args.total_steps, objective=args.objective, wrapper=args.wrapper, sets=sets)
    spec.check()  # what needs no env, before Optuna's import and the envs'
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError("reflectrl sweep needs Optuna: pip install 'reflectrl[sweep]'") from None
    spec.validate()
    if args.vmap_trials < 1:
        raise UserError(f"--vmap-trials {args.vmap_trials}: must be >= 1 (1: one trial at a time)")
    if args.vmap_trials > 1:
        if args.backend == "ray":
            raise UserError("--vmap-trials trains a batch of trials in one local process: drop --backend ray")
        sw.vectorised_keys(spec)
    baseline = Path(args.baseline) if args.baseline else None
    if baseline is not None:
        sw.check_baseline(spec, args.trials, baseline)
    root = Path(args.out)
    backend = {"backend": args.backend, "workers": args.workers, "ray_address": args.ray_address}
    result = sw.run_sweep(root, spec, args.trials, backend, prune=not args.no_prune, vmap_trials=args.vmap_trials)
    print(f"sweep: {result.ran} trial(s) run now, {args.trials} in the study; study: {root / sw.STUDY_FILE}; "
          f"trials and sensitivity plots: {root / 'report'}")
    if result.best is None:
        print(f"no trial completed; see the logs in {root / 'trials'}", file=sys.stderr)
        return EXIT_FAILED
    best = result.best
    print(f"best: trial {best['trial']}, {' '.join(best['set'])}: {best['objective']} {format_return(best['value'])}; "
          f"{root / sw.BEST_FILE}")
    if args.rerun_seeds == 0:
        return 0
    rerun = sw.rerun_spec(spec, best, args.rerun_seeds, baseline)
    out = root / "best"
    sw.prepare_rerun(out, rerun)
    print(f"re-running the best knobs{' beside the tuned ppo of ' + str(baseline) if baseline else ''} "
          f"on fresh seeds {rerun.first_seed}-{rerun.seed_numbers[-1]} in {out} "
          f"(seeds 1-{spec.seeds} were the search's)")
    from reflectrl.experiments.runner import run_experiment

    runs = run_experiment(out, rerun, backend=args.backend, workers=args.workers, ray_address=args.ray_address,
                          progress=not args.no_progress)
    print(runs.summary())
    for run, why in runs.failed:
        print(f"  failed: {run.path} ({why}); see {run.path.with_suffix('.log')}", file=sys.stderr)
    _print_report(out, reps=BOOTSTRAP_REPS)
    return EXIT_FAILED if runs.failed else 0


def _presets_help() -> str:
    from reflectrl.experiments.presets import presets_help

    return presets_help()


def _print_report(root, reps: int) -> None:
    from reflectrl.report.render import claims_text, solved_text, write_report

    path, claims = write_report(root, reps=reps)
    print(f"report: {path}")
    print(f"summary: {path.with_name('report.md')}")
    table = json.loads(path.with_name("stats.json").read_text())["table"]
    solved = solved_text(table)
    if solved:
        print(solved)
    print(claims_text(claims))


def _report(args) -> int:
    from pathlib import Path

    if args.reps < 100:
        raise UserError(f"--reps {args.reps}: use at least 100 bootstrap resamples")
    for d in args.exp_dir:
        if not Path(d).exists():
            raise UserError(f"{d} does not exist; pass the --out of a 'reflectrl compare'")
    if args.out is not None:
        from reflectrl.report.merge import write_merged
        from reflectrl.report.render import claims_text

        path, claims = write_merged(args.exp_dir, args.out, reps=args.reps)
        print(f"merged report of {len(args.exp_dir)} parts: {path}")
        print(f"report: {path.with_name('index.html')}")
        print(claims_text(claims))
        return 0
    if len(args.exp_dir) > 1:
        raise UserError(f"{len(args.exp_dir)} folders given: one experiment's report takes one DIR; to merge the "
                        "parts of an experiment run in parts, add --out FOLDER")
    _print_report(Path(args.exp_dir[0]), args.reps)
    return 0


def _claims(args) -> int:
    from reflectrl.report.claims import run

    text = run(args.dirs, out=args.out, as_json=args.json)
    if args.out:
        print(f"claims ledger: {args.out}")
    else:
        print(text, end="")
    return 0


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _one_line_warnings(message, category, filename, lineno, line=None):
    # libraries colour their warnings (gymnasium's logger): the codes are noise in a log file
    text = _ANSI.sub("", str(message)).strip()
    text = re.sub(r"^(WARN|WARNING):\s*", "", text)
    return f"reflectrl: warning: {text}\n"


def main(argv: list[str] | None = None) -> int:
    warnings.formatwarning = _one_line_warnings
    try:
        args = build_parser().parse_args(argv)
        if args.command == "train":
            return _train_resume(args) if args.resume else _train_new(args)
        if args.command == "train-group":
            return _train_group(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "report":
            return _report(args)
        if args.command == "claims":
            return _claims(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "knobs":
            from reflectrl.knobs import print_knobs

            return print_knobs(args.section, args.algo, as_json=args.json)
        if args.command == "plot":
            if args.plot_command == "state-map":
                from reflectrl.report.state_map import plot_state_map

                print(plot_state_map(args.run_dir, args.out, dims=args.dims, bins=args.bins))
                return 0
            if args.plot_command == "reward-map":
                from reflectrl.report.reward_map import plot_reward_map

                print(plot_reward_map(args.run_dir, args.out))
                return 0
            from reflectrl.signals.calibration.plot import plot_calibration

            print(plot_calibration(args.run_dir, args.out))
            return 0
        if args.command == "llm":
            from reflectrl import llm_cli

            return llm_cli.run(args)
        if args.command == "sandbox":
            from reflectrl.sandbox import cli as sandbox_cli

            return sandbox_cli.run(args)
        raise UserError(f"unknown command {args.command}")
    except UserError as err:
        print(f"reflectrl: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as stop:
        # train and llm train say so themselves (runs/session.py); compare and sweep get here, and the
        # same command line resumes them
        from reflectrl.runs.session import Terminated

        terminated = isinstance(stop, Terminated)
        words = sys.argv[1:] if argv is None else [str(a) for a in argv]
        again = f"; continue with: reflectrl {shlex.join(words)}" if words[:1] in (["compare"], ["sweep"]) else ""
        print(("reflectrl: terminated" if terminated else "\nreflectrl: interrupted") + again, file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except OSError as err:
        # an output that could not be written after the checks before the work (outputs.py): a disk
        # that filled, a folder removed meanwhile; the writers leave no partial file behind
        if err.filename is None and err.errno not in HINTS:
            raise
        print(f"reflectrl: error: {write_error(err)}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
