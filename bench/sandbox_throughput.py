"""Sandbox executions per second: a trivial snippet with 3 test cases, run serially (one
core) and with run_batch over every usable core. For scale it also times a bare
`python -S -B -c pass` spawn (the floor any process-per-run design pays).

    python bench/sandbox_throughput.py [--runs 100] [--isolation bwrap|rlimits-only] [--python PATH] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from reflectrl.sandbox import run_batch, run_code
from reflectrl.sandbox.isolation import python_layout

CODE = "def solve(a, b):\n    return a + b\n"
TESTS = {"entry_point": "solve", "cases": [
    {"args": [1, 2], "expected": 3}, {"args": [2, 2], "expected": 4}, {"args": [10, -4], "expected": 6}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100, help="runs per core for each measurement")
    ap.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits-only"])
    ap.add_argument("--python", default=None, help="interpreter inside the sandbox (default: this one's base)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    args = ap.parse_args()
    kw = {"isolation": args.isolation, "python": args.python, "timeout": 10.0}
    cores = len(os.sched_getaffinity(0))

    for _ in range(5):  # warm-up: probe, page cache
        result = run_code(CODE, TESTS, **kw)
        assert result.status == "ok", result

    exe = python_layout(args.python).exe
    t = time.perf_counter()
    for _ in range(args.runs):
        subprocess.run([exe, "-S", "-B", "-c", "pass"], check=True, env={})
    bare = args.runs / (time.perf_counter() - t)

    t = time.perf_counter()
    for _ in range(args.runs):
        result = run_code(CODE, TESTS, **kw)
        assert result.status == "ok", result
    serial = args.runs / (time.perf_counter() - t)

    n = args.runs * cores
    t = time.perf_counter()
    results = run_batch([(CODE, TESTS)] * n, max_workers=cores, **kw)
    batch = n / (time.perf_counter() - t)
    assert all(r.status == "ok" for r in results)

    figures = {
        "isolation": args.isolation, "cores": cores, "runs_per_core": args.runs,
        "bare_python_spawns_per_s": round(bare, 1),
        "serial_exec_per_s": round(serial, 1), "serial_ms_per_exec": round(1000 / serial, 2),
        "batch_exec_per_s": round(batch, 1), "batch_speedup": round(batch / serial, 2),
        "python": platform.python_version(), "kernel": platform.release(), "load_avg_1m": os.getloadavg()[0],
    }
    print(f"sandbox throughput ({args.isolation}, trivial snippet, 3 cases; "
          f"{cores} cores, load {figures['load_avg_1m']:.1f})")
    print(f"  bare python -S spawn       {bare:8.1f} /s")
    print(f"  serial (one core)          {serial:8.1f} exec/s  ({1000 / serial:.1f} ms per execution)")
    print(f"  run_batch ({cores} workers)      {batch:8.1f} exec/s  ({batch / serial:.2f}x serial)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
