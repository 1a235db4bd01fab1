"""Isolation: the bubblewrap command line, the rlimits, the child's environment, the
interpreter's layout and the per-run uids. This module builds what a run is confined
by; starting and watching the process is `reflectrl.sandbox.process`.

What is contained (isolation="bwrap", the default)
--------------------------------------------------
* Filesystem: a fresh root holding only read-only binds of /usr (and the /bin, /lib...
  symlinks or dirs), /etc/ld.so.cache and the interpreter's prefix; a private /proc and a
  minimal /dev; /tmp is a private, size-capped tmpfs and the working directory is
  /tmp/work inside it, gone when the run ends. Nothing of the host's /home, /root, /work,
  /etc or /tmp is visible; writing or deleting outside the tmpfs fails.
* Network: a new network namespace with only its own loopback: no outbound connections,
  no DNS, no reaching services on the host's 127.0.0.1.
* Processes: a new PID namespace (the run sees only its own processes), a new session,
  IPC and UTS namespaces, `--die-with-parent`; when the snippet's main process exits or
  the run is killed, the kernel kills everything left in the namespace, daemons that
  double-forked and called setsid included.
* Identity: an unprivileged uid with no capabilities and no_new_privs (nosuid mounts).
  As root, bwrap runs privileged and the harness drops to a fresh uid picked per run
  (so RLIMIT_NPROC, which counts per real uid, limits exactly this run); as a normal
  user, bwrap maps the sandbox to uid 65534 inside a new user namespace.
* Limits (setrlimit, set by the harness before any of the snippet runs): CPU seconds,
  address space (RLIMIT_AS), processes/threads (RLIMIT_NPROC), file size (RLIMIT_FSIZE),
  open files, no core dumps; plus a wall-clock timeout, a cap on stdout+stderr (the run is
  killed past it) and a cap on the result channel, enforced by the parent.
* Environment: cleared; the child gets PATH, HOME, LANG, TZ and PYTHONHASHSEED only.

What is not contained
---------------------
* Kernel bugs: there is no seccomp filter, so the snippet can make any syscall its
  uid and namespaces allow; a kernel exploit escapes the sandbox.
* Memory is limited per process (RLIMIT_AS), not per run: a run can use up to about
  max_processes x memory_mb plus its tmpfs. No cgroup is used.
* CPU is limited per process by RLIMIT_CPU and per run by the wall clock, not by a quota.
* Everything under /usr and the interpreter's prefix is readable (read-only).
* The snippet can read its own arguments (it must) and can tamper with the harness in
  its own process; that can only produce wrong or missing outputs, never a pass.

isolation="rlimits-only" (CLI `--unsafe-no-bwrap`) is the weaker mode for machines
without bubblewrap: the same harness, rlimits, scrubbed environment, temporary working
directory (on the host, removed afterwards) and parent-side verdict, but NO filesystem,
network or PID isolation: the snippet can read whatever its uid can read (including a
world-readable tests file), open network connections and see other processes. As root
it still drops to a fresh uid per run and every process of that uid is killed at the
end; as a normal user it runs as you, and a daemon that calls setsid can outlive the run.
Use it only for code you would run anyway.

Where bwrap is missing or cannot create namespaces, the default mode raises
`SandboxUnavailable`; it never falls back to an unconfined run.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from reflectrl.errors import UserError

__all__ = [
    "ISOLATION_MODES", "SandboxUnavailable", "PythonLayout", "python_layout", "bwrap_available", "uids",
    "rlimits", "child_env", "bwrap_command", "rlimits_only_command",
]

ISOLATION_MODES = ("bwrap", "rlimits-only")

_INSTALL_HINT = ("install it with `apt-get install bubblewrap` (or run scripts/install_system_deps.sh), "
                 "or opt into the weaker rlimits-only mode (isolation='rlimits-only', CLI --unsafe-no-bwrap) "
                 "which has no filesystem, network or process isolation")


class SandboxUnavailable(UserError, RuntimeError):
    """The requested isolation cannot be set up here (e.g. bwrap is missing)."""


_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class PythonLayout:
    exe: str                 # real path of the interpreter binary
    binds: tuple             # prefixes to bind read-only (not already under /usr)
    readable_by_others: bool  # can an unprivileged uid read its stdlib (for rlimits-only as root)


_layout_cache: dict = {}
_probe_cache: dict = {}
_cache_lock = threading.Lock()


def python_layout(python: str | None) -> PythonLayout:
    """Where the interpreter `python` (default: the base interpreter of this one) lives: its
    binary, the prefixes bwrap must bind, and whether a dropped uid can read it. Cached."""
    key = python
    with _cache_lock:
        if key in _layout_cache:
            return _layout_cache[key]
    if python is None:
        exe = getattr(sys, "_base_executable", None) or sys.executable
        prefixes = [sys.base_prefix, sys.base_exec_prefix]
        stdlib = os.path.dirname(os.__file__)
    else:
        found = shutil.which(python)
        if not found:
            raise SandboxUnavailable(f"python interpreter {python!r} not found")
        probe = subprocess.run(
            [found, "-S", "-c", "import sys, os; print(sys.executable); print(sys.base_prefix); "
             "print(sys.base_exec_prefix); print(os.path.dirname(os.__file__))"],
            capture_output=True, text=True, timeout=60, env={})
        if probe.returncode != 0:
            raise SandboxUnavailable(f"python interpreter {python!r} does not run: {probe.stderr.strip()[-300:]}")
        exe, *prefixes, stdlib = probe.stdout.split("\n")[:4]
    exe = os.path.realpath(exe)
    dirs = []
    for d in [*prefixes, os.path.dirname(os.path.dirname(exe))]:
        d = os.path.realpath(d)
        if d in ("/", "/usr") or d.startswith("/usr/") or any(d == x or d.startswith(x + "/") for x in dirs):
            continue
        dirs = [x for x in dirs if not x.startswith(d + "/")] + [d]
    readable = True
    path = os.path.realpath(stdlib)
    while path != "/":
        try:
            if not (os.stat(path).st_mode & 0o005) == 0o005:
                readable = False
                break
        except OSError:
            readable = False
            break
        path = os.path.dirname(path)
    layout = PythonLayout(exe, tuple(dirs), readable)
    with _cache_lock:
        _layout_cache[key] = layout
    return layout


def bwrap_available() -> bool:
    """Is bubblewrap installed (on PATH or in /usr/bin)?"""
    return _bwrap_path() is not None


def _bwrap_path() -> str | None:
    return shutil.which("bwrap") or (os.path.exists("/usr/bin/bwrap") and "/usr/bin/bwrap") or None


class UidPool:
    """A uid per concurrent run (when root), so RLIMIT_NPROC and the final kill are per run.
    The harness drops to it with setresuid; take() before the run, give() after it."""

    def __init__(self, size: int = 4096):
        self._base = 1_000_000_000 + (os.getpid() % 600_000) * size
        self._free = list(range(size - 1, -1, -1))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError("more than 4096 concurrent sandbox runs in one process")
            return self._base + self._free.pop()

    def give(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid - self._base)


uids = UidPool()


@functools.lru_cache(maxsize=64)
def _bwrap_argv(bwrap: str, layout: PythonLayout, extra_paths: tuple, root: bool, tmpfs_bytes: int) -> tuple:
    argv = [bwrap]
    if root:
        # Privileged bwrap, no user namespace: the harness drops to a fresh real uid itself.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    made, bound = set(), ["/usr"]
    for d in (*layout.binds, *extra_paths):
        if any(d == x or d.startswith(x + "/") for x in bound):
            continue  # already visible
        bound.append(d)
        # bwrap would create missing parents 0700 (unreadable by the dropped uid): make them 0755
        parents = []
        up = os.path.dirname(d)
        while up not in ("/", "") and up not in made:
            parents.append(up)
            up = os.path.dirname(up)
        for parent in reversed(parents):
            if any(parent == x or parent.startswith(x + "/") for x in bound) or parent in ("/tmp", "/proc", "/dev"):
                continue
            made.add(parent)
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(tmpfs_bytes), "--perms", "1777", "--tmpfs", "/tmp",
             "--perms", "0777", "--dir", "/tmp/work", "--chdir", "/tmp/work", "--clearenv"]
    return tuple(argv)


def child_env(home: str, hash_seed: int) -> dict:
    """The child's whole environment (everything else is cleared)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TZ": "UTC",
            "PYTHONHASHSEED": str(hash_seed)}


def _probe_bwrap(argv_prefix: tuple, layout: PythonLayout) -> None:
    key = tuple(argv_prefix)
    with _cache_lock:
        if key in _probe_cache:
            return
    try:
        proc = subprocess.run([*argv_prefix, "--", layout.exe, "-S", "-B", "-c", "pass"],
                              capture_output=True, text=True, timeout=60, env={})
        ok, why = proc.returncode == 0, (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired) as err:
        ok, why = False, str(err)
    if not ok:
        raise SandboxUnavailable(
            f"bwrap is installed but cannot create a sandbox here ({why}); it needs user namespaces "
            "(or root). Enable them (e.g. sysctl kernel.unprivileged_userns_clone=1, or allow bwrap in "
            "AppArmor), run as root, or opt into isolation='rlimits-only' / --unsafe-no-bwrap (no "
            "filesystem, network or process isolation)")
    with _cache_lock:
        _probe_cache[key] = True



def rlimits(timeout: float, memory_mb: int, max_processes: int, max_file_mb: int) -> list:
    """The (resource, soft, hard) limits the harness sets before any of the snippet runs:
    RLIMIT_CPU (timeout rounded up, + 1 s; hard one more), RLIMIT_AS, RLIMIT_NPROC (threads
    count), RLIMIT_FSIZE, RLIMIT_NOFILE 256 and no core dumps."""
    cpu = max(1, math.ceil(timeout)) + 1
    return [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory_mb << 20, memory_mb << 20),
        (resource.RLIMIT_NPROC, max_processes, max_processes),
        (resource.RLIMIT_FSIZE, max_file_mb << 20, max_file_mb << 20),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def bwrap_command(layout: PythonLayout, extra_paths: Sequence[str], *, root: bool, tmpfs_mb: int, hash_seed: int,
                  program: str) -> list[str]:
    """argv running `python -S -B -c program` under bwrap (isolation="bwrap"). Raises
    SandboxUnavailable when bwrap is missing or cannot create a sandbox here (probed once
    per distinct command prefix). `--info-fd` is added by the process control."""
    bwrap = _bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {_INSTALL_HINT}")
    prefix = _bwrap_argv(bwrap, layout, tuple(extra_paths), root, tmpfs_mb << 20)
    _probe_bwrap(prefix, layout)
    argv = list(prefix)
    for k, v in child_env("/tmp/work", hash_seed).items():
        argv += ["--setenv", k, v]
    return argv + ["--", layout.exe, "-S", "-B", "-c", program]


def rlimits_only_command(layout: PythonLayout, *, root: bool, program: str) -> list[str]:
    """argv running `python -S -B -c program` directly (isolation="rlimits-only": no
    namespaces; the caller passes child_env(workdir, ...) as the environment). As root the
    harness drops to a uid of its own, which must be able to read the interpreter; raises
    SandboxUnavailable when it cannot."""
    if root and not layout.readable_by_others:
        raise SandboxUnavailable(
            f"rlimits-only mode as root drops to an unprivileged uid, which cannot read the "
            f"interpreter at {layout.exe} (a parent directory is not world-readable); pass "
            f"python='/usr/bin/python3' (CLI --python) or install bubblewrap and use the default mode")
    return [layout.exe, "-S", "-B", "-c", program]
