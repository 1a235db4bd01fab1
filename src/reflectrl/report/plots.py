"""Matplotlib figures of an experiment: learning curves with CI bands, interval plots of
final scores, and the signals' diagnostics over training. Each `X_figure` function returns
the matplotlib Figure (what the tests measure); `X` returns its PNG bytes."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reflectrl.outputs import MAX_PIXELS, MIN_DPI, PALETTE_COLORS, png_bytes  # noqa: E402, F401 (outputs.py's)
from reflectrl.report import stats  # noqa: E402
from reflectrl.report.analysis import (  # noqa: E402
    EXPLORATION_SERIES,
    STANDARD_METRICS,
    Experiment,
    _fill,
    identical_entries,
)

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
DPI = 100
TICK_SIZE = 9  # points: readable at the PNG's 100 dpi
ROW_INCHES = 0.5  # per entry of the final-return interval plot


def _png(fig) -> bytes:
    """The figure's PNG bytes (png_bytes at DPI); closes it."""
    return png_bytes(fig, DPI)


TITLE_WIDTH = 0.96  # share of the figure's width a title line may take


def suptitle(fig, text: str, fontsize) -> None:
    """The figure's title, centred on the figure and wrapped at spaces to fit its width: a long
    env id (navix:Navix-DoorKey-5x5-v0) with the title's note ran off both ends of a one-panel
    figure. The lines are measured as drawn, so the layout (tight or constrained) makes room
    for each."""
    title = fig.suptitle(text, fontsize=fontsize)
    renderer = fig.canvas.get_renderer()
    limit = TITLE_WIDTH * fig.bbox.width

    def fits(line: str) -> bool:
        title.set_text(line)
        return title.get_window_extent(renderer).width <= limit

    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            if line and not fits(f"{line} {word}"):
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    title.set_text("\n".join(lines))


# Resamples of a plotted band: the tables' bootstrap, with fewer resamples (a band is read by
# eye, and a report draws one per entry and series at each of GRID points).
BAND_REPS = 5_000


def _band(curves: np.ndarray, reps: int = BAND_REPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pointwise IQM across seeds with a 95% band from the tables' bootstrap (whole runs
    resampled); curves is (seeds, GRID). At each point the runs with a value there count
    (points with the same such runs are bootstrapped together)."""
    curves = np.asarray(curves, dtype=float)
    mid, lo, hi = (np.full(curves.shape[1], np.nan) for _ in range(3))
    finite = np.isfinite(curves)
    for mask in {tuple(col) for col in finite.T}:
        rows = np.array(mask, dtype=bool)
        if not rows.any():
            continue
        cols = (finite == rows[:, None]).all(axis=0)
        mid[cols], lo[cols], hi[cols] = stats.pointwise_interval(curves[np.ix_(rows, cols)], reps)
    return mid, lo, hi


def learning_curves(exp: Experiment, env_id: str) -> bytes:
    return _png(learning_curves_figure(exp, env_id))


DASH = 4  # points (times the line width) of a dash of an entry identical to another


def identical_dashes(label: str, same: dict[str, str], labels: list[str]) -> tuple:
    """The dash pattern of an entry identical to another (`same`) in a panel of `labels`: the
    copies of one curve take turns, one dash each in a period of a dash per copy and one for
    the original, so that every colour shows."""
    copies = [other for other in labels if same.get(other) == same[label]]
    j, k = copies.index(label) + 1, len(copies)
    return (DASH * j, (DASH, DASH * k))


# The exploration bonuses users trust, on which the seed signals are stacked (ppo+count+gear): an
# experiment that stacks them gets one learning-curve panel per stack
EXPLORATION_BONUSES = ("count", "rnd")
MAX_BANDS = 4  # a panel with more entries draws the CI band of its reference entries only


def curve_panels(exp: Experiment) -> list[tuple[str, list[str], list[str]]]:
    """(title, entries, reference entries) of the learning-curve panels. One panel unless some
    entries stack a seed signal on an exploration bonus: then the baselines (the trainer alone
    and with each bonus), each seed signal alone, and each on every bonus, each panel drawn
    against its own baseline."""
    from reflectrl.registry import parse_algo

    parsed = {e.label: parse_algo(e.algo) for e in exp.spec.entries()}
    labels = [label for label in exp.spec.algos if label in parsed]
    bonus_of = {label: tuple(s for s in a.signals if s in EXPLORATION_BONUSES) for label, a in parsed.items()}
    seeded = {label: any(s not in EXPLORATION_BONUSES for s in a.signals) for label, a in parsed.items()}
    baselines = [label for label in labels if not seeded[label]]
    stacks = list(dict.fromkeys(bonus_of[label] for label in labels if seeded[label]))
    if not any(stacks):  # nothing stacked: one panel, drawn against the plain baselines
        return [("", labels, [label for label in labels if not parsed[label].signals])]
    panels = [("baselines", baselines, [label for label in baselines if not parsed[label].signals])]
    for stack in stacks:
        refs = [label for label in baselines if bonus_of[label] == stack]
        members = [label for label in labels if seeded[label] and bonus_of[label] == stack]
        trainer = parsed[members[0]].trainer
        title = (f"each signal on {'+'.join((trainer, *stack))}" if stack else "each signal alone")
        panels.append((title + (f" (vs {', '.join(refs)})" if refs else ""), refs + members, refs))
    return panels


def learning_curves_figure(exp: Experiment, env_id: str):
    panels = [p for p in curve_panels(exp) if any(exp.select(env_id, label) for label in p[1])]
    panels = panels or [("", list(exp.spec.algos), [])]
    cols = 1 if len(panels) == 1 else 2
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4 * rows), dpi=DPI, sharey=True, squeeze=False)
    colour = {label: COLORS[i % len(COLORS)] for i, label in enumerate(exp.spec.algos)}
    same = identical_entries(exp, env_id)
    for ax, (title, labels, refs) in zip(axes.flat, panels):
        banded = set(labels) if len(labels) <= MAX_BANDS else set(refs)
        for label in labels:
            runs = exp.select(env_id, label)
            if not runs:
                continue
            curves = np.stack([_fill(r.curve) for r in runs])
            mid, lo, hi = _band(curves)
            style = "--" if label in refs and len(panels) > 1 else "-"
            name = f"{label} ({len(runs)} seeds)"
            if label in same:
                name = f"{label} ({len(runs)} seeds; identical to {same[label]})"
                if same[label] in labels:  # drawn on top in dashes, the other's colour showing between them
                    style = identical_dashes(label, same, labels)
                    banded.discard(label)  # the same band again would only darken it
            ax.plot(exp.grid, mid, linestyle=style, color=colour[label], label=name,
                    zorder=3 if label in same else 2)
            if label in banded:
                ax.fill_between(exp.grid, lo, hi, color=colour[label], alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set(xlabel="env steps", ylabel="return")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=TICK_SIZE)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    many = any(len(labels) > MAX_BANDS for _, labels, _ in panels)
    heading = f"{env_id}: true episodic return (IQM, 95% CI"
    heading += f"{'; bands for the baselines only' if many else ''})"
    suptitle(fig, heading, fontsize=12 if len(panels) == 1 else 11)
    fig.tight_layout()
    return fig


def final_intervals(table: list[dict], env_id: str) -> bytes:
    return _png(final_intervals_figure(table, env_id))


def final_intervals_figure(table: list[dict], env_id: str):
    """One bar (the 95% CI) and tick (the IQM) per algo entry; ROW_INCHES of height per entry,
    half a row of room above the first and below the last, and a margin on either side."""
    rows = [r for r in table if r["env"] == env_id and r.get("seeds")]
    n = max(1, len(rows))
    fig, ax = plt.subplots(figsize=(6.4, 1.8 + ROW_INCHES * n), dpi=DPI)  # two title lines
    for i, row in enumerate(rows):
        lo, hi = row["final_ci"]
        color = COLORS[i % len(COLORS)]
        ax.plot([lo, hi], [i, i], color=color, lw=8, alpha=0.5, solid_capstyle="butt")
        ax.plot([row["final_iqm"]], [i], "|", color="k", ms=14)
        seeds = row.get("final_seeds") or []
        offsets = np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else np.zeros(len(seeds))
        ax.plot(seeds, i + offsets, "o", color=color, mec="k", mew=0.5, ms=5, label="one seed" if i == 0 else None)
    ax.set_yticks(range(len(rows)), [r["algo"] for r in rows])
    ax.set_ylim(n - 0.5, -0.5)  # first entry on top
    ax.margins(x=0.08)
    few = any(r.get("seeds", 0) < 5 for r in rows)
    # centred on the figure, not the axes: long entry labels push the axes right, and an axes title
    # of a long env id then ran off the figure's right edge
    fig.suptitle(f"{env_id}: final return\nIQM (|), 95% CI (bar), each seed (o)"
                 + ("; < 5 seeds: the seeds' range, †" if few else ""), fontsize="large")
    ax.set(xlabel="final return (mean of the last 10%)")
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(labelsize=TICK_SIZE)
    fig.tight_layout()
    return fig


def diagnostic_keys(exp: Experiment) -> list[str]:
    keys = []
    for run in exp.finished:
        for row in run.rows[:1] + run.rows[-1:]:
            for key, value in row.items():
                if key not in STANDARD_METRICS and isinstance(value, (int, float)) and key not in keys:
                    keys.append(key)
    return keys


def diagnostics(exp: Experiment, env_id: str, keys: list[str], curves: dict | None = None) -> bytes | None:
    """The diagnostics figure's PNG; None where no panel is left to draw. `curves`: diagnostic_curves'
    answer where the caller has it already."""
    fig = diagnostics_figure(exp, env_id, keys, curves)
    return None if fig is None else _png(fig)


def diagnostic_curves(exp: Experiment, env_id: str, keys: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Each signal metric (and the policy entropy): {entry: its mean over seeds on the step
    grid} over the entries whose runs on the env logged it."""
    out = {}
    for key in keys + ["entropy"]:
        out[key] = {}
        for label in exp.spec.algos:
            series = []
            for run in exp.select(env_id, label):
                pts = [(row["global_step"], row[key]) for row in run.rows
                       if isinstance(row.get(key), (int, float)) and np.isfinite(row[key])]
                if pts:
                    series.append(np.interp(exp.grid, *zip(*pts)))
            if series:
                out[key][label] = np.mean(series, axis=0)
    return out


def constant_diagnostics(curves: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """The metrics of `diagnostic_curves` whose every curve is a flat line (a neutral signal's
    bonus 0, an alpha fixed at 0): {metric: {entry: its value}}. A panel of flat lines says
    nothing a number cannot, and a report had about ten of them."""
    def flat(curve: np.ndarray) -> bool:
        return float(np.ptp(curve)) <= 1e-12 * max(1.0, float(np.abs(curve).max()))

    return {key: {label: float(curve[0]) for label, curve in by_entry.items()}
            for key, by_entry in curves.items() if by_entry and all(flat(c) for c in by_entry.values())}


def diagnostics_figure(exp: Experiment, env_id: str, keys: list[str], curves: dict | None = None):
    """One panel per signal metric (and the policy entropy) that some entry logged on the env
    and that is not constant (`constant_diagnostics`), mean over seeds per algo entry; one
    legend below the panels with every entry drawn in any of them. None where no panel is left."""
    curves = diagnostic_curves(exp, env_id, keys) if curves is None else curves
    constant = constant_diagnostics(curves)
    shown = [key for key, by_entry in curves.items() if by_entry and key not in constant]
    if not shown:
        return None
    fig, axes = _panel_grid(len(shown))
    for ax, key in zip(axes.flat, shown):
        for i, label in enumerate(exp.spec.algos):
            if label in curves[key]:
                ax.plot(exp.grid, curves[key][label], color=COLORS[i % len(COLORS)], label=label)
        _style_panel(ax, key)
        ax.set_ylabel(key, fontsize=TICK_SIZE)
    _finish_grid(fig, axes, len(shown), exp.spec.algos, f"{env_id}: diagnostics over training (mean over seeds)")
    return fig  # laid out (constrained) when drawn or saved


def _panel_grid(n: int):
    """A figure of n panels, 3 to a row, laid out (constrained) with room for a legend below."""
    cols = min(3, n)
    nrows = -(-n // cols)
    return plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows + 0.8), squeeze=False, dpi=DPI,
                        layout="constrained")


def _style_panel(ax, title: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("env steps", fontsize=TICK_SIZE)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.xaxis.get_offset_text().set_fontsize(TICK_SIZE)
    ax.yaxis.get_offset_text().set_fontsize(TICK_SIZE)


def _finish_grid(fig, axes, used: int, algos: list[str], title: str) -> None:
    """Blank the unused panels; one legend for the figure, made of the lines drawn (panels
    only show the entries that log their metric, and an entry drawn in any panel is in it)."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    drawn = {}
    for ax in axes.flat:
        for line in ax.get_lines():
            drawn.setdefault(line.get_label(), line)
    labels = [label for label in algos if label in drawn]
    suptitle(fig, title, fontsize=11)
    # up to 4 columns, fewer where the row would be wider than the figure (one panel's is 4.2 inches)
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(4, len(labels)), 0, -1):
        legend = fig.legend([drawn[label] for label in labels], labels, loc="outside lower center", ncol=ncol,
                            fontsize=TICK_SIZE)
        if ncol == 1 or legend.get_window_extent(renderer).width <= TITLE_WIDTH * fig.bbox.width:
            break
        legend.remove()


def _series(run, key: str, grid: np.ndarray) -> np.ndarray | None:
    """A run's logged metric on the step grid (nan before its first value), or None if never logged."""
    pts = [(row["global_step"], row[key]) for row in run.rows
           if isinstance(row.get(key), (int, float)) and np.isfinite(row[key])]
    if not pts:
        return None
    steps, values = zip(*pts)
    return np.where(grid < steps[0], np.nan, np.interp(grid, steps, values))


def exploration_keys(exp: Experiment, env_id: str) -> list[str]:
    """The exploration series some run of the env logged."""
    runs = [r for r in exp.finished if r.spec.env_id == env_id]
    return [k for k in EXPLORATION_SERIES if any(k in row for r in runs for row in r.rows[-1:])]


def exploration(exp: Experiment, env_id: str) -> bytes:
    return _png(exploration_figure(exp, env_id))


def exploration_figure(exp: Experiment, env_id: str):
    """The exploration metrics per algo entry, IQM over seeds with a 95% band as the returns,
    and the share of seeds that have seen a non-zero reward by each step (first_reward_step)."""
    keys = exploration_keys(exp, env_id) + ["first_reward_step"]
    fig, axes = _panel_grid(len(keys))
    for ax, key in zip(axes.flat, keys):
        for i, label in enumerate(exp.spec.algos):
            runs = exp.select(env_id, label)
            color = COLORS[i % len(COLORS)]
            if key == "first_reward_step":
                if runs:
                    firsts = [next((row["first_reward_step"] for row in r.rows[::-1]
                                    if row.get("first_reward_step") is not None), np.inf) for r in runs]
                    share = [(np.array(firsts) <= x).mean() for x in exp.grid]
                    ax.plot(exp.grid, share, color=color, label=label)
                continue
            series = [s for s in (_series(r, key, exp.grid) for r in runs) if s is not None]
            if series:
                mid, lo, hi = _band(np.stack(series))
                ax.plot(exp.grid, mid, color=color, label=label)
                ax.fill_between(exp.grid, lo, hi, color=color, alpha=0.2)
        _style_panel(ax, "seeds with a non-zero reward by then" if key == "first_reward_step" else key)
    _finish_grid(fig, axes, len(keys), exp.spec.algos, f"{env_id}: exploration (IQM over seeds, 95% CI)")
    return fig


def gif_bytes(pngs: list[bytes], ms_per_frame: int) -> bytes:
    """PNG frames as one looping GIF."""
    from PIL import Image

    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pngs]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=ms_per_frame, loop=0)
    return buf.getvalue()
