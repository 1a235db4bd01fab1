"""A sweep's report, DIR/report/: trials.csv (one row per trial), a sensitivity plot per knob
(final return and AUC of each completed trial against the knob's value, the best marked) and
the optimisation history (each trial's objective and the best so far).

Pruned and failed trials have no final scores: they are rows of trials.csv, not points."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from reflectrl.report.plots import png_bytes  # noqa: E402
from reflectrl.runs import atomic_write_bytes  # noqa: E402

DPI = 100


def _png(fig) -> bytes:
    return png_bytes(fig, DPI)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def trials_csv(knobs, rows: list[dict]) -> bytes:
    """number, state, each knob, objective, final, auc (empty where a trial has none)."""
    fields = ["number", "state", *(k.key for k in knobs), "objective", "final", "auc"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None or (isinstance(row[k], float) and math.isnan(row[k])) else row[k]
                         for k in fields})
    return buf.getvalue().encode()


def _completed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["state"] == "complete"]


def sensitivity_figure(knob, rows: list[dict], best: dict | None):
    """Final return and AUC of each completed trial against one knob (log axis for a loguniform
    knob, the choices in order for a categorical one); the best trial drawn as a star."""
    done = _completed(rows)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), squeeze=False)
    for ax, score, label in zip(axes[0], ("final", "auc"), ("final return (IQM over seeds)", "AUC (IQM over seeds)")):
        if knob.dist == "choice":
            position = {c: i for i, c in enumerate(knob.choices)}
            xs = [position[str(r[knob.key])] for r in done]
            ax.set_xticks(range(len(knob.choices)), knob.choices)
        else:
            xs = [r[knob.key] for r in done]
        ax.scatter(xs, [r[score] for r in done], s=24, alpha=0.75, label="trial")
        star = [(x, r[score]) for r, x in zip(done, xs) if best is not None and r["number"] == best["trial"]]
        if star:
            ax.scatter(*zip(*star), marker="*", s=160, color="tab:red", label="best", zorder=3)
        ax.legend(fontsize=8)
        if knob.dist != "choice":
            _knob_axis(ax, knob)
        ax.set_xlabel(knob.key)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"sensitivity to {knob.key} ({len(done)} completed trials)", fontsize=10)
    fig.tight_layout()
    return fig


def _knob_axis(ax, knob) -> None:
    """The x axis spans the knob's whole range (a log axis for loguniform), so the plot shows
    where in the space the trials went."""
    if knob.dist == "loguniform":
        ax.set_xscale("log")
        pad = (knob.high / knob.low) ** 0.03
        ax.set_xlim(knob.low / pad, knob.high * pad)
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        pad = 0.03 * (knob.high - knob.low)
        ax.set_xlim(knob.low - pad, knob.high + pad)


def history_figure(rows: list[dict], objective: str):
    """Each completed trial's objective by trial number, and the best so far."""
    done = _completed(rows)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = [r["number"] for r in done]
    ys = [r["objective"] for r in done]
    best, running = [], -math.inf
    for y in ys:
        running = max(running, y)
        best.append(running)
    ax.scatter(xs, ys, s=24, alpha=0.75, label="trial")
    ax.step(xs, best, where="post", color="tab:red", label="best so far")
    ax.set_xlabel("trial number")
    ax.set_ylabel(f"objective: {objective} (IQM over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_sweep_report(root: Path, knobs, rows: list[dict], best: dict | None, objective: str) -> list[Path]:
    """Write DIR/report/trials.csv, sensitivity_<knob>.png per knob and history.png; returns the paths."""
    out = Path(root) / "report"
    out.mkdir(exist_ok=True)
    files = {"trials.csv": trials_csv(knobs, rows), "history.png": _png(history_figure(rows, objective))}
    for knob in knobs:
        files[f"sensitivity_{_slug(knob.key)}.png"] = _png(sensitivity_figure(knob, rows, best))
    for name, data in files.items():
        atomic_write_bytes(out / name, data)
    return [out / name for name in files]
