"""`run_code` and `run_batch`: one run end to end, and many in parallel.

A run validates its arguments and the tests (`suite.load_tests`), picks the isolation's
command line and limits (`isolation`), a random nonce and, as root, a uid of its own,
spawns and watches the harness (`process.execute`, `harness.HARNESS`), cleans up (the
uid's leftover processes and the host working directory in rlimits-only mode) and returns
the parent's verdict (`verdict.verdict`). When `run_code` returns, nothing of the run is
alive. `run_batch` runs `run_code` on a thread pool, one thread per run in flight, each
blocked on its own run (bwrap's --die-with-parent follows the spawning thread).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from reflectrl.sandbox.harness import HARNESS
from reflectrl.sandbox.isolation import (
    ISOLATION_MODES,
    bwrap_command,
    child_env,
    python_layout,
    rlimits,
    rlimits_only_command,
    uids,
)
from reflectrl.sandbox.process import execute, kill_uid
from reflectrl.sandbox.results import SandboxResult
from reflectrl.sandbox.suite import TestSuite, load_tests
from reflectrl.sandbox.verdict import verdict

__all__ = ["run_code", "run_batch"]


def run_code(code: str, tests: Mapping | TestSuite, *, timeout: float = 10.0, memory_mb: int = 512,
             max_processes: int = 32, max_file_mb: int = 16, tmpfs_mb: int = 64,
             max_output_bytes: int = 1 << 20, max_result_bytes: int = 16 << 20,
             isolation: str = "bwrap", python: str | None = None, extra_paths: Sequence[str] = (),
             hash_seed: int = 0) -> SandboxResult:
    """Run `code` against `tests` in a fresh sandbox and return the parent's verdict.

    tests: {"entry_point": "solve", "cases": [{"args": [...], "kwargs": {...}?, "expected": ...}]}
    (or a TestSuite from load_tests). timeout is wall-clock seconds for the whole run;
    memory_mb is RLIMIT_AS per process; max_processes is RLIMIT_NPROC (threads count);
    max_file_mb is RLIMIT_FSIZE; tmpfs_mb caps /tmp inside the sandbox; output past
    max_output_bytes (stdout+stderr) kills the run. isolation: "bwrap" (default; raises
    SandboxUnavailable when bwrap is missing or cannot run) or "rlimits-only" (weaker, see
    reflectrl.sandbox.isolation). python: the interpreter to run the code with (default: the
    base interpreter of this one); extra_paths: directories bound read-only and appended
    to the child's sys.path (e.g. a site-packages holding numpy).
    """
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not (timeout > 0):
        raise ValueError("timeout must be > 0")
    if memory_mb < 16 or max_processes < 2 or max_file_mb < 1 or tmpfs_mb < 1 or max_output_bytes < 1:
        raise ValueError("memory_mb >= 16, max_processes >= 2, max_file_mb >= 1, tmpfs_mb >= 1 and "
                         "max_output_bytes >= 1 are required")
    suite = load_tests(tests)
    extra = tuple(os.path.realpath(p) for p in extra_paths)
    for path in extra:
        if not os.path.isdir(path):
            raise ValueError(f"extra_paths: {path} is not a directory")
    layout = python_layout(python)
    root = os.geteuid() == 0
    nonce = secrets.token_hex(16)
    limits = rlimits(timeout, memory_mb, max_processes, max_file_mb)
    uid = uids.take() if root else None
    workdir = None
    try:
        payload = {"nonce": nonce, "code": code, "entry": suite.entry_point,
                   "cases": [(list(a), dict(k)) for a, k in zip(suite.args, suite.kwargs)],
                   "uid": uid, "gid": uid, "limits": limits, "paths": list(extra)}
        if isolation == "bwrap":
            argv = bwrap_command(layout, extra, root=root, tmpfs_mb=tmpfs_mb, hash_seed=hash_seed, program=HARNESS)
            env, cwd, info_fd = {}, "/", True
        else:
            argv = rlimits_only_command(layout, root=root, program=HARNESS)
            workdir = tempfile.mkdtemp(prefix="reflectrl-sandbox-")
            if root:
                os.chown(workdir, uid, uid)
            env, cwd, info_fd = child_env(workdir, hash_seed), workdir, False
        raw = execute(argv, payload, info_fd=info_fd, env=env, cwd=cwd, timeout=timeout,
                      max_output_bytes=max_output_bytes, max_result_bytes=max_result_bytes)
    finally:
        if uid is not None:
            # rlimits-only: the run's processes that left the group, daemons included. Under bwrap
            # the PID namespace dies with its init; the sweep is a second guarantee (one fork-bomb
            # test once found a child of the run alive after it, on a saturated machine).
            kill_uid(uid)
            uids.give(uid)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return verdict(raw, suite, nonce.encode(), isolation, timeout)


def run_batch(items: Iterable[tuple[str, Mapping | TestSuite]], max_workers: int | None = None,
              **kwargs) -> list[SandboxResult]:
    """run_code over (code, tests) pairs, up to max_workers at a time (default: the usable
    cores). Results come back in the order of `items`; kwargs go to every run_code call."""
    items = list(items)
    if not items:
        return []
    if max_workers is None:
        try:
            max_workers = len(os.sched_getaffinity(0))
        except AttributeError:
            max_workers = os.cpu_count() or 1
    max_workers = max(1, min(max_workers, len(items)))
    if max_workers == 1:
        return [run_code(code, tests, **kwargs) for code, tests in items]
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda item: run_code(item[0], item[1], **kwargs), items))
