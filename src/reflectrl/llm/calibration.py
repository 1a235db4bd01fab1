"""How well an agent's stated reflections match what happened: the calibration metrics of
`reflectrl llm eval --json`, of the training logs and of the report.

Inputs, per episode: whether the answer was correct (the verifier's score is 1) and the
final `Reflection` (tasks/reflect.py) the agent stated, or None where the task asks for
none. Definitions (docs/llm.md repeats them):

    verdict        the stated verdict; where only a confidence is stated, confidence >= 0.5
                   reads as "solved"; none stated (missing or malformed): missing
    confidence     the stated confidence; where only a verdict is stated, 1 ("solved") or
                   0 ("not solved"); none stated: 0.5 (uninformative)

    reflection_format_rate   share of episodes whose reflection states what the mode asks for
    reflection_missing_rate  share with no usable verdict or confidence
    reflection_accuracy      share whose verdict equals the outcome (missing counts as wrong)
    under_confidence_rate    among correct answers, the share judged "not solved"
    over_confidence_rate     among wrong answers, the share judged "solved"
                             (so reflection_accuracy = 1 - (under + over + missing) / N in counts)
    solved_rate              share of episodes judged "solved"
    solved_precision         accuracy among the episodes judged "solved" (selective
                             prediction by the verdict: answer only where it says solved)
    mean_confidence
    ece                      expected calibration error over 10 equal-width confidence bins
                             [0, .1), ..., [.9, 1]: sum_b (n_b / N) |accuracy_b - mean confidence_b|
    brier                    mean (confidence - correct)^2
    auroc                    P(confidence of a correct answer > that of a wrong one), ties 1/2
                             (the Mann-Whitney statistic); null when all answers are right or all wrong
    selective_curve          [(coverage, accuracy)]: answering only where the confidence is at
                             least each stated level, from the highest down (ties enter together)
    selective_auc            the area under that curve, sum of coverage steps x accuracy (with
                             distinct confidences: the mean over k of the accuracy of the k most
                             confident answers); 1 is perfect, the accuracy itself is chance

Before and after feedback: each reflection records whether the agent had seen an environment
reply in the episode when it stated it (`Reflection.after_feedback`: the code task's visible-test
output with `reflect_after=feedback`, a tool's output; tasks/reflect.py). The keys

    reflection_accuracy_before_feedback   under_confidence_rate_before_feedback
    over_confidence_rate_before_feedback  ece_before_feedback
    (and the same four ending in _after_feedback)

are those metrics over the episodes whose final reflection was stated before (after) any
feedback, None where there is none such: a run on arith fills the _before_ ones, one on code
with reflect_after=feedback the _after_ ones, one on tools both where some episodes answer
without a tool call. The names without a suffix stay the metrics of every episode, wherever
its reflection sits.

Every key is present; a key is None where its population is empty, and all reflection keys
are None where no episode was asked for a reflection. A task that knows whether each search
found what was needed (`rag`) also gets `relevance_accuracy` (the share of "relevant" / "not
relevant" judgements that are true) and `relevant_search_rate` (`relevance_metrics`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from reflectrl.llm.tasks.reflect import Reflection

BINS = 10
KEYS = ("accuracy", "reflection_format_rate", "reflection_missing_rate", "reflection_accuracy",
        "under_confidence_rate", "over_confidence_rate", "solved_rate", "solved_precision", "mean_confidence",
        "ece", "brier", "auroc", "selective_auc", "selective_curve")
FEEDBACK_METRICS = ("reflection_accuracy", "under_confidence_rate", "over_confidence_rate", "ece")
WHEN = ("before_feedback", "after_feedback")
FEEDBACK_KEYS = tuple(f"{m}_{w}" for w in WHEN for m in FEEDBACK_METRICS)
KEYS = KEYS + FEEDBACK_KEYS


def effective(reflection: Reflection | None) -> tuple[bool | None, float]:
    """(verdict or None where missing, confidence with 0.5 where none) of one reflection."""
    if reflection is None:
        return None, 0.5
    confidence = reflection.stated_confidence
    return reflection.stated_verdict, 0.5 if confidence is None else confidence


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS) -> float:
    index = np.minimum((confidence * bins).astype(int), bins - 1)  # 1.0 falls in the last bin
    total = 0.0
    for b in range(bins):
        inside = index == b
        if inside.any():
            total += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(total)


def auroc(confidence: np.ndarray, correct: np.ndarray) -> float | None:
    pos, neg = confidence[correct], confidence[~correct]
    if len(pos) == 0 or len(neg) == 0:
        return None
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def selective(confidence: np.ndarray, correct: np.ndarray) -> tuple[list[tuple[float, float]], float]:
    """The accuracy-coverage curve at each distinct confidence level (highest first) and its area."""
    n = len(confidence)
    curve, area, covered = [], 0.0, 0
    for level in np.unique(confidence)[::-1]:
        inside = confidence >= level
        coverage = int(inside.sum())
        accuracy = float(correct[inside].mean())
        area += (coverage - covered) / n * accuracy
        covered = coverage
        curve.append((coverage / n, accuracy))
    return curve, float(area)


def _rate(mask: np.ndarray, among: np.ndarray) -> float | None:
    return float(mask[among].mean()) if among.any() else None


# the metrics read off the stated confidences: null where no episode stated one
CONFIDENCE_KEYS = ("mean_confidence", "ece", "brier", "auroc", "selective_curve", "selective_auc")


def calibration_metrics(correct: Sequence[bool], reflections: Sequence[Reflection | None]) -> dict:
    """Every key of KEYS for N episodes (see the module's doc)."""
    correct = np.asarray(correct, dtype=bool)
    out = dict.fromkeys(KEYS)
    if len(correct) == 0:
        return out
    out["accuracy"] = float(correct.mean())
    if all(r is None for r in reflections):
        return out
    for when, after in zip(WHEN, (False, True)):  # the episodes whose reflection came before / after feedback
        inside = [i for i, r in enumerate(reflections) if r is not None and r.after_feedback == after]
        if inside:
            part = _metrics([correct[i] for i in inside], [reflections[i] for i in inside])
            out.update({f"{m}_{when}": part[m] for m in FEEDBACK_METRICS})
    out.update(_metrics(correct, reflections))
    return out


def _metrics(correct: Sequence[bool], reflections: Sequence[Reflection | None]) -> dict:
    """The keys of KEYS without the _before/_after_feedback ones, for episodes with reflections."""
    correct = np.asarray(correct, dtype=bool)
    out = {}
    pairs = [effective(r) for r in reflections]
    verdict = np.array([v is True for v, _ in pairs])
    not_solved = np.array([v is False for v, _ in pairs])
    missing = np.array([v is None for v, _ in pairs])
    confidence = np.array([c for _, c in pairs], dtype=float)
    out.update(
        reflection_format_rate=float(np.mean([r is not None and r.well_formed for r in reflections])),
        reflection_missing_rate=float(missing.mean()),
        reflection_accuracy=float(((verdict & correct) | (not_solved & ~correct)).mean()),
        under_confidence_rate=_rate(not_solved, correct),
        over_confidence_rate=_rate(verdict, ~correct),
        solved_rate=float(verdict.mean()),
        solved_precision=_rate(correct, verdict),
        mean_confidence=float(confidence.mean()),
        ece=ece(confidence, correct),
        brier=float(np.mean((confidence - correct) ** 2)),
        auroc=auroc(confidence, correct),
    )
    out["selective_curve"], out["selective_auc"] = selective(confidence, correct)
    if not any(r is not None and r.stated_confidence is not None for r in reflections):
        # nothing was stated: the 0.5 that stands in for a missing confidence is no measurement
        out.update(dict.fromkeys(CONFIDENCE_KEYS))
    return out


def relevance_metrics(task, problems, episodes: list[list[str]], reflections: list[list[list]]) -> dict:
    """How a task's intermediate judgements ("relevant" / "not relevant" after a search, on the
    next turn) match the truth the task knows (`task.search_relevance`), over every judgement of
    every episode; a missing judgement counts as wrong. {} for a task without such a truth."""
    truth_of = getattr(task, "search_relevance", None)
    if truth_of is None or task.reflect == "none":
        return {}
    right = stated = relevant = 0
    for problem, turns, refl in zip(problems, episodes, reflections):
        truth = truth_of(problem, turns)
        for k in range(1, len(turns)):
            judged = [r for r in refl[k] if not r.final]
            if truth[k - 1] is None or not judged:
                continue
            stated += 1
            relevant += truth[k - 1]
            right += judged[0].verdict is not None and judged[0].verdict == truth[k - 1]
    if not stated:
        return {}
    return {"relevance_accuracy": right / stated, "relevant_search_rate": relevant / stated}


def scalar_metrics(metrics: dict, prefix: str = "") -> dict:
    """The numeric keys (no curve) with a prefix, None kept out: what a metrics row logs."""
    return {prefix + k: v for k, v in metrics.items()
            if k != "selective_curve" and v is not None and not (isinstance(v, float) and math.isnan(v))}


def plot_reliability(correct: Sequence[bool], reflections: Sequence[Reflection | None], path: str | Path,
                     title: str = "") -> Path:
    """A reliability diagram (accuracy and count per confidence bin, the diagonal) as a PNG, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reflectrl.runs.rundir import atomic_write_bytes

    correct = np.asarray(correct, dtype=bool)
    confidence = np.array([effective(r)[1] for r in reflections], dtype=float)
    index = np.minimum((confidence * BINS).astype(int), BINS - 1)
    centres = (np.arange(BINS) + 0.5) / BINS
    accuracy = np.array([correct[index == b].mean() if (index == b).any() else np.nan for b in range(BINS)])
    counts = np.array([(index == b).sum() for b in range(BINS)])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(4.5, 5.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.bar(centres, np.nan_to_num(accuracy), width=1 / BINS, edgecolor="black", alpha=0.7, label="accuracy")
    top.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
    top.set_ylabel("accuracy in bin")
    top.set_ylim(0, 1)
    top.legend(loc="upper left", fontsize=8)
    m = calibration_metrics(correct, reflections)
    shown = {k: "n/a" if m[k] is None else f"{m[k]:.3f}" for k in ("ece", "brier")}  # None: no stated confidence
    top.set_title(f"{title}\nECE {shown['ece']}  Brier {shown['brier']}  n={len(correct)}".strip(), fontsize=9)
    bottom.bar(centres, counts, width=1 / BINS, edgecolor="black", color="grey")
    bottom.set_xlabel("stated confidence")
    bottom.set_ylabel("answers")
    bottom.set_xlim(0, 1)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    from PIL import Image  # a paletted PNG (as the report's pictures): about a third of the RGBA one

    image = Image.open(buffer).convert("RGB").quantize(256, method=Image.Quantize.MAXCOVERAGE,
                                                       dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    path = Path(path)
    atomic_write_bytes(path, buffer.getvalue())
    return path
