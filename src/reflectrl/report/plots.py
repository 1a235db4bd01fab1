"""Matplotlib figures of an experiment: learning curves with CI bands, interval plots of
final scores, and the signals' diagnostics over training. Each returns PNG bytes."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reflectrl.report import stats  # noqa: E402
from reflectrl.report.analysis import STANDARD_METRICS, Experiment, _fill  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _band(curves: np.ndarray, reps: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pointwise IQM across seeds with a 95% bootstrap band; curves is (seeds, GRID)."""
    mid, lo, hi = [], [], []
    rng = np.random.default_rng(0)
    for col in curves.T:
        col = col[np.isfinite(col)]
        if col.size == 0:
            mid.append(np.nan), lo.append(np.nan), hi.append(np.nan)
            continue
        samples = [stats.iqm(rng.choice(col, col.size)) for _ in range(reps)]
        mid.append(stats.iqm(col))
        lo.append(np.percentile(samples, 2.5))
        hi.append(np.percentile(samples, 97.5))
    return np.array(mid), np.array(lo), np.array(hi)


def learning_curves(exp: Experiment, env_id: str) -> bytes:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, label in enumerate(exp.spec.algos):
        runs = exp.select(env_id, label)
        if not runs:
            continue
        curves = np.stack([_fill(r.curve) for r in runs])
        mid, lo, hi = _band(curves)
        color = COLORS[i % len(COLORS)]
        ax.plot(exp.grid, mid, color=color, label=f"{label} ({len(runs)} seeds)")
        ax.fill_between(exp.grid, lo, hi, color=color, alpha=0.2)
    ax.set(title=f"{env_id}: true episodic return (IQM, 95% CI)", xlabel="env steps", ylabel="return")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def final_intervals(table: list[dict], env_id: str) -> bytes:
    rows = [r for r in table if r["env"] == env_id and r.get("seeds")]
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.45 * max(1, len(rows))))
    for i, row in enumerate(rows):
        lo, hi = row["final_ci"]
        color = COLORS[i % len(COLORS)]
        ax.plot([lo, hi], [i, i], color=color, lw=8, alpha=0.5, solid_capstyle="butt")
        ax.plot([row["final_iqm"]], [i], "|", color="k", ms=14)
    ax.set_yticks(range(len(rows)), [r["algo"] for r in rows])
    ax.invert_yaxis()
    ax.set(title=f"{env_id}: final return, IQM and 95% CI", xlabel="return")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def diagnostic_keys(exp: Experiment) -> list[str]:
    keys = []
    for run in exp.runs:
        for row in run.rows[:1] + run.rows[-1:]:
            for key, value in row.items():
                if key not in STANDARD_METRICS and isinstance(value, (int, float)) and key not in keys:
                    keys.append(key)
    return keys


def diagnostics(exp: Experiment, env_id: str, keys: list[str]) -> bytes:
    """One panel per signal metric (and the policy entropy), mean over seeds per algo entry."""
    keys = keys + ["entropy"]
    cols = min(3, len(keys))
    nrows = -(-len(keys) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for i, label in enumerate(exp.spec.algos):
            series = []
            for run in exp.select(env_id, label):
                pts = [(row["global_step"], row[key]) for row in run.rows if isinstance(row.get(key), (int, float))]
                if pts:
                    series.append(np.interp(exp.grid, *zip(*pts)))
            if series:
                ax.plot(exp.grid, np.mean(series, axis=0), color=COLORS[i % len(COLORS)], label=label)
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    # one legend for the figure: panels only show the entries that log their metric
    handles = [plt.Line2D([], [], color=COLORS[i % len(COLORS)], label=label) for i, label in enumerate(exp.spec.algos)]
    fig.legend(handles=handles, loc="upper center", ncol=min(6, len(handles)), fontsize=8, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"{env_id}: diagnostics over training (mean over seeds)", fontsize=10, y=1.0 - 0.35 / fig.get_figheight())
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / fig.get_figheight()))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
