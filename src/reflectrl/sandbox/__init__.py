"""Run untrusted, model-generated Python against unit tests, and score it.

    from reflectrl.sandbox import run_code, run_batch, code_reward

    result = run_code(code, {"entry_point": "solve",
                             "cases": [{"args": [1, 2], "expected": 3}, ...]})
    result.status, result.passed, result.total   # "ok", 3, 3
    code_reward(result)                          # passed / total
    run_batch([(code, tests), ...])              # in parallel, one process per core

    reflectrl sandbox run --code F.py --tests T.json [--timeout S] [--json]

A policy under RL pressure finds any hole that pays, so the snippet is treated as hostile.

How a run works
---------------
One `bwrap` process and one Python process per run. The parent sends the child the
code, the entry point and the *arguments* of each case (never the expected values; the
tests file is never inside the sandbox) through a memfd on stdin. A small harness in the
child compiles the code, imports it, calls the entry point on each case's arguments and
writes one line per case to a private pipe, tagged with a nonce that is random per run.
The verdict is the parent's: it decodes and checks those lines and compares the outputs
with the expected values it never sent, so nothing the child prints, patches or forges
can turn a wrong answer into a pass; the only way to make a case pass is to produce its
expected output.

Modules
-------
* `suite`: the tests format, `load_tests`, `TestSuite`, `InvalidTests`.
* `harness`: the program run inside the sandbox, and its wire format (both ends).
* `isolation`: bubblewrap's command line, rlimits, the child's environment, per-run uids;
  its docstring says what is and is not contained, in both isolation modes.
* `process`: spawning, feeding, timeouts, output caps, reading the pipes, killing.
* `verdict`: the parent's comparison and the status of a run.
* `results`: `SandboxResult`, `CaseResult`, `STATUSES`, `code_reward`.
* `runner`: `run_code` and `run_batch`.
* `cli`: `reflectrl sandbox run`.

In short: contained are the filesystem (read-only /usr and the interpreter, a private
tmpfs), the network (none), processes (a PID namespace; nothing survives the run), the
identity (an unprivileged uid, no capabilities) and resources (rlimits, a wall clock,
output caps); not contained are kernel bugs (no seccomp), memory and CPU per run (limits
are per process; no cgroup) and read access to /usr. isolation="rlimits-only" (CLI
`--unsafe-no-bwrap`) has NO filesystem, network or PID isolation and is only for code you
would run anyway; without bubblewrap the default mode raises `SandboxUnavailable` rather
than run unconfined. Details: `reflectrl.sandbox.isolation` and docs/sandbox.md.

The names below are imported lazily (on first use), so importing `reflectrl.sandbox.cli`
(the CLI's parser) stays cheap. `reflectrl.sandbox` and `reflectrl.sandbox.cli` are
aliases of this package kept for older imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = [
    "STATUSES", "ISOLATION_MODES", "SandboxUnavailable", "InvalidTests", "CaseResult", "SandboxResult",
    "TestSuite", "load_tests", "run_code", "run_batch", "code_reward", "bwrap_available",
]

_WHERE = {
    "STATUSES": "results", "CaseResult": "results", "SandboxResult": "results", "code_reward": "results",
    "InvalidTests": "suite", "TestSuite": "suite", "load_tests": "suite",
    "ISOLATION_MODES": "isolation", "SandboxUnavailable": "isolation", "bwrap_available": "isolation",
    "run_code": "runner", "run_batch": "runner",
}

if TYPE_CHECKING:
    from reflectrl.sandbox.isolation import ISOLATION_MODES, SandboxUnavailable, bwrap_available
    from reflectrl.sandbox.results import STATUSES, CaseResult, SandboxResult, code_reward
    from reflectrl.sandbox.runner import run_batch, run_code
    from reflectrl.sandbox.suite import InvalidTests, TestSuite, load_tests


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
