"""Alias of `reflectrl.sandbox`, kept so that older imports keep working.

The code sandbox is not LLM-specific; it lives in the package `reflectrl.sandbox` (the
module docstrings there say what each part does and what is and is not contained). This
module re-exports its public names (`run_code`, `run_batch`, `code_reward`, `load_tests`,
`bwrap_available`, the result, suite and error types, `STATUSES`, `ISOLATION_MODES`) and
the two private helpers used outside it (`_python_layout`, `_bwrap_path`). They are the
same objects, so `isinstance` and `except` work across both paths; but monkeypatching a
name *here* does not change the sandbox: patch it where it is defined (e.g.
`reflectrl.sandbox.isolation._bwrap_path`). New code should import `reflectrl.sandbox`.
"""

from __future__ import annotations

from reflectrl.sandbox import (  # noqa: F401
    ISOLATION_MODES,
    STATUSES,
    CaseResult,
    InvalidTests,
    SandboxResult,
    SandboxUnavailable,
    TestSuite,
    bwrap_available,
    code_reward,
    load_tests,
    run_batch,
    run_code,
)
from reflectrl.sandbox.isolation import _bwrap_path  # noqa: F401
from reflectrl.sandbox.isolation import python_layout as _python_layout  # noqa: F401

__all__ = [
    "STATUSES", "ISOLATION_MODES", "SandboxUnavailable", "InvalidTests", "CaseResult", "SandboxResult",
    "TestSuite", "load_tests", "run_code", "run_batch", "code_reward", "bwrap_available",
]
