"""`reflectrl sandbox run`: run a code file against a tests file in the sandbox.

    reflectrl sandbox run --code FILE.py --tests TESTS.json [--timeout S] [--json]
                          [--memory-mb N] [--python PATH] [--unsafe-no-bwrap]

TESTS.json: {"entry_point": "solve", "cases": [{"args": [...], "expected": ...}, ...]}.
Exit code 0 when every case passed (status ok), 1 when the run happened and some case did not
(any other status), as a test runner's; bad input raises UserError (one line on stderr, exit
code 2). With --json the last line printed is the result as one
JSON object. Wired into `reflectrl.cli` by `add_parser(sub)` and `run(args)` (through the
alias `reflectrl.sandbox.cli`); this module imports nothing heavy (the package's
__init__ is lazy), the sandbox itself is imported when a command runs. It only reads the
two files, checks the flags and prints the result; running and judging is `runner`.
"""

from __future__ import annotations

import argparse
import json
import sys

from reflectrl.errors import EXIT_FAILED, UserError


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `sandbox` command (with its `run` subcommand) to the CLI's subparsers."""
    sandbox = subparsers.add_parser("sandbox", help="run model-generated code against unit tests, contained")
    sub = sandbox.add_subparsers(dest="sandbox_command", metavar="{run}", required=True)
    run_p = sub.add_parser("run", help="run one code file against one tests file (exit 0 when every case passes, "
                           "1 when one does not, 2 on bad input)")
    run_p.add_argument("--code", required=True, metavar="FILE.py", help="the Python code to test")
    run_p.add_argument("--tests", required=True, metavar="TESTS.json",
                       help='{"entry_point": "solve", "cases": [{"args": [...], "expected": ...}, ...]}')
    run_p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="wall-clock seconds (default 10)")
    run_p.add_argument("--memory-mb", type=int, default=512, metavar="N",
                       help="address-space limit per process, MiB (default 512)")
    run_p.add_argument("--python", default=None, metavar="PATH",
                       help="interpreter to run the code with (default: the one running reflectrl)")
    run_p.add_argument("--json", action="store_true", help="print the result as one JSON object (the last line)")
    run_p.add_argument("--unsafe-no-bwrap", action="store_true",
                       help="run without bubblewrap: rlimits only, NO filesystem/network/process isolation")
    return sandbox


def _read_bytes(flag: str, path: str, expected: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{flag} {path}: is a directory, expected {expected}") from None
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot read it ({err.strerror})") from None


def _read_code(path: str) -> str:
    try:
        return _read_bytes("--code", path, "a .py file").decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--code {path}: not UTF-8 text") from None


def _read_tests(path: str):
    try:
        return json.loads(_read_bytes("--tests", path, "a JSON file"))
    except json.JSONDecodeError as err:
        raise UserError(f"--tests {path}: invalid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UserError(f"--tests {path}: invalid JSON (not UTF-8 text, or nested too deep)") from None


def _short(value, limit: int = 80) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run(args) -> int:
    """Run `reflectrl sandbox <command>`; returns the exit code (0: every case passed, 1: not)."""
    if args.sandbox_command != "run":
        raise UserError(f"unknown sandbox command {args.sandbox_command}")
    from reflectrl.sandbox.runner import run_code
    from reflectrl.sandbox.suite import load_tests

    if not (args.timeout > 0):
        raise UserError(f"--timeout must be > 0, got {args.timeout}")
    if args.memory_mb < 16:
        raise UserError(f"--memory-mb must be at least 16, got {args.memory_mb}")
    code = _read_code(args.code)
    suite = load_tests(_read_tests(args.tests), source=f"--tests {args.tests}")
    result = run_code(code, suite, timeout=args.timeout, memory_mb=args.memory_mb, python=args.python,
                      isolation="rlimits-only" if args.unsafe_no_bwrap else "bwrap")
    if args.unsafe_no_bwrap:
        print("reflectrl: warning: --unsafe-no-bwrap: ran with rlimits only (no filesystem, network or "
              "process isolation)", file=sys.stderr)
    verdict = 0 if result.status == "ok" else EXIT_FAILED
    if args.json:
        print(json.dumps({**result.to_dict(), "reward": result.reward}))
        return verdict
    print(f"{result.status}: {result.passed}/{result.total} cases passed in {result.duration_s:.3f}s "
          f"({result.isolation}); {result.reason}")
    failing = [c for c in result.cases if not c.passed]
    for case in failing[:10]:
        if case.error == "wrong output":
            print(f"  case {case.index}: wrong output: got {_short(case.output)}, "
                  f"expected {_short(suite.expected[case.index])}")
        else:
            print(f"  case {case.index}: {case.error}")
    if len(failing) > 10:
        print(f"  ... and {len(failing) - 10} more failing cases")
    if result.stdout:
        print("--- stdout (head) ---")
        print(result.stdout.rstrip("\n"))
    if result.stderr_tail:
        print("--- stderr (tail) ---")
        print(result.stderr_tail.rstrip("\n"))
    return verdict
