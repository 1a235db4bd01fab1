"""The shaping statistics of a comparison's shaping runs, as docs/sdrs.md tabulates them.

    python examples/experiments/shaping_stats.py OUT_DIR [OUT_DIR ...]

For every entry of `reflectrl compare --out OUT_DIR` whose runs log `label_r2` (the share of
the soft labels' variance the shaper explains right after a fit) and `shaping_to_reward`
(mean |f| / mean |r| of the shaped transitions), prints the median over every logged
iteration of the entry's runs, and each seed's median, so the figure can be recomputed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

KEYS = ("label_r2", "shaping_to_reward")


def entry_stats(entry_dir: Path) -> dict | None:
    per_seed: dict[str, dict[str, list[float]]] = {}
    for metrics in sorted(entry_dir.glob("seed*/metrics.jsonl")):
        values: dict[str, list[float]] = {k: [] for k in KEYS}
        for line in metrics.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            for k in KEYS:
                if row.get(k) is not None:
                    values[k].append(float(row[k]))
        if any(values.values()):
            per_seed[metrics.parent.name] = values
    if not per_seed:
        return None
    out = {}
    for k in KEYS:
        pooled = [v for seed in per_seed.values() for v in seed[k]]
        out[k] = {
            "median": statistics.median(pooled) if pooled else None,
            "per_seed_median": {s: (statistics.median(v[k]) if v[k] else None) for s, v in per_seed.items()},
            "rows": len(pooled),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dirs", nargs="+", type=Path)
    args = parser.parse_args()
    for out_dir in args.out_dirs:
        for entry in sorted(p for p in out_dir.glob("runs/*/*") if p.is_dir()):
            stats = entry_stats(entry)
            if stats is None:
                continue
            print(f"{out_dir.name} {entry.parent.name} {entry.name}")
            for k, s in stats.items():
                seeds = ", ".join(f"{n}={v:.4g}" if v is not None else f"{n}=-"
                                  for n, v in s["per_seed_median"].items())
                med = f"{s['median']:.4g}" if s["median"] is not None else "-"
                print(f"  {k}: median {med} over {s['rows']} rows; per seed: {seeds}")


if __name__ == "__main__":
    main()
