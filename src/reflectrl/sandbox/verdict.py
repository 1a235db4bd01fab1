"""The verdict: turn what a run left behind (`process.Raw`) into a `SandboxResult`.

The verdict is the parent's. The result channel is decoded and its framing checked by
`harness.parse_channel`; each decoded output is compared with the expected value, which
the child never saw, by `same`: `==` on plain JSON data except that a bool only equals a
bool (`1` does not pass for `True`, `True` not for `1`) and a list never equals a dict;
`2` passes for `2.0`; there is no float tolerance. So nothing the snippet prints, patches
or forges can turn a wrong answer into a pass: outputs that do not serialise (objects
whose `__eq__` says yes to everything, generators, NaN) fail their case, a malformed or
forged channel fails *every* case, and stdout/stderr never count towards a pass.

The status (see `results.STATUSES`): `syntax_error` when the code does not compile; an
import failure is `memory` (MemoryError) or `crashed`, a malformed channel `crashed`, except
that a wall-clock timeout (`timeout`) or a parent-side kill (`killed`: output or channel
cap) takes precedence over `crashed`; otherwise, in order: timeout, kill, a signal
(SIGXCPU `timeout`, SIGXFSZ `killed`, SIGKILL `killed`, or `memory` after a MemoryError),
a non-zero exit (`memory` when stderr mentions MemoryError, else `crashed`), a missing
end marker (an early exit: `crashed`), then `ok`, `memory` (a case raised MemoryError) or
`failed`. Cases reported before a timeout or kill still count.
"""

from __future__ import annotations

import signal

from reflectrl.sandbox.harness import parse_channel
from reflectrl.sandbox.process import Raw
from reflectrl.sandbox.results import CaseResult, SandboxResult
from reflectrl.sandbox.suite import TestSuite

__all__ = ["same", "verdict"]

def same(got, want) -> bool:
    """== on plain JSON data, but bool is not a number and a list is not a dict."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and got == want
    if type(got) is not type(want):
        return False
    if isinstance(want, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return got == want  # str, None



_SIGNAL_STATUS = {signal.SIGXCPU: ("timeout", "CPU time limit (SIGXCPU)"),
                  signal.SIGXFSZ: ("killed", "file size limit (SIGXFSZ)"),
                  signal.SIGKILL: ("killed", "killed by SIGKILL (out of memory, or the snippet killed itself)")}


def verdict(raw: Raw, suite: TestSuite, nonce: bytes, isolation: str, timeout: float) -> SandboxResult:
    """The parent's verdict on one run of `suite` (nonce: the run's, as bytes)."""
    total = len(suite)
    rc = raw.returncode
    sig = None
    if rc < 0:
        sig = -rc
    elif isolation == "bwrap" and rc > 128 and not raw.timed_out:
        sig = rc - 128
    cut_short = raw.timed_out or bool(raw.killed_reason) or sig is not None or rc != 0
    kind, payload = parse_channel(raw.channel, nonce, total, cut_short)
    cases = [CaseResult(i, False, None, "not run") for i in range(total)]
    ended = False
    status, reason = None, ""
    if kind == "syntax":
        status, reason = "syntax_error", payload
    elif kind == "load":
        status = "memory" if payload.startswith("MemoryError") else "crashed"
        reason = f"importing the code failed: {payload}"
        for c in cases:
            c.error = "not run: the code failed to import"
    elif kind == "malformed":
        status, reason = "crashed", f"malformed result channel ({payload}); every case counts as failed"
        for c in cases:
            c.error = "malformed result channel"
    else:
        records, ended = payload
        for i, (what, value) in enumerate(records):
            if what == "ok":
                try:
                    ok = same(value, suite.expected[i])
                except RecursionError:
                    ok = False
                cases[i] = CaseResult(i, ok, value, None if ok else "wrong output")
            else:
                cases[i] = CaseResult(i, False, None, value)
    passed = sum(c.passed for c in cases)
    memory_error = any((c.error or "").startswith("MemoryError") for c in cases)

    if status is None or status == "crashed":
        if raw.timed_out:
            status, reason = "timeout", f"wall-clock timeout after {timeout:g}s" + (f"; {reason}" if reason else "")
        elif raw.killed_reason:
            status, reason = "killed", raw.killed_reason + (f"; {reason}" if reason else "")
        elif status is None and sig is not None:
            status, reason = _SIGNAL_STATUS.get(sig, ("crashed", f"killed by signal {sig}"))
            if status == "killed" and sig == signal.SIGKILL and memory_error:
                status = "memory"
        elif status is None and rc != 0:
            status = "memory" if b"MemoryError" in raw.stderr else "crashed"
            reason = f"exited with code {rc} before finishing"
        elif status is None and not ended:
            status, reason = "crashed", "exited before reporting every case (early exit?)"
        elif status is None:
            if passed == total:
                status, reason = "ok", "all cases passed" if total else "ran cleanly; there are no cases"
            elif memory_error:
                status, reason = "memory", "a case ran out of memory"
            else:
                status, reason = "failed", f"{total - passed} of {total} cases failed"
    if status == "syntax_error":
        passed = 0
        for c in cases:
            c.error = "not run: syntax error"
    return SandboxResult(
        passed=passed, total=total, status=status, duration_s=round(raw.duration_s, 6), cases=cases,
        reason=reason, stdout=raw.stdout.decode("utf-8", "replace"),
        stderr_tail=raw.stderr.decode("utf-8", "replace"), exit_code=rc, isolation=isolation)
