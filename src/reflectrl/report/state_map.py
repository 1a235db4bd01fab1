"""State maps (seed 000 section 5.3, seed 002 section 7): where a run went and what it was
paid there, at the points of training it kept (runs/state_samples.py).

Each snapshot is one row of panels over a 2-D projection of the state:

- the visitation count (log scale), then the mean environment reward per bin, then the
  mean of each signal's per-step term (the calibration bonus, the shaping reward, the GEAR
  weight, RND's intrinsic reward, the count bonus, ...);
- the projection: the built-in grid world's cell, MiniGrid's agent position, Montezuma's
  agent position (x, y; the rooms visited are named in the title), else two dimensions of a
  flat observation (`--dims`, default 0,1: LunarLander's x and y position).

Output: `state_map.png` (every snapshot, one row each, one colour scale per column),
`step_<global step>.png` per snapshot, and `state_map.gif` (the snapshots in turn).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reflectrl.config import RunConfig, env_settings  # noqa: E402
from reflectrl.envs.statekey import is_montezuma, room_of_key, unpack_craftax_key, unpack_navix_key  # noqa: E402
from reflectrl.errors import UserError  # noqa: E402
from reflectrl.outputs import check_writable, write_files  # noqa: E402
from reflectrl.report.plots import gif_bytes, png_bytes  # noqa: E402
from reflectrl.runs import RunDir  # noqa: E402
from reflectrl.runs.rundir import STATE_SAMPLES  # noqa: E402
from reflectrl.runs.state_samples import load_samples  # noqa: E402

DEFAULT_BINS = 40

GRID_WORLD_IDS = ("reflectrl/GridWorld", "reflectrl:GridWorld")  # both backends' built-in grid world


def parse_dims(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        i, j = (int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--dims {text}: give two observation indices, e.g. --dims 0,1") from None
    if i < 0 or j < 0 or i == j:
        raise UserError(f"--dims {text}: give two different indices >= 0, e.g. --dims 0,1")
    return i, j


def projection(cfg: RunConfig, sample: dict, dims: tuple[int, int] | None):
    """(x, y, x label, y label, discrete cells?) of a snapshot's steps."""
    keys = sample["state_keys"].astype(np.int64)
    env_id = cfg.env_id
    if dims is None:
        if env_id.startswith(GRID_WORLD_IDS):
            size = _grid_size(cfg)
            row, col = np.divmod(keys, size)
            return col, row, "column", "row", True
        if env_id.startswith(("MiniGrid", "BabyAI")):
            return keys & 0xFF, (keys >> 8) & 0xFF, "x", "y", True
        if env_id.startswith(("navix:", "xminigrid:")):
            col, row = unpack_navix_key(keys)
            return col, row, "column", "row", True
        if env_id.startswith("craftax:"):
            x, y = unpack_craftax_key(keys)
            return x, y, "x", "y", True
        if is_montezuma(env_id):
            return (keys >> 8) & 0xFF, keys & 0xFF, "x (RAM 42)", "y (RAM 43)", False
        dims = (0, 1)
    if "obs" not in sample:
        raise UserError(f"{env_id}: its observation is not a flat vector the run kept and the env gives no position; "
                        "a state map needs a grid world, MiniGrid, Montezuma or a vector observation (--dims I,J)")
    obs = sample["obs"]
    if max(dims) >= obs.shape[1]:
        raise UserError(f"--dims {dims[0]},{dims[1]}: the observation has {obs.shape[1]} dimensions "
                        f"(indices 0 to {obs.shape[1] - 1})")
    norm = " (normalised)" if env_settings(cfg).norm_obs else ""
    return obs[:, dims[0]], obs[:, dims[1]], f"obs[{dims[0]}]{norm}", f"obs[{dims[1]}]{norm}", False


def _grid_size(cfg: RunConfig) -> int:
    """The run's grid side (a custom layout sets it), read from the grid world its settings make
    (the JAX backend's maze is built from the same settings)."""
    from reflectrl.envs.gridworld import GridWorldEnv

    return int(GridWorldEnv(**cfg.env).size)


def _edges(values: list[np.ndarray], discrete: bool, bins: int) -> np.ndarray:
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    if discrete:
        return np.arange(lo - 0.5, hi + 1.5)
    if hi <= lo:
        hi = lo + 1e-6
    return np.linspace(lo, hi, bins + 1)


def binned(x, y, values, ex, ey) -> tuple[np.ndarray, np.ndarray]:
    """(visit counts, mean of `values` per bin; NaN where nothing was visited), shape (len(ey)-1, len(ex)-1)."""
    counts, _, _ = np.histogram2d(y, x, bins=[ey, ex])
    if values is None:
        return counts, counts
    sums, _, _ = np.histogram2d(y, x, bins=[ey, ex], weights=values)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return counts, mean


def state_maps(run_path, dims=None, bins: int = DEFAULT_BINS):
    """(config, [(iteration, global step, {panel title: 2-D array})], extent, axis labels, rooms per snapshot)."""
    run = RunDir.open(run_path, kind="control")
    cfg = RunConfig.from_dict(run.config())
    path = run.path / STATE_SAMPLES
    if not path.is_file():
        raise UserError(f"{run.path} kept no state samples ({STATE_SAMPLES} missing): it was trained before state "
                        "maps existed or with state_map_snapshots=0; train it again to draw one")
    samples = load_samples(path)
    if not samples:
        raise UserError(f"{run.path}: {STATE_SAMPLES} holds no snapshot")
    projected = {it: projection(cfg, s, dims) for it, s in sorted(samples.items())}
    first = next(iter(projected.values()))
    xlabel, ylabel, discrete = first[2], first[3], first[4]
    if dims is None and cfg.env_id.startswith(GRID_WORLD_IDS):
        # the whole grid, visited or not: how much of the maze a run never reached is the point
        ex = ey = np.arange(-0.5, _grid_size(cfg) + 0.5)
    else:
        ex = _edges([p[0] for p in projected.values()], discrete, bins)
        ey = _edges([p[1] for p in projected.values()], discrete, bins)
    terms = sorted({k[len("term:"):] for s in samples.values() for k in s if k.startswith("term:")})
    rows = []
    for it, (x, y, *_) in projected.items():
        s = samples[it]
        counts, reward = binned(x, y, s["rewards"], ex, ey)
        panels = {"visits (log10 1+n)": np.log10(1 + counts), "mean env reward": reward}
        for term in terms:
            values = s.get(f"term:{term}")
            panels[f"mean {term}"] = (binned(x, y, values, ex, ey)[1] if values is not None
                                      else np.full_like(counts, np.nan))
        rooms = sorted(set(room_of_key(s["state_keys"]).tolist())) if is_montezuma(cfg.env_id) else None
        rows.append((it, int(s["global_step"]), panels, rooms))
    extent = (ex[0], ex[-1], ey[-1], ey[0]) if discrete else (ex[0], ex[-1], ey[0], ey[-1])
    return cfg, rows, extent, (xlabel, ylabel, discrete)


def _limits(rows) -> dict[str, tuple[float, float]]:
    """One colour scale per panel across snapshots (symmetric around 0 for signed values)."""
    limits = {}
    for title in rows[0][2]:
        values = np.concatenate([r[2][title][np.isfinite(r[2][title])].ravel() for r in rows])
        if values.size == 0:
            limits[title] = (0.0, 1.0)
        elif title.startswith("visits") or values.min() >= 0:
            limits[title] = (float(values.min()), float(values.max()) or 1e-6)
        else:
            m = float(np.abs(values).max()) or 1e-6
            limits[title] = (-m, m)
    return limits


def _draw_row(axes, row, limits, extent, labels, first_row: bool):
    _, step, panels, rooms = row
    xlabel, ylabel, discrete = labels
    for ax, (title, grid) in zip(axes, panels.items()):
        lo, hi = limits[title]
        cmap = "viridis" if title.startswith("visits") or lo >= 0 else "RdBu_r"
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=lo, vmax=hi, extent=extent,
                          origin="upper" if discrete else "lower", aspect="auto", interpolation="nearest")
        if first_row:
            ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        plt.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
    note = f"step {step:,}" + (f"\nrooms {rooms}" if rooms is not None else "")
    axes[0].set_ylabel(f"{note}\n{ylabel}", fontsize=8)


def _figure(cfg, rows, limits, extent, labels, title_suffix="") -> bytes:
    cols = len(rows[0][2])
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.2 * cols, 2.8 * len(rows) + 0.6), squeeze=False)
    for r, row in enumerate(rows):
        _draw_row(axes[r], row, limits, extent, labels, first_row=r == 0)
    fig.suptitle(f"{cfg.env_id}, {cfg.algo}, seed {cfg.seed}: state map{title_suffix}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_size_inches()[1]))  # room for the title
    return png_bytes(fig, dpi=80)  # capped in pixels: a map of many snapshots is one tall figure


def plot_state_map(run_path, out_dir=None, dims: str | None = None, bins: int = DEFAULT_BINS) -> Path:
    if bins < 2:
        raise UserError(f"--bins {bins}: must be at least 2")
    cfg, rows, extent, labels = state_maps(run_path, parse_dims(dims), bins)
    out = check_writable(Path(out_dir) if out_dir else Path(run_path) / "state_map", "--out", directory=True)
    limits = _limits(rows)
    files = {"state_map.png": _figure(cfg, rows, limits, extent, labels)}
    for row in rows:
        files[f"step_{row[1]:09d}.png"] = _figure(cfg, [row], limits, extent, labels)
    files["state_map.gif"] = gif_bytes([files[f"step_{row[1]:09d}.png"] for row in rows], ms_per_frame=900)
    return write_files(out, files)
