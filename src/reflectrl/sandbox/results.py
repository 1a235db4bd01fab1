"""What a sandbox run returns: the statuses, `SandboxResult` (the parent's verdict on one
run), `CaseResult` (one test case) and `code_reward` (the code task's reward).

Plain data only: nothing here runs, parses or judges code. The verdict that fills these
in is `reflectrl.sandbox.verdict`; `to_dict()` is plain JSON (what `reflectrl sandbox run
--json` prints, plus "reward").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["STATUSES", "CaseResult", "SandboxResult", "code_reward"]

STATUSES = ("ok", "failed", "timeout", "memory", "crashed", "syntax_error", "killed")


@dataclass
class CaseResult:
    index: int
    passed: bool
    output: Any = None          # the child's output, JSON-decoded by the parent (None if none)
    error: str | None = None    # exception in the snippet, or why the case has no output


@dataclass
class SandboxResult:
    passed: int
    total: int
    status: str                 # one of STATUSES
    duration_s: float
    cases: list[CaseResult] = field(default_factory=list)
    reason: str = ""            # one human-readable line on why the status is what it is
    stdout: str = ""            # head of the snippet's stdout (diagnostics only, never the verdict)
    stderr_tail: str = ""       # tail of its stderr
    exit_code: int | None = None  # of the sandbox process; 128+N for signal N under bwrap, -N without
    isolation: str = "bwrap"

    @property
    def reward(self) -> float:
        return code_reward(self)

    def to_dict(self) -> dict:
        return asdict(self)


def code_reward(result: SandboxResult) -> float:
    """The code task's reward: the fraction of test cases passed (0.0 when there are none)."""
    return result.passed / result.total if result.total else 0.0
