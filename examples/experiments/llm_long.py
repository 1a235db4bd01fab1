"""Per-token credit on long completions: grpo vs grpo[loss_type=dr_grpo] vs grpo+gear (seed 003's
value head) vs grpo+divergence (the GEAR paper's teacher segments), and GEAR's seed items
(gear.rank_groups, gear.history), on the tiny model and two long-horizon tasks.

    python examples/experiments/llm_long.py [--seeds 3] [--steps 150] [--workers 2] [--out bench/results/llm-long]
    python examples/experiments/llm_long.py --tasks arith9,chain8 --entries grpo,gear,divergence-seg --seeds 10 \
        --steps 30 --set eval_every=15 --workers 1 --out bench/results/llm-segments      # issue 41

Issue 41 added arith9 (a short task), `divergence-seg` (several segments per completion, entropy
boundaries, continuous weights) and `divergence-one` (issue 19's single departure), per-task
`--steps` / `--sft-steps` (TASK=N,...), `--set` knobs for every run, and OUT/runs.csv and
OUT/provenance.json.

Builds (once, in OUT) a tiny Llama-style model whose tokenizer also learns the long tasks' text,
warm-starts it per task with `reflectrl llm sft --reference-share 0.5` (half the demonstrations
read the task's reference after the prompt, in context only, so that the model can use a
reference when it is shown one: what the divergence signal's teacher needs; every entry starts
from this same model), then runs `reflectrl llm train` for every (task, entry, seed); a
finished run is skipped, an interrupted one resumes.

Writes OUT/summary.md: the final held-out greedy accuracy and its mean over evaluations (IQM
over seeds, 95% bootstrap CI), the difference to grpo (with P(improvement) and, where the
interval straddles 0, a TOST equivalence p-value at a margin of 0.05), completion length,
seconds per step, the signal's and the teacher pass's share of it, and the divergence
signal's segment statistics, and a check of the teacher (the warm-started model's greedy accuracy
with the reference in its prompt and without); OUT/per_run.json with every run's values;
OUT/<task>.png curves.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from reflectrl.report.provenance import bench_provenance
from reflectrl.report.stats import (
    interval,
    iqm,
    iqm_difference,
    probability_of_improvement,
    stratified_bootstrap,
    tost_p_value,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_learning import CLI, finished, sh  # noqa: E402  (the same subprocess and run-status helpers)

TASKS = {"tools8": "tools[calls=8;ops=+-]",  # 4 keys: 4 lookups, 3 calcs, the answer (~36 tokens)
         "chain8": "rg:chain_sum[min_terms=7;max_terms=8;min_digits=1;max_digits=1;worked=true]",
         "arith9": "arith[max_operand=9]"}  # a short task (~3 tokens): docs/llm.md's first benchmark
# SFT to an intermediate start (greedy/sampled held-out accuracy: tools8 0.29/0.19 after 700 steps, while 750
# steps give 0.91/0.73: a sharp transition; chain8 0.63/0.16 after 600)
SFT_STEPS = {"tools8": 700, "chain8": 600, "arith9": 100}  # arith9: examples/experiments/llm_learning.py's
STEPS = {"tools8": 200, "chain8": 200, "arith9": 200}  # GRPO steps (--steps overrides)
# the learning rate, tuned for grpo (the baseline) over {1e-4, 3e-5} in 40-50-step runs and used by every entry:
# on chain8 grpo at 1e-4 (and the earlier 3e-4) collapses greedy accuracy from 0.63 to 0.14 in 50 steps
# arith9: examples/experiments/llm_learning.py's 3e-4 (not retuned here)
TASK_SETS = {"tools8": ["learning_rate=1e-4"], "chain8": ["learning_rate=3e-5"], "arith9": ["learning_rate=3e-4"]}
ENTRIES = {"grpo": ["--algo", "grpo"],
           "grpo-dr": ["--algo", "grpo", "--set", "loss_type=dr_grpo"],
           "gear": ["--algo", "grpo+gear"],
           "divergence": ["--algo", "grpo+divergence"],
           "gear-rank": ["--algo", "grpo+gear", "--set", "gear.rank_groups=true"],
           "gear-history": ["--algo", "grpo+gear", "--set", "gear.history=4"],
           # the default departure comes within the first few tokens (see docs/llm.md): a later, larger spike
           "divergence-late": ["--algo", "grpo+divergence", "--set", "divergence.min_history=8",
                               "divergence.floor=0.5"],
           # issue 41: several segments per completion, each from a spike to the next spike or entropy spike,
           # each weighted by its own mean divergence, soft-clipped into [w_min, w_max]
           "divergence-seg": ["--algo", "grpo+divergence", "--set", "divergence.max_segments=4",
                              "divergence.boundary=both", "divergence.weights=smooth"],
           # issue 19's divergence (one departure, a segment to the end, hard-clipped weight at the spike)
           "divergence-one": ["--algo", "grpo+divergence", "--set", "divergence.max_segments=1",
                              "divergence.boundary=spike", "divergence.weights=step"]}
COMMON = ["group_size=8", "prompts_per_step=8", "eval_every=25", "eval_problems=128",
          "log_kl=false", "torch_threads=1", "device=cpu"]
SEGMENT_KEYS = ("segments_per_completion", "segment_length_mean", "departure_token_share", "divergence_mean",
                "divergence_at_departure", "weights_std", "weights_p10", "weights_p90", "segment_weight_std")
# the entries each task runs by default: GEAR's seed items only on the cheaper task
TASK_ENTRIES = {"tools8": ["grpo", "grpo-dr", "gear", "divergence", "divergence-late"], "chain8": list(ENTRIES),
                "arith9": ["grpo", "gear", "divergence-seg"]}
MARGIN = 0.05  # accuracy: what "no difference" means in the TOST


def sft_path(out: Path, name: str, steps: int) -> Path:
    """The warm start: OUT/sft-TASK, or OUT/sft-TASK-STEPS for a number of SFT steps other than SFT_STEPS'."""
    return out / (f"sft-{name}" if steps == SFT_STEPS[name] else f"sft-{name}-{steps}")


def prepare(out: Path, tasks: list[str], sft_steps: dict) -> dict[str, Path]:
    tiny = out / "tiny"
    if not (tiny / "config.json").exists():
        extra = [a for t in tasks for a in ("--task", TASKS[t])]
        sh([*CLI, "llm", "init-tiny", "--out", str(tiny), *extra])
    models = {}
    for name in tasks:
        sft_dir = sft_path(out, name, sft_steps[name])
        if not (sft_dir / "config.json").exists():
            sh([*CLI, "llm", "sft", "--model", str(tiny), "--task", TASKS[name], "--steps", str(sft_steps[name]),
                "--lr", "3e-3", "--reference-share", "0.5", "--out", str(sft_dir), "--no-progress"])
        models[name] = sft_dir
    return models


def train(out: Path, models: dict[str, Path], task: str, entry: str, seed: int, steps: int,
          extra: list[str] = ()) -> Path:
    run = out / task / entry / f"seed{seed}"
    if finished(run):
        return run
    if run.exists():  # an interrupted run continues where its checkpoint is
        sh([*CLI, "llm", "train", "--resume", str(run), "--no-progress"], run.with_suffix(".log"))
        return run
    run.parent.mkdir(parents=True, exist_ok=True)
    argv = list(ENTRIES[entry])
    sets = argv[argv.index("--set") + 1:] if "--set" in argv else []
    argv = argv[:argv.index("--set")] if "--set" in argv else argv
    sh([*CLI, "llm", "train", *argv, "--task", TASKS[task], "--model", str(models[task]), "--steps", str(steps),
        "--seed", str(seed), "--out", str(run), "--no-progress", "--set", *COMMON, *TASK_SETS[task], *extra, *sets],
       run.with_suffix(".log"))
    return run


def load(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    train_rows = [r for r in rows if "reward" in r]
    steps, acc = map(list, zip(*evals))
    out = {"run": str(run), "eval_steps": steps, "eval_accuracy": acc, "final": acc[-1], "auc": float(np.mean(acc)),
           "completion_length": float(np.mean([r["completion_length"] for r in train_rows])),
           "last_completion_length": float(np.mean([r["completion_length"] for r in train_rows[-25:]])),
           "train_accuracy_last25": float(np.mean([r["accuracy"] for r in train_rows[-25:]])),
           "step_seconds": float(np.mean([r["step_seconds"] for r in train_rows]))}
    for key in ("signal_time_fraction", "teacher_time_fraction", *SEGMENT_KEYS, "value_head_heldout_loss"):
        values = [r[key] for r in train_rows if key in r]
        if values:
            out[key] = float(np.mean(values))
    return out


def teacher_check(out: Path, tasks: list[str], sft_steps: dict, problems: int = 128) -> dict:
    """Does the warm-started model use the reference? Its held-out greedy accuracy (the runs' eval
    problems) with the prompt alone and with the teacher's hint (the divergence signal's input:
    the reference between the prompt and the completion). Cached in OUT/teacher_check.json."""
    import dataclasses
    import random

    from reflectrl.llm.model import load_model
    from reflectrl.llm.tasks import make_task
    from reflectrl.llm.tasks.base import reference_hint
    from reflectrl.trainers.grpo.trainer import EVAL_SEED, rollout

    path = out / "teacher_check.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for name in tasks:
        sft_dir = sft_path(out, name, sft_steps[name])
        if name in done or not (sft_dir / "config.json").exists():
            continue
        task = make_task(TASKS[name])
        model, tokenizer = load_model(str(sft_dir))
        rng = random.Random(EVAL_SEED)
        plain = [task.sample(rng) for _ in range(problems)]
        hinted = [dataclasses.replace(p, prompt=p.prompt + reference_hint(task, p)) for p in plain]
        row = {}
        for key, batch in (("plain", plain), ("with_reference", hinted)):
            episodes = rollout(model.eval(), tokenizer, task, batch, max_new_tokens=task.max_new_tokens, greedy=True)
            row[key] = float(np.mean([r >= 1.0 for r in task.score_batch(plain, episodes.turns)]))
        done[name] = row
        path.write_text(json.dumps(done, indent=1) + "\n")
    return done


def summarise(out: Path, seeds: int, tasks: list[str], entries: list[str], sft_steps: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_run, unfinished = {}, []
    lines = ["| task | entry | seeds | final greedy acc, IQM [95% CI] | vs grpo | mean over evals [CI] | vs grpo | "
             "sampled acc, last 25 steps | completion tokens | s/step | vs grpo | signal share | teacher share |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    seg_lines = ["| task | entry | segments/completion | segment length | departure token share | "
                 "mean divergence | divergence at segment starts | weights std | weights p10 / p90 | "
                 "segment weights std | held-out head MSE |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task in tasks:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        base = None
        for entry in entries:
            runs = [out / task / entry / f"seed{s}" for s in range(1, seeds + 1)]
            unfinished += [str(r) for r in runs if r.exists() and not finished(r)]
            rows = [load(r) for r in runs if finished(r)]
            if not rows:
                continue
            per_run[f"{task}/{entry}"] = rows
            final = np.array([[r["final"]] for r in rows])
            auc = np.array([[r["auc"]] for r in rows])
            sampled = np.array([[r["train_accuracy_last25"]] for r in rows])
            step_s = float(np.mean([r["step_seconds"] for r in rows]))
            if entry == "grpo":
                base = (final, auc, sampled, step_s)
            cells = []
            for i, m in enumerate((final, auc, sampled)):
                mid, lo, hi = interval([m], iqm)
                cells.append(f"{mid:.3f} [{lo:.3f}, {hi:.3f}]")
                if base is None or entry == "grpo":
                    cells.append("")
                    continue
                d, dlo, dhi = interval([m, base[i]], iqm_difference)
                text = f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] P>{probability_of_improvement(m, base[i]):.2f}"
                if dlo <= 0 <= dhi:
                    p = tost_p_value(stratified_bootstrap([m, base[i]], iqm_difference), MARGIN)
                    text += f", TOST p={p:.2f}"
                cells.append(text)
            share = lambda k: f"{np.mean([r[k] for r in rows if k in r]):.1%}" if any(k in r for r in rows) else ""
            rel = f"{step_s / base[3] - 1:+.0%}" if base is not None and entry != "grpo" else ""
            lines.append(f"| {task} | {entry} | {len(rows)} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | "
                         f"{cells[4]} {cells[5]} | "
                         f"{np.mean([r['completion_length'] for r in rows]):.1f} | {step_s:.2f} | {rel} | "
                         f"{share('signal_time_fraction')} | {share('teacher_time_fraction')} |")
            if any(k in rows[0] for k in SEGMENT_KEYS + ("value_head_heldout_loss",)):
                val = lambda k: f"{np.mean([r[k] for r in rows]):.3f}" if all(k in r for r in rows) else ""
                seg_lines.append(f"| {task} | {entry} | {val('segments_per_completion')} | "
                                 f"{val('segment_length_mean')} | {val('departure_token_share')} | "
                                 f"{val('divergence_mean')} | {val('divergence_at_departure')} | "
                                 f"{val('weights_std')} | "
                                 f"{val('weights_p10')} / {val('weights_p90')} | {val('segment_weight_std')} | "
                                 f"{val('value_head_heldout_loss')} |")
            acc = np.array([r["eval_accuracy"] for r in rows])
            ax.plot(rows[0]["eval_steps"], acc.mean(0), label=f"{entry} ({len(rows)} seeds)")
            ax.fill_between(rows[0]["eval_steps"], acc.min(0), acc.max(0), alpha=0.15)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title(f"{task}: {TASKS[task]}"[:80], fontsize=8)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{task}.png", dpi=110)
        plt.close(fig)
    text = "\n".join(lines) + "\n\n" + "\n".join(seg_lines) + "\n"
    check = teacher_check(out, tasks, sft_steps)
    if check:
        text += ("\nThe warm-started model's held-out greedy accuracy without and with the teacher's reference "
                 "in its prompt:\n\n| task | prompt alone | with the reference |\n|---|---|---|\n")
        text += "".join(f"| {t} | {r['plain']:.3f} | {r['with_reference']:.3f} |\n" for t, r in check.items())
    if unfinished:
        text += "\nUnfinished runs (excluded): " + ", ".join(unfinished) + "\n"
    (out / "summary.md").write_text(text)
    (out / "per_run.json").write_text(json.dumps({**per_run, "teacher_check": check}, indent=1) + "\n")
    flat = ["task,entry,seed,final,auc,train_accuracy_last25,completion_length,step_seconds,run"]
    flat += [f"{key.split('/')[0]},{key.split('/')[1]},{Path(r['run']).name[4:]},{r['final']},{r['auc']},"
             f"{r['train_accuracy_last25']},{r['completion_length']},{r['step_seconds']},{r['run']}"
             for key, rows in per_run.items() for r in rows]
    (out / "runs.csv").write_text("\n".join(flat) + "\n")
    return text


def per_task(value: str | None, default: dict, tasks: list[str]) -> dict:
    """{task: N} from "N" (every task), "TASK=N,..." (those tasks; the others their default) or None."""
    given = dict(default)
    if value and "=" in value:
        given.update({k: int(v) for k, v in (kv.split("=") for kv in value.split(","))})
    elif value:
        given.update({t: int(value) for t in tasks})
    return {t: given[t] for t in tasks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", default=None, help="GRPO steps: N for every task, or TASK=N,... (default: STEPS)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench/results/llm-long")
    ap.add_argument("--entries", default=None, help=f"of {', '.join(ENTRIES)} (default: per task)")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"of {', '.join(TASKS)}")
    ap.add_argument("--sft-steps", default=None,
                    help="SFT steps: N for every task, or TASK=N,... (default: per task, SFT_STEPS)")
    ap.add_argument("--set", nargs="*", default=[], dest="extra",
                    help="KEY=VALUE knobs for every run, after COMMON and the task's (e.g. eval_every=15)")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--prepare-only", action="store_true", help="build the tiny model and the SFT starts, then stop")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks.split(",")
    entries = {t: args.entries.split(",") if args.entries else TASK_ENTRIES[t] for t in tasks}
    sft_steps, steps = per_task(args.sft_steps, SFT_STEPS, tasks), per_task(args.steps, STEPS, tasks)
    if not args.summary_only:
        models = prepare(out, tasks, sft_steps)
        if args.prepare_only:
            return
        jobs = [(t, e, s) for s in range(1, args.seeds + 1) for t in tasks for e in entries[t]]
        with ThreadPoolExecutor(args.workers) as pool:
            for run in pool.map(lambda j: train(out, models, *j, steps[j[0]], args.extra), jobs):
                print(f"done: {run}", flush=True)
    print(summarise(out, args.seeds, tasks, list(ENTRIES), sft_steps))
    command = ["python", "examples/experiments/llm_long.py", "--tasks", args.tasks, "--seeds", str(args.seeds),
               "--out", args.out]
    for flag, value in (("--entries", args.entries), ("--steps", args.steps), ("--sft-steps", args.sft_steps)):
        command += [flag, value] if value else []
    command += ["--set", *args.extra] if args.extra else []
    bench_provenance(out, shlex.join(command + ["--workers", str(args.workers)]),
                     {"holm_correction": False, "tost_margin": MARGIN,
                      "note": "IQM over seeds, 95% stratified-bootstrap CIs, TOST at tost_margin; the alpha and "
                              "equivalence_margin_share keys are the report code's, unused here"},
                     "the runs' own 'reflectrl llm train' commands are in each run's run.json")


if __name__ == "__main__":
    main()
