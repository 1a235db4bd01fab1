"""GRPO vs GEAR (winners) vs GEAR (all) on the tiny SFT'd model: accuracy against steps, and
GEAR's extra time per step.

    python bench/llm_learning.py [--seeds 3] [--steps 300] [--workers 1] [--out bench/results/llm]

Builds (once, in OUT) a tiny Llama-style model with `reflectrl llm init-tiny`, warm-starts
it on each task with `reflectrl llm sft` to an intermediate accuracy, then runs
`reflectrl llm train` for every (task, algo, seed); a finished run is skipped, so the
script resumes. Prints and writes OUT/summary.md: final and mean held-out greedy accuracy
(interquartile mean over seeds, 95% bootstrap CI), mean seconds per step and GEAR's time
over GRPO's, and OUT/<task>.png with the curves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from reflectrl.llm.model import RG_SHORT
from reflectrl.report.stats import interval, iqm

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


def summarise(out: Path, seeds: int) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["| task | algo | final greedy accuracy, IQM [95% CI] | mean over evals (AUC) | start | "
             "s/step | vs grpo | signal share |", "|---|---|---|---|---|---|---|---|"]
    for task in TASKS:
        fig, ax = plt.subplots(figsize=(6, 4))
        base_time = None
        for algo in ALGOS:
            runs = [out / task / algo / f"seed{s}" for s in range(1, seeds + 1)]
            runs = [r for r in runs if finished(r)]
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
            lines.append(f"| {task} | {algo} | {f:.3f} [{flo:.3f}, {fhi:.3f}] | {a:.3f} [{alo:.3f}, {ahi:.3f}] | "
                         f"{acc[:, 0].mean():.3f} | {step_s:.3f} | {rel} | {share_text} |")
            mean = acc.mean(0)
            ax.plot(steps, mean, label=f"{algo} ({len(runs)} seeds)")
            ax.fill_between(steps, acc.min(0), acc.max(0), alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title(f"{task}: {TASKS[task]}"[:70], fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{task}.png", dpi=110)
        plt.close(fig)
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    return table


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
    if not args.summary_only:
        models = prepare(out, args.sft_steps)
        algos, tasks = args.algos.split(","), args.tasks.split(",")
        jobs = [(t, a, s) for s in range(1, args.seeds + 1) for t in tasks for a in algos]
        with ThreadPoolExecutor(args.workers) as pool:
            for run in pool.map(lambda j: train(out, models, *j, args.steps), jobs):
                print(f"done: {run}", flush=True)
    print(summarise(out, args.seeds))


if __name__ == "__main__":
    main()
