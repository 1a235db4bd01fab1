"""How long a bad command line takes to be refused, beside `reflectrl --help` (issue 57, item 9).

    python bench/refusal_time.py [--repeats 5] [--json FILE]

Each case runs `reflectrl ...` as a new process (`python -m reflectrl`, this interpreter), `--repeats`
times, interleaved with the others; it prints the median wall seconds of each, the ratio to `--help`'s
median, and whether it was refused as it should be (exit status 2, one line on stderr) and which of
torch, JAX and gymnasium the refusal imported (read with `-X importtime`, in one more run). A refusal
of a bad `--algo`, `--set` key or value, signal knob or backend combination is read from the config
dataclasses and the registry alone (config.new_config, signals/specs/), so it should answer in about
the time of `--help`; a refusal that needs the env (an unknown env id, a knob whose default depends on
the env) still builds it. Nothing is written: every --out is under a temporary directory, and a
refusal makes none.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "jax", "gymnasium")

# (name, arguments after `reflectrl`; "{out}" is replaced by a fresh path): each a refusal, but `help`
CASES = [
    ("help", ["--help"]),
    ("train: unknown --set key", ["train", "--algo", "ppo", "--env", "CartPole-v1", "--set", "no_such_knob=1",
                                  "--out", "{out}"]),
    ("train: bad value type", ["train", "--algo", "ppo", "--env", "CartPole-v1", "--set", "num_envs=abc",
                               "--out", "{out}"]),
    ("train: unknown signal knob", ["train", "--algo", "ppo+calibration", "--env", "CartPole-v1", "--set",
                                    "calibration.nope=1", "--out", "{out}"]),
    ("train: bad signal value", ["train", "--algo", "ppo+calibration", "--env", "CartPole-v1", "--set",
                                 "calibration.alpha=-1", "--out", "{out}"]),
    ("train: signal knob of another algo", ["train", "--algo", "ppo", "--env", "CartPole-v1", "--set",
                                            "gear.temperature=4", "--out", "{out}"]),
    ("train: bad bracket knob", ["train", "--algo", "ppo+calibration[mode=nope]", "--env", "CartPole-v1",
                                 "--out", "{out}"]),
    ("train: unknown --algo", ["train", "--algo", "ppo+nosuch", "--env", "CartPole-v1", "--out", "{out}"]),
    ("train jax: bad knob", ["train", "--algo", "ppo", "--env", "gymnax:CartPole-v1", "--set", "backend=jax",
                             "no_such_knob=1", "--out", "{out}"]),
    ("train jax: torch-only knob", ["train", "--algo", "ppo", "--env", "gymnax:CartPole-v1", "--set",
                                    "backend=jax", "encoder=cnn", "--out", "{out}"]),
    ("train jax: torch-only signal knob", ["train", "--algo", "ppo+gear", "--env", "gymnax:CartPole-v1", "--set",
                                           "backend=jax", "gear.history=2", "--out", "{out}"]),
    ("train jax: torch-only trainer", ["train", "--algo", "dqn", "--env", "gymnax:CartPole-v1", "--set",
                                       "backend=jax", "--out", "{out}"]),
    ("train jax: not a JAX env id", ["train", "--algo", "ppo", "--env", "CartPole-v1", "--set", "backend=jax",
                                     "--out", "{out}"]),
    ("compare: unknown --set key", ["compare", "--algos", "ppo,ppo+gear", "--env", "CartPole-v1", "--total-steps",
                                    "1000", "--set", "no_such_knob=1", "--out", "{out}"]),
    ("compare: bad entry knob", ["compare", "--algos", "ppo,ppo+gear[nope=1]", "--env", "CartPole-v1",
                                 "--total-steps", "1000", "--out", "{out}"]),
    ("sweep: unknown --set key", ["sweep", "--algo", "ppo", "--env", "CartPole-v1", "--space",
                                  "learning_rate=loguniform(1e-4,1e-3)", "--trials", "2", "--seeds", "1",
                                  "--total-steps", "1000", "--set", "no_such_knob=1", "--out", "{out}"]),
    ("llm train: unknown --set key", ["llm", "train", "--algo", "grpo", "--task", "arith", "--model", "models/tiny",
                                      "--set", "no_such_knob=1", "--out", "{out}"]),
    ("llm train: bad bracket knob", ["llm", "train", "--algo", "grpo+gear[top_frac=2]", "--task", "arith",
                                     "--model", "models/tiny", "--out", "{out}"]),
]


def command(args: list[str], tmp: Path, n: int, importtime: bool = False) -> list[str]:
    out = str(tmp / f"out{n}")
    return [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "reflectrl",
            *[a.replace("{out}", out) for a in args]]


def run_once(args: list[str], tmp: Path, n: int) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(command(args, tmp, n), capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode, done.stderr


def heavy_imports(args: list[str], tmp: Path, n: int) -> list[str]:
    """The HEAVY packages the command imported (python -X importtime's report on stderr)."""
    err = subprocess.run(command(args, tmp, n, importtime=True), capture_output=True, text=True).stderr
    names = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    return [m for m in HEAVY if m in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each case (default 5)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    opts = parser.parse_args()

    times: dict[str, list[float]] = {name: [] for name, _ in CASES}
    outcome: dict[str, tuple[int, str]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        n = 0
        for _ in range(opts.repeats):  # interleaved: a slow moment of the machine falls on every case alike
            for name, args in CASES:
                n += 1
                seconds, code, err = run_once(args, tmp, n)
                times[name].append(seconds)
                outcome[name] = (code, err)
        imported = {}
        for name, args in CASES:
            n += 1
            imported[name] = heavy_imports(args, tmp, n)
        left = sorted(p.name for p in tmp.iterdir())
    base = statistics.median(times["help"])
    rows = []
    print(f"{'case':<36} {'median s':>8} {'x help':>6}  refused  imports")
    for name, _ in CASES:
        median = statistics.median(times[name])
        code, err = outcome[name]
        lines = [x for x in err.splitlines() if x.strip()]
        refused = name == "help" or (code == 2 and len(lines) == 1)
        rows.append({"case": name, "median_s": round(median, 3), "times_s": [round(t, 3) for t in times[name]],
                     "ratio_to_help": round(median / base, 2), "exit": code, "one_line": len(lines) == 1,
                     "imports": imported[name], "message": lines[-1] if lines else ""})
        print(f"{name:<36} {median:>8.2f} {median / base:>6.1f}  {'yes' if refused else 'NO':<7}  "
              f"{', '.join(imported[name]) or '-'}")
    if left:
        print(f"left behind (should be nothing): {', '.join(left)}")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"repeats": opts.repeats, "python": sys.version.split()[0],
                                               "rows": rows, "left_behind": left}, indent=1) + "\n")


if __name__ == "__main__":
    main()
