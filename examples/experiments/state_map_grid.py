"""One seed per entry on one figure: each run's visits at each of its state-map snapshots, a row
per run (reflectrl.report.state_map's maps, the colour scale shared by every panel), for
comparing how far entries explore.

    python examples/experiments/state_map_grid.py RUN_DIR [RUN_DIR ...] --out FILE.webp [--labels A,B,...]
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from reflectrl.report.state_map import state_maps  # noqa: E402

VISITS = "visits (log10 1+n)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True, help="a .webp or .png file")
    ap.add_argument("--labels", default=None, help="one row label per run, comma-separated (default: algo, seed)")
    args = ap.parse_args()
    maps = [state_maps(run) for run in args.runs]
    labels = args.labels.split(",") if args.labels else [f"{cfg.algo}, seed {cfg.seed}" for cfg, *_ in maps]
    if len(labels) != len(maps):
        raise SystemExit(f"state_map_grid: {len(labels)} labels for {len(maps)} runs")
    cols = max(len(rows) for _, rows, *_ in maps)
    vmax = max(float(np.nanmax(row[2][VISITS])) for _, rows, *_ in maps for row in rows)
    fig, axes = plt.subplots(len(maps), cols, figsize=(1.6 * cols + 0.8, 1.6 * len(maps) + 0.4), squeeze=False,
                             layout="constrained")
    for r, ((cfg, rows, extent, _), label) in enumerate(zip(maps, labels)):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(rows):
                ax.axis("off")
                continue
            _, step, panels, _ = rows[c]
            image = ax.imshow(panels[VISITS], cmap="viridis", vmin=0, vmax=vmax, extent=extent,
                              interpolation="nearest")
            ax.set_title(f"step {step:,}", fontsize=7)
        axes[r][0].set_ylabel(label, fontsize=7)
    fig.suptitle(f"{maps[0][0].env_id}: visits per snapshot (log10 1+n), one seed per entry", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.4).ax.tick_params(labelsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    picture = Image.open(buf).convert("RGB")
    if out.suffix.lower() == ".webp":
        picture.save(out, "WEBP", lossless=True, method=6)
    else:
        picture.save(out)
    print(f"{out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
