"""Calibrated language-model agents on the tiny model: grpo vs grpo+verdict (the RefGRPO
paper's verbal verdict) vs grpo+confidence (RLCR's Brier score), and self-improvement on the
model's own verdict (pseudo_reward=verdict) against its labelled counterpart.

    python examples/experiments/llm_calibration.py [--seeds 5] [--steps 300] [--tasks arith9,rag]
                                                   [--out bench/results/llm-calibration]

Builds (once per task, in OUT) a tiny Llama-style model whose tokenizer also learns the
task's text with its reflections, warm-starts it per task with `reflectrl llm sft` on demonstrations that end in a
reflection (reflect=both: the format, and judging masked wrong answers "not solved"), then
runs `reflectrl llm train` for every (task, entry, seed); a finished run is skipped, an
interrupted one resumes. Every entry trains on the same task spec (reflect=both), so all
state a verdict and a confidence and their calibration compares. Self-improvement entries
start from the SFT model (`self-sft`) and from seed 1's final grpo+verdict model
(`self-cal`, with `labelled-cal`, plain grpo from that model, as its counterpart).

Writes OUT/summary.md (final held-out greedy metrics and the sampled training episodes' mean
over the last 50 steps, IQM over seeds with bootstrap intervals; the per-run values in
OUT/per_run.json), OUT/<task>-<metric>.png curves, and prints the table.

Reflection after feedback (issue 41): `--tasks code,arith9 --entries grpo,verdict,confidence`
compares the reflection stated after the environment's feedback (`code`: the agent writes the
body, reads the VISIBLE tests' output, then states "solved 0.8"; judged against the HIDDEN
tests) with the one stated in the answer's own turn, before any feedback (`arith9`). Also
writes OUT/feedback.md (final held-out greedy and sampled-episode metrics per task and entry,
with the `_before_feedback` / `_after_feedback` columns, differences to grpo and the claims) and
OUT/runs.csv (one row per run). The budget flags (`--steps`, `--sft-steps`, `--group-size`,
`--prompts`, `--eval-every`, `--eval-problems`) size it for a loaded machine:

    python -u examples/experiments/llm_calibration.py --tasks code,arith9 --entries grpo,verdict,confidence --seeds 10 \
        --steps 40 --sft-steps 300 --group-size 8 --prompts 8 --eval-every 20 --eval-problems 64 \
        --no-self --feedback --out bench/results/llm-feedback
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from reflectrl.report.stats import (
    holm,
    interval,
    iqm,
    iqm_difference,
    probability_of_improvement,
    stratified_bootstrap,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_learning import finished, sh  # noqa: E402  (the same subprocess and run-status helpers)

TASKS = {"arith9": "arith[max_operand=9;reflect=both]",   # no feedback: the reflection ends the answer's turn
         "rag": "rag[reflect=both;reflect_after=answer]",  # 60 people, 1-3 hops, top-1 BM25 (the first runs' format)
         "code": "code[reflect=both;reflect_after=feedback]"}  # body, visible tests' output, then the reflection
SFT_STEPS = {"arith9": 300, "rag": 250, "code": 300}  # rag: greedy 1.0 but sampled 0.47 (175 steps: 0.80, 0.14)
STEPS = {"arith9": 300, "rag": 200, "code": 300}      # GRPO steps (--steps overrides)
TASK_SETS = {"rag": ["group_size=8"]}      # rag's episodes are 3-5 turns: 64 per step
ENTRIES = {"grpo": ["--algo", "grpo"],
           "verdict": ["--algo", "grpo+verdict"],
           "confidence": ["--algo", "grpo+confidence"],
           # the bonus kept all along (the paper's schedule drops it after two thirds)
           "verdict-const": ["--algo", "grpo+verdict", "--set", "verdict.schedule=constant"]}
SELF = {"self-sft": ("sft", ["--algo", "grpo", "--set", "pseudo_reward=verdict"]),
        "self-cal": ("cal", ["--algo", "grpo", "--set", "pseudo_reward=verdict"]),
        "labelled-cal": ("cal", ["--algo", "grpo"])}
COMMON = ["group_size=16", "prompts_per_step=8", "learning_rate=3e-4", "eval_every=25", "eval_problems=128",
          "log_kl=false", "torch_threads=1"]
SAMPLED = ("accuracy", "reflection_accuracy", "ece", "brier", "auroc")  # sampled training episodes, last 50 steps
METRICS = ("eval_accuracy", "eval_reflection_accuracy", "eval_under_confidence_rate", "eval_over_confidence_rate",
           "eval_solved_rate", "eval_ece", "eval_brier", "eval_auroc", "eval_selective_auc")
CLI = [sys.executable, "-m", "reflectrl"]


def prepare(out: Path, tasks: list[str], sft_steps: int | None = None) -> dict[str, Path]:
    models = {}
    for name in tasks:
        tiny = out / f"tiny-{name}"  # its tokenizer also learns this task's text, reflections included
        if not (tiny / "config.json").exists():
            sh([*CLI, "llm", "init-tiny", "--out", str(tiny), "--task", TASKS[name]])
        sft_dir = out / f"sft-{name}"
        if not (sft_dir / "config.json").exists():
            sh([*CLI, "llm", "sft", "--model", str(tiny), "--task", TASKS[name],
                "--steps", str(sft_steps or SFT_STEPS[name]),
                "--lr", "3e-3", "--out", str(sft_dir), "--no-progress"])
        models[name] = sft_dir
    return models


def train(out: Path, model: Path, task: str, entry: str, argv: list[str], seed: int, steps: int,
          budget: tuple = ()) -> Path:
    run = out / task / entry / f"seed{seed}"
    if finished(run):
        return run
    if run.exists():
        sh([*CLI, "llm", "train", "--resume", str(run), "--no-progress"], run.with_suffix(".log"))
        return run
    run.parent.mkdir(parents=True, exist_ok=True)
    head, sets = (argv[:argv.index("--set")], argv[argv.index("--set") + 1:]) if "--set" in argv else (argv, [])
    sh([*CLI, "llm", "train", *head, "--task", TASKS[task], "--model", str(model), "--steps", str(steps),
        "--seed", str(seed), "--out", str(run), "--no-progress", "--set", *COMMON, *TASK_SETS.get(task, []),
        *budget, *sets],
       run.with_suffix(".log"))
    return run


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


DIFFERENCES = ("eval_accuracy", "accuracy_mean_of_evals", "sampled_accuracy", "eval_reflection_accuracy",
               "sampled_reflection_accuracy", "sampled_ece", "sampled_brier", "sampled_auroc")


def differences(per_run: dict) -> str:
    """Each signal entry minus grpo (and labelled-cal minus self-cal): IQM difference [95% bootstrap
    CI], P(entry > grpo) over the runs' pairs."""
    head = ["task", "entry - baseline", *DIFFERENCES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pairs = [(e, "grpo") for e in ("verdict", "verdict-const", "confidence")] + [("self-cal", "labelled-cal"),
                                                                                  ("self-sft", "grpo")]
    for task, entries in per_run.items():
        for entry, base in pairs:
            if entry not in entries or base not in entries:
                continue
            cells = [task, f"{entry} - {base}"]
            for m in DIFFERENCES:
                x = np.array([v for v in entries[entry][m] if v is not None], dtype=float)[:, None]
                y = np.array([v for v in entries[base][m] if v is not None], dtype=float)[:, None]
                if len(x) == 0 or len(y) == 0:
                    cells.append("n/a")
                    continue
                mid, lo, hi = interval([x, y], iqm_difference)
                cells.append(f"{mid:+.3f} [{lo:+.3f}, {hi:+.3f}] P>{probability_of_improvement(x, y):.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(out: Path, seeds: int, tasks: list[str]) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head = (["task", "entry", "runs", "start accuracy", "accuracy, mean of evals"]
            + [m.removeprefix("eval_") for m in METRICS]
            + [f"sampled {m}" for m in SAMPLED] + ["s/step", "signal share"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    per_run: dict = {}
    for task in tasks:
        curves: dict = {}
        for entry in [*ENTRIES, *SELF]:
            runs = [r for r in (out / task / entry / f"seed{s}" for s in range(1, seeds + 1)) if finished(r)]
            unfinished = [str(r) for r in (out / task / entry / f"seed{s}" for s in range(1, seeds + 1))
                          if r.exists() and not finished(r)]
            if not runs:
                continue
            data = [rows(r) for r in runs]
            evals = [[r for r in d if "eval_accuracy" in r] for d in data]
            per_run.setdefault(task, {})[entry] = {"runs": [str(r) for r in runs], "unfinished": unfinished}
            auc = [float(np.mean([r["eval_accuracy"] for r in e])) for e in evals]
            per_run[task][entry]["accuracy_mean_of_evals"] = auc
            mid, lo, hi = interval([np.array(auc)[:, None]], iqm)
            cells = [task, entry, str(len(runs)), f"{evals[0][0]['eval_accuracy']:.3f}",
                     f"{mid:.3f} [{lo:.3f}, {hi:.3f}]"]
            for m in METRICS:
                finals = [e[-1].get(m) for e in evals]
                per_run[task][entry][m] = finals
                values = np.array([v for v in finals if v is not None], dtype=float)
                if len(values) == 0:
                    cells.append("n/a")
                    continue
                mid, lo, hi = interval([values[:, None]], iqm)
                cells.append(f"{mid:.3f} [{lo:.3f}, {hi:.3f}]")
                values = np.array([[r.get(m, np.nan) for r in e] for e in evals], dtype=float)
                curves.setdefault(m, {})[entry] = (np.array([r["step"] for r in evals[0]]), values)
            for m in SAMPLED:  # what the signals train on: the sampled episodes (temperature 1)
                finals = []
                for d in data:
                    values = [r.get(m) for r in d if "reward" in r][-50:]
                    values = [v for v in values if v is not None and np.isfinite(v)]
                    finals.append(float(np.mean(values)) if values else None)
                per_run[task][entry][f"sampled_{m}"] = finals
                known = np.array([v for v in finals if v is not None])
                if len(known) == 0:
                    cells.append("n/a")
                    continue
                mid, lo, hi = interval([known[:, None]], iqm)
                cells.append(f"{mid:.3f} [{lo:.3f}, {hi:.3f}]")
            step_s = float(np.mean([np.mean([r["step_seconds"] for r in d if "step_seconds" in r]) for d in data]))
            share = [r["signal_time_fraction"] for d in data for r in d if "signal_time_fraction" in r]
            start = {m: evals[0][0].get(m) for m in METRICS}
            per_run[task][entry]["start"] = start
            for m in SAMPLED:  # the sampled episodes over training, a 10-step moving average per run
                series = []
                for d in data:
                    raw = np.array([np.nan if r.get(m) is None else r[m] for r in d if "reward" in r], dtype=float)
                    kernel = np.ones(10) / 10
                    series.append(np.convolve(np.nan_to_num(raw, nan=np.nanmean(raw)), kernel, mode="valid"))
                width = min(len(x) for x in series)
                values = np.stack([x[:width] for x in series])
                curves.setdefault(f"sampled_{m}", {})[entry] = (np.arange(10, 10 + width), values)
            cells += [f"{step_s:.3f}", f"{np.mean(share):.1%}" if share else ""]
            lines.append("| " + " | ".join(cells) + " |")
        for m, by_entry in curves.items():
            fig, ax = plt.subplots(figsize=(6, 4))
            for entry, (steps, values) in by_entry.items():
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # an evaluation where every run's value is null
                    ax.plot(steps, np.nanmean(values, 0), label=f"{entry} ({len(values)})")
                    ax.fill_between(steps, np.nanmin(values, 0), np.nanmax(values, 0), alpha=0.15)
            ax.set_xlabel("GRPO step")
            ax.set_ylabel(m.removeprefix("eval_") + " (held-out, greedy)" if m.startswith("eval_")
                          else m.removeprefix("sampled_") + " (sampled episodes, 10-step mean)")
            ax.set_title(f"{task}: {TASKS[task]}", fontsize=9)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(out / f"{task}-{m.removeprefix('eval_')}.png", dpi=100)
            plt.close(fig)
    lines += ["", differences(per_run)]
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    (out / "per_run.json").write_text(json.dumps(per_run, indent=1) + "\n")
    return table


def sampled_eval(out: Path, task: str, seeds: int, problems: int) -> str:
    """Every finished main entry's final model on `problems` held-out problems sampled at
    temperature 1 (`llm eval --temperature 1 --seed 0`): the distribution GRPO trains on.
    Writes OUT/sampled_eval.jsonl (one row per run) and returns a table with the differences."""
    rows = []
    for entry in ENTRIES:
        for s in range(1, seeds + 1):
            run = out / task / entry / f"seed{s}"
            if not finished(run):
                continue
            result = subprocess.run([*CLI, "llm", "eval", "--model", str(run), "--task", TASKS[task], "--problems",
                                     str(problems), "--temperature", "1", "--seed", "0", "--json"],
                                    check=True, capture_output=True, text=True,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
            row = json.loads(result.stdout)
            row.pop("selective_curve")
            rows.append({"entry": entry, "seed": s, "run": str(run), **row})
    (out / "sampled_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = ("accuracy", "reflection_accuracy", "under_confidence_rate", "over_confidence_rate", "ece", "brier", "auroc")
    by: dict = {}
    for r in rows:
        by.setdefault(r["entry"], []).append(r)
    lines = ["| entry | runs | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for entry, rs in by.items():
        cells = []
        for k in keys:
            v = np.array([r[k] for r in rs if r[k] is not None], dtype=float)[:, None]
            mid, lo, hi = interval([v], iqm)
            cells.append(f"{mid:.3f} [{lo:.3f}, {hi:.3f}]")
        lines.append(f"| {entry} | {len(rs)} | " + " | ".join(cells) + " |")
    lines += ["", "| entry - grpo | reflection_accuracy | ece | brier |", "|---|---|---|---|"]
    for entry in by:
        if entry == "grpo" or "grpo" not in by:
            continue
        cells = []
        for k in ("reflection_accuracy", "ece", "brier"):
            x = np.array([r[k] for r in by[entry]], dtype=float)[:, None]
            y = np.array([r[k] for r in by["grpo"]], dtype=float)[:, None]
            mid, lo, hi = interval([x, y], iqm_difference)
            cells.append(f"{mid:+.3f} [{lo:+.3f}, {hi:+.3f}] P>{probability_of_improvement(x, y):.2f}")
        lines.append(f"| {entry} - grpo | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "sampled_eval.md").write_text(table + "\n")
    return table


FEEDBACK_COLUMNS = ("accuracy", "reflection_accuracy", "under_confidence_rate", "over_confidence_rate", "ece",
                    "brier", "auroc", "reflection_format_rate")
WHEN = ("before_feedback", "after_feedback")
SPLIT = ("reflection_accuracy", "under_confidence_rate", "over_confidence_rate", "ece")


def run_row(run: Path, last: int = 20) -> dict:
    """One run's numbers: the final held-out greedy evaluation (`eval_...`) and the sampled training
    episodes' mean over the last `last` steps (`sampled_...`), with the before/after feedback split."""
    data = rows(run)
    evals = [r for r in data if "eval_accuracy" in r]
    train_rows = [r for r in data if "reward" in r][-last:]
    out = {"start_eval_accuracy": evals[0]["eval_accuracy"], "eval_accuracy": evals[-1]["eval_accuracy"]}
    keys = [*FEEDBACK_COLUMNS[1:], *(f"{m}_{w}" for w in WHEN for m in SPLIT)]
    for k in keys:
        out[f"eval_{k}"] = evals[-1].get(f"eval_{k}")
        out[f"start_eval_{k}"] = evals[0].get(f"eval_{k}")
    for k in ["accuracy", *keys]:
        values = [r[k] for r in train_rows if r.get(k) is not None and np.isfinite(r[k])]
        out[f"sampled_{k}"] = float(np.mean(values)) if values else None
    out["steps"] = data[-1].get("step")
    out["s_per_step"] = float(np.mean([r["step_seconds"] for r in data if "step_seconds" in r]))
    return out


def _cell(values: list) -> str:
    known = np.array([v for v in values if v is not None], dtype=float)
    if len(known) == 0:
        return "n/a"
    mid, lo, hi = interval([known[:, None]], iqm)
    return f"{mid:.3f} [{lo:.3f}, {hi:.3f}]"


def _difference(x: list, y: list) -> tuple[float, float, float, float, float] | None:
    a = np.array([v for v in x if v is not None], dtype=float)[:, None]
    b = np.array([v for v in y if v is not None], dtype=float)[:, None]
    if len(a) < 2 or len(b) < 2:
        return None
    mid, lo, hi = interval([a, b], iqm_difference)
    samples = stratified_bootstrap([a, b], iqm_difference)
    two_sided = min(1.0, 2 * min(float(np.mean(samples <= 0)), float(np.mean(samples >= 0))))
    return mid, lo, hi, probability_of_improvement(a, b), two_sided


def feedback_summary(out: Path, seeds: int, tasks: list[str], entries: list[str]) -> str:
    """OUT/feedback.md and OUT/runs.csv: per task and entry, the held-out greedy and sampled metrics
    (IQM over seeds, 95% bootstrap), each entry minus grpo, and the claims they support."""
    import csv

    table: dict = {}
    flat = []
    for task in tasks:
        for entry in entries:
            for s in range(1, seeds + 1):
                run = out / task / entry / f"seed{s}"
                if not finished(run):
                    continue
                row = {"task": task, "spec": TASKS[task], "entry": entry, "seed": s, **run_row(run)}
                flat.append(row)
                table.setdefault(task, {}).setdefault(entry, []).append(row)
    if flat:
        fields = list(dict.fromkeys(k for r in flat for k in r))
        with open(out / "runs.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(flat)
    lines = []
    for source, label in (("eval", "held-out problems, greedy (final evaluation)"),
                          ("sampled", "sampled training episodes (temperature 1), mean of the last 20 steps")):
        head = ["task", "entry", "runs", *FEEDBACK_COLUMNS]
        lines += [f"### {label}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for task, by_entry in table.items():
            if source == "eval":  # the SFT model every run starts from (greedy: the same for every run)
                start = next(iter(by_entry.values()))[0]
                cells = ["n/a" if start.get(f"start_eval_{k}") is None else f"{start[f'start_eval_{k}']:.3f}"
                         for k in FEEDBACK_COLUMNS]
                lines.append(f"| {task} | start (SFT model, step 0) | 1 | " + " | ".join(cells) + " |")
            for entry, runs in by_entry.items():
                cells = [_cell([r.get(f"{source}_{k}") for r in runs]) for k in FEEDBACK_COLUMNS]
                lines.append(f"| {task} | {entry} | {len(runs)} | " + " | ".join(cells) + " |")
        lines.append("")
        head = ["task", "entry", *(f"{m} {w.replace('_', ' ')}" for w in WHEN for m in SPLIT)]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for task, by_entry in table.items():
            for entry, runs in by_entry.items():
                cells = [_cell([r.get(f"{source}_{m}_{w}") for r in runs]) for w in WHEN for m in SPLIT]
                lines.append(f"| {task} | {entry} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### each entry minus grpo: IQM difference [95% bootstrap CI], P(entry > grpo)", "",
              "| task | entry | " + " | ".join(f"{s} {k}" for s in ("eval", "sampled") for k in FEEDBACK_COLUMNS[:5])
              + " |", "|" + "---|" * 12]
    claims = []
    for task, by_entry in table.items():
        base = by_entry.get("grpo")
        for entry, runs in by_entry.items():
            if entry == "grpo" or base is None:
                continue
            cells = []
            for source in ("eval", "sampled"):
                for k in FEEDBACK_COLUMNS[:5]:
                    d = _difference([r.get(f"{source}_{k}") for r in runs], [r.get(f"{source}_{k}") for r in base])
                    cells.append("n/a" if d is None else f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}] P>{d[3]:.2f}")
                    if d is None:
                        continue
                    lower_better = k in ("under_confidence_rate", "over_confidence_rate", "ece")
                    claims.append((task, source, entry, k, lower_better, d, len(runs), len(base)))
            lines.append(f"| {task} | {entry} | " + " | ".join(cells) + " |")
    adjusted = holm([c[5][4] for c in claims]) if claims else []
    claim_lines = []
    for (task, source, entry, k, lower_better, d, n, n_base), p_holm in zip(claims, adjusted):
        shown = p_holm < 0.05
        better = shown and (d[2] < 0 if lower_better else d[1] > 0)
        worse = shown and (d[1] > 0 if lower_better else d[2] < 0)
        verdict = "beats" if better else "is worse than" if worse else "shows no difference from"
        claim_lines.append(f"- {task}, {source}: {entry} {verdict} grpo on {k} "
                           f"({d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}], Holm p {p_holm:.3f}, {n} vs {n_base} runs)")
    lines += ["", f"### claims (a difference whose two-sided bootstrap p, Holm-corrected over the {len(claims)} "
              "comparisons here, is below 0.05, with its 95% interval on that side; otherwise no difference is "
              "shown, which is not evidence of a tie: no equivalence test)", "", *claim_lines]
    text = "\n".join(lines)
    (out / "feedback.md").write_text(text + "\n")
    (out / "feedback_runs.json").write_text(json.dumps(table, indent=1) + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=None, help=f"GRPO steps (default per task: {STEPS})")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default="bench/results/llm-calibration")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"of {', '.join(TASKS)}")
    ap.add_argument("--no-self", action="store_true", help="skip the self-improvement entries")
    ap.add_argument("--only-self", action="store_true",
                    help="run only the self-improvement entries (seed 1's grpo+verdict model must exist)")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"of {', '.join(ENTRIES)}")
    ap.add_argument("--sft-steps", type=int, default=None, help=f"SFT steps (default per task: {SFT_STEPS})")
    ap.add_argument("--group-size", type=int, default=None, help="GRPO samples per prompt (default 16; rag 8)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per GRPO step (default 8)")
    ap.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (default 25)")
    ap.add_argument("--eval-problems", type=int, default=None, help="held-out problems (default 128)")
    ap.add_argument("--feedback", action="store_true",
                    help="also write feedback.md and runs.csv: before vs after feedback (issue 41)")
    ap.add_argument("--sampled-eval", type=int, default=0, metavar="N",
                    help="also evaluate every main entry's final model on N held-out problems sampled at temperature 1")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks.split(",")

    entries = args.entries.split(",")
    unknown = [e for e in entries if e not in ENTRIES] + [t for t in tasks if t not in TASKS]
    if unknown:
        ap.error(f"unknown entry or task {unknown[0]!r}")
    budget = [f"{k}={v}" for k, v in (("group_size", args.group_size), ("prompts_per_step", args.prompts),
                                      ("eval_every", args.eval_every), ("eval_problems", args.eval_problems))
              if v is not None]

    def run_job(job) -> Path:
        task, entry, argv, model, seed = job
        return train(out, model, task, entry, argv, seed, args.steps or STEPS[task], tuple(budget))

    if not args.summary_only:
        models = prepare(out, tasks, args.sft_steps)
        # seed-major, so that an interrupted bench has every entry on the first seeds
        jobs = [] if args.only_self else [(t, e, ENTRIES[e], models[t], s) for s in range(1, args.seeds + 1)
                                          for t in tasks for e in entries]
        with ThreadPoolExecutor(args.workers) as pool:
            for run in pool.map(run_job, jobs):
                print(f"done: {run}", flush=True)
        if not args.no_self:
            jobs = []
            for t in tasks:
                for entry, (start, argv) in SELF.items():
                    model = models[t] if start == "sft" else out / t / "verdict" / "seed1" / "model"
                    jobs += [(t, entry, argv, model, s) for s in range(1, args.seeds + 1)]
            with ThreadPoolExecutor(args.workers) as pool:
                for run in pool.map(run_job, jobs):
                    print(f"done: {run}", flush=True)
    print(summarise(out, args.seeds, tasks))
    if args.feedback:
        print(feedback_summary(out, args.seeds, tasks, entries))
    if args.feedback and not args.summary_only:
        from reflectrl.report.provenance import bench_provenance

        bench_provenance(out, shlex.join([sys.executable, "-u", *sys.argv]), {
            "holm_correction": False,
            "note": "IQM over seeds, 95% stratified-bootstrap CIs of each entry and of each difference with "
                    "grpo (feedback.md); the alpha and equivalence_margin_share keys are the report code's, "
                    "unused here"})
    for task in tasks if args.sampled_eval else []:
        print(sampled_eval(out, task, args.seeds, args.sampled_eval))


if __name__ == "__main__":
    main()
