"""GRPO vs GEAR (winners) vs GEAR (all) on the tiny SFT'd model: accuracy against steps, and
GEAR's extra time per step.

    python examples/experiments/llm_learning.py [--seeds 3] [--steps 300] [--workers 1] [--out bench/results/llm]

Builds (once, in OUT) a tiny Llama-style model with `reflectrl llm init-tiny`, warm-starts
it on each task with `reflectrl llm sft` to an intermediate accuracy, then runs
`reflectrl llm train` for every (task, algo, seed); a finished run is skipped, so the
script resumes. Prints and writes OUT/summary.md: final and mean held-out greedy accuracy
(interquartile mean over seeds, 95% bootstrap CI; with fewer than 5 seeds the interval is
called the seeds' range), mean seconds per step and GEAR's time over GRPO's, each algo's IQM
difference from grpo (stratified bootstrap), the sampled reward (first and last 50 steps) and
completion length (last 50 steps); OUT/runs.csv with every run's scores (unfinished runs listed,
left out of the tables), OUT/provenance.json (git commit, command, versions, machine, date,
statistics settings; the training commands from OUT/commands.jsonl), and OUT/<task>.png with
the curves.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from reflectrl.llm.model import RG_SHORT
from reflectrl.report.provenance import bench_provenance, to_json
from reflectrl.report.stats import interval, iqm, iqm_difference

TASKS = {"arith9": "arith[max_operand=9]", "rg-arith": RG_SHORT}
ALGOS = {"grpo": ["--algo", "grpo"], "gear": ["--algo", "gear"],
         "gear-all": ["--algo", "gear", "--set", "gear.distill_on=all"],
         # ablations: every token's return is the outcome (no discount trend along the sequence)
         "gear-traj": ["--algo", "gear", "--set", "gear.return_kind=trajectory"],
         "gear-dr": ["--algo", "gear", "--set", "loss_type=dr_grpo"],
         "grpo-dr": ["--algo", "grpo", "--set", "loss_type=dr_grpo"]}
DEFAULT_ALGOS = "grpo,gear,gear-all"
COMMON = ["group_size=16", "prompts_per_step=8", "learning_rate=3e-4", "eval_every=25", "eval_problems=128",
          "log_kl=false", "torch_threads=1"]
CLI = [sys.executable, "-m", "reflectrl"]


def sh(argv: list[str], log: Path | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") if log else open(os.devnull, "w") as out:
        subprocess.run(argv, check=True, stdout=out, stderr=subprocess.STDOUT, env=env)


def finished(run: Path) -> bool:
    try:
        return json.loads((run / "run.json").read_text())["status"] == "finished"
    except (OSError, KeyError, ValueError):
        return False


def prepare(out: Path, sft_steps: int) -> dict[str, Path]:
    tiny = out / "tiny"
    if not (tiny / "config.json").exists():
        sh([*CLI, "llm", "init-tiny", "--out", str(tiny)])
    models = {}
    for name, spec in TASKS.items():
        sft_dir = out / f"sft-{name}"
        if not (sft_dir / "config.json").exists():
            sh([*CLI, "llm", "sft", "--model", str(tiny), "--task", spec, "--steps", str(sft_steps),
                "--lr", "3e-3", "--out", str(sft_dir), "--no-progress"])
        models[name] = sft_dir
    return models


def train(out: Path, models: dict[str, Path], task: str, algo: str, seed: int, steps: int) -> Path:
    run = out / task / algo / f"seed{seed}"
    if finished(run):
        return run
    if run.exists():  # an interrupted run continues where its checkpoint is
        sh([*CLI, "llm", "train", "--resume", str(run), "--no-progress"], run.with_suffix(".log"))
        return run
    run.parent.mkdir(parents=True, exist_ok=True)
    sh([*CLI, "llm", "train", *ALGOS[algo], "--task", TASKS[task], "--model", str(models[task]),
        "--steps", str(steps), "--seed", str(seed), "--out", str(run), "--no-progress", "--set", *COMMON],
       run.with_suffix(".log"))
    return run


def load(run: Path) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    steps, acc = map(np.array, zip(*evals))
    return steps, acc, [r for r in rows if "reward" in r]


COMMANDS = "commands.jsonl"
CI_MIN_SEEDS = 5  # below this, a row's bootstrap interval is called the seeds' range, not a 95% CI
WINDOW = 50  # training steps averaged for the sampled reward and the completion length
CSV_COLUMNS = ["env", "algo", "seed", "status", "final", "auc", "start", "step_seconds", "reward_first50",
               "reward_last50", "completion_tokens_last50", "signal_time_fraction", "evals", "steps", "run"]


def seed_dirs(out: Path, task: str, algo: str, seeds: int) -> list[tuple[int, Path]]:
    """The runs of (task, algo) with seed 1..seeds that exist (started) in OUT."""
    return [(s, r) for s in range(1, seeds + 1) if (r := out / task / algo / f"seed{s}").is_dir()]


def run_row(task: str, algo: str, seed: int, run: Path) -> dict:
    """One row of runs.csv: a finished run's scores; an unfinished run's status only."""
    row = {k: "" for k in CSV_COLUMNS}
    row.update(env=task, algo=algo, seed=seed, run=f"{task}/{algo}/seed{seed}")
    if not finished(run):
        row["status"] = "unfinished"
        return row
    steps, acc, train_rows = load(run)
    reward = [r["reward"] for r in train_rows]
    length = [r["completion_length"] for r in train_rows]
    share = [r["signal_time_fraction"] for r in train_rows if "signal_time_fraction" in r]
    row.update(status="finished", final=float(acc[-1]), auc=float(acc.mean()), start=float(acc[0]),
               step_seconds=float(np.mean([r["step_seconds"] for r in train_rows])),
               reward_first50=float(np.mean(reward[:WINDOW])), reward_last50=float(np.mean(reward[-WINDOW:])),
               completion_tokens_last50=float(np.mean(length[-WINDOW:])),
               signal_time_fraction=float(np.mean(share)) if share else "",
               evals=len(acc), steps=len(train_rows))
    return row


def write_csv(path: Path, rows: list[dict]) -> None:
    def cell(v):
        return repr(v) if isinstance(v, float) else str(v)

    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([cell(r[k]) for k in CSV_COLUMNS])


def summarise(out: Path, seeds: int) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reflectrl.report.plots import png_bytes

    rows = [run_row(task, algo, s, r) for task in TASKS for algo in ALGOS for s, r in seed_dirs(out, task, algo, seeds)]
    write_csv(out / "runs.csv", rows)
    done = {}  # (task, algo) -> finished rows
    for r in rows:
        if r["status"] == "finished":
            done.setdefault((r["env"], r["algo"]), []).append(r)
    counts = sorted({len(v) for v in done.values()})
    if counts and counts[0] >= CI_MIN_SEEDS:
        ci = "95% CI"
    elif counts and counts[-1] < CI_MIN_SEEDS:
        ci = "seeds' range"
    else:
        ci = f"95% CI; seeds' range where seeds < {CI_MIN_SEEDS}"
    lines = [f"| task | algo | seeds | final greedy accuracy, IQM [{ci}] | mean over evals (AUC) | start | "
             "s/step | vs grpo | signal share |", "|---|---|---|---|---|---|---|---|---|"]
    diff_lines = [f"| task | algo | seeds (algo, grpo) | final accuracy, IQM difference vs grpo [{ci}] | "
                  "AUC, IQM difference vs grpo |", "|---|---|---|---|---|"]
    reward_lines = [f"| task | algo | seeds | reward, first {WINDOW} -> last {WINDOW} steps | "
                    f"completion tokens, last {WINDOW} steps |", "|---|---|---|---|---|"]
    for task in TASKS:
        fig, ax = plt.subplots(figsize=(6, 4))
        base_time = None
        base = None
        for algo in ALGOS:
            runs = [out / task / algo / f"seed{r['seed']}" for r in done.get((task, algo), [])]
            if not runs:
                continue
            curves = [load(r) for r in runs]
            steps = curves[0][0]
            acc = np.stack([c[1] for c in curves])
            final = acc[:, -1:]
            auc = acc.mean(1, keepdims=True)
            f, flo, fhi = interval([final], iqm)
            a, alo, ahi = interval([auc], iqm)
            step_s = float(np.mean([np.mean([r["step_seconds"] for r in c[2]]) for c in curves]))
            share = [r.get("signal_time_fraction") for c in curves for r in c[2] if "signal_time_fraction" in r]
            base_time = step_s if algo == "grpo" else base_time
            rel = f"{step_s / base_time - 1:+.1%}" if base_time and algo != "grpo" else ""
            share_text = f"{np.mean(share):.1%}" if share else ""
            lines.append(f"| {task} | {algo} | {len(runs)} | {f:.3f} [{flo:.3f}, {fhi:.3f}] | "
                         f"{a:.3f} [{alo:.3f}, {ahi:.3f}] | {acc[:, 0].mean():.3f} | {step_s:.3f} | {rel} | "
                         f"{share_text} |")
            if algo == "grpo":
                base = (final, auc)
            elif base is not None:
                d, dlo, dhi = interval([final, base[0]], iqm_difference)
                e, elo, ehi = interval([auc, base[1]], iqm_difference)
                diff_lines.append(f"| {task} | {algo} | {len(runs)}, {len(base[0])} | "
                                  f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] | {e:+.3f} [{elo:+.3f}, {ehi:+.3f}] |")
            reward = [(r["reward_first50"], r["reward_last50"], r["completion_tokens_last50"])
                      for r in done[(task, algo)]]
            r0, r1, tokens = np.mean(reward, axis=0)
            reward_lines.append(f"| {task} | {algo} | {len(runs)} | {r0:.3f} -> {r1:.3f} | {tokens:.1f} |")
            mean = acc.mean(0)
            ax.plot(steps, mean, label=f"{algo} ({len(runs)} seeds)")
            ax.fill_between(steps, acc.min(0), acc.max(0), alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title(f"{task}: {TASKS[task]}"[:70], fontsize=9)
        if ax.lines:
            ax.legend(fontsize=8)
        fig.tight_layout()
        (out / f"{task}.png").write_bytes(png_bytes(fig, 110))
        plt.close(fig)
    unfinished = [f"{r['env']}/{r['algo']}/seed{r['seed']}" for r in rows if r["status"] != "finished"]
    notes = [f"Accuracy: held-out greedy accuracy, IQM over each row's finished seeds (seeds 1..{seeds} asked), "
             f"percentile stratified bootstrap (seed 0); with fewer than {CI_MIN_SEEDS} seeds the interval is "
             "the seeds' range, not a 95% CI (the IQM of fewer than 4 values is their mean). Mean line and "
             "band in the plots: mean and min-max over seeds. Per-run scores: runs.csv."]
    if unfinished:
        notes.append(f"Unfinished, left out: {', '.join(unfinished)}.")
    text = "\n".join([*lines, "", *diff_lines, "",
                      f"Sampled reward (mean of the first and last {WINDOW} training steps) and completion "
                      f"length (last {WINDOW} steps), mean over seeds:", "", *reward_lines, "", *notes])
    (out / "summary.md").write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default="bench/results/llm")
    ap.add_argument("--algos", default=DEFAULT_ALGOS, help=f"entries of {', '.join(ALGOS)}")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"of {', '.join(TASKS)}")
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join([sys.executable, *sys.argv])
    if not args.summary_only:
        with open(out / COMMANDS, "a") as f:  # every command that trained runs here, for provenance.json
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            f.write(json.dumps({"date": stamp, "command": command}) + "\n")
        models = prepare(out, args.sft_steps)
        algos, tasks = args.algos.split(","), args.tasks.split(",")
        jobs = [(t, a, s) for s in range(1, args.seeds + 1) for t in tasks for a in algos]
        with ThreadPoolExecutor(args.workers) as pool:
            for run in pool.map(lambda j: train(out, models, *j, args.steps), jobs):
                print(f"done: {run}", flush=True)
    print(summarise(out, args.seeds))
    data = bench_provenance(out, command, statistics_extra={
        "statistic": "IQM over seeds of each (task, algo): final and mean-over-evals held-out greedy accuracy",
        "interval": "percentile stratified bootstrap (report/stats.py interval), differences vs grpo with "
                    "iqm_difference",
        "ci_min_seeds": CI_MIN_SEEDS, "reward_window_steps": WINDOW, "seeds_asked": args.seeds,
        "not_used_here": "this script makes no verdicts: alpha, holm_correction, verdict_bootstrap_seeds and "
                         "equivalence_margin_share are the report code's settings, listed for completeness"},
        note="this command wrote the summary; the runs' own 'reflectrl llm train' commands are in each run's "
             "run.json; runs.csv lists every run with its status; run_commands: the commands of this script "
             "that trained runs in OUT (from OUT/commands.jsonl)")
    path = out / COMMANDS
    data["run_commands"] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    (out / "provenance.json").write_bytes(to_json(data))


if __name__ == "__main__":
    main()
