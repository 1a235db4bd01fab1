"""The calibration picture of a RefGRPO run: predicted vs actual (normalised) advantage at a
few points of training, and the calibration loss over training (train, held-out fresh
batch, previous batch). The signal's end-of-run step (its registry entry's on_finish) and
`reflectrl plot calibration`; imported only when a picture is drawn (matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.outputs import check_writable, png_bytes  # noqa: E402
from reflectrl.registry import parse_algo  # noqa: E402
from reflectrl.runs import RunDir, atomic_write_bytes  # noqa: E402
from reflectrl.runs.rundir import read_metrics  # noqa: E402
from reflectrl.signals.compose import member_state  # noqa: E402


def plot_at_finish(run_path: str | Path) -> Path | None:
    """The picture at the end of a run whose trainer logs the calibration bonus's own metrics and
    snapshots (PPO, IMPALA, MAPPO); nothing for one that logs them per level (HPPO)."""
    run = RunDir.open(run_path, kind="control")
    if not any(r.get("calibration_loss") is not None for r in read_metrics(run.path)):
        return None
    return plot_calibration(run_path)


def plot_calibration(run_path: str | Path, out: str | Path | None = None) -> Path:
    run = RunDir.open(run_path, kind="control")
    algo = run.config().get("algo", "")
    if "calibration" not in parse_algo(algo).signals:
        raise UserError(f"{run.path} is a '{algo}' run; the calibration picture needs --algo refgrpo "
                        "(or any algo with the calibration signal, e.g. ppo+calibration+gear)")
    state = run.load_checkpoint()
    snapshots = member_state(state.get("signal"), "calibration").get("snapshots") or []
    rows = [r for r in read_metrics(run.path) if r.get("calibration_loss") is not None]
    if not rows:
        raise UserError(f"{run.path} has no calibration metrics yet; train it first")
    out = Path(out) if out else run.path / "calibration.png"
    if out.suffix.lower() != ".png":
        raise UserError(f"--out {out}: give a file name ending in .png")
    check_writable(out, "--out")

    fig = calibration_figure(run.config()["env_id"], snapshots, rows)
    atomic_write_bytes(out, png_bytes(fig, dpi=100))  # capped in pixels: one panel per snapshot
    return out


LOSS_SERIES = (("calibration_loss", "train (after fit)"), ("calibration_loss_heldout", "fresh batch (before fit)"),
               ("calibration_loss_prev_batch", "previous batch"))


def _finite_points(rows: list[dict], key: str) -> list[tuple[float, float]]:
    return [(r["global_step"], r[key]) for r in rows
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def calibration_figure(env_id: str, snapshots: list[dict], rows: list[dict]):
    """The laid-out Figure: one scatter per snapshot, then the losses over training. A loss
    series is drawn (and in the legend) only where it has a finite value; a series of one
    point gets a marker, since a line through one point draws nothing."""
    n = max(1, len(snapshots))
    fig, axes = plt.subplots(1, n + 1, figsize=(3.2 * (n + 1), 3.4), squeeze=False)
    axes = axes[0]
    for ax, snap in zip(axes, snapshots):
        target, pred = np.array(snap["target"]), np.array(snap["prediction"])
        lim = float(np.percentile(np.abs(np.concatenate([target, pred])), 99)) or 1.0
        ax.scatter(target, pred, s=4, alpha=0.4)
        ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
        r = np.corrcoef(target, pred)[0, 1] if np.std(pred) > 0 and np.std(target) > 0 else float("nan")
        ax.set(xlim=(-lim, lim), ylim=(-lim, lim), title=f"iteration {snap['iteration']} (r={r:.2f})",
               xlabel="actual advantage (normalised)", ylabel="reflection f(s,a)")
        ax.title.set_fontsize(9)
    if not snapshots:
        axes[0].text(0.5, 0.5, "no snapshots saved", ha="center", va="center")
        axes[0].axis("off")
    ax = axes[-1]
    for key, label in LOSS_SERIES:
        points = _finite_points(rows, key)
        if points:
            ax.plot(*zip(*points), marker="o" if len(points) == 1 else None, label=label)
    ax.axhline(1.0, color="k", lw=0.8, ls=":", label="knows nothing (=1)")
    ax.set(title="calibration loss L_cal", xlabel="env steps", ylabel="MSE vs normalised advantage")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.suptitle(f"{env_id}: reflection calibration", fontsize=10)
    fig.tight_layout()
    return fig
