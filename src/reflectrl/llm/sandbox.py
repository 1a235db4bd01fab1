"""Run untrusted, model-generated Python against unit tests, and score it.

    result = run_code(code, {"entry_point": "solve",
                             "cases": [{"args": [1, 2], "expected": 3}, ...]})
    result.status, result.passed, result.total   # "ok", 3, 3
    code_reward(result)                          # passed / total
    run_batch([(code, tests), ...])              # in parallel, one process per core

A policy under RL pressure finds any hole that pays, so the snippet is treated as hostile.

How a run works
---------------
One `bwrap` process and one Python process per run. The parent sends the child the
code, the entry point and the *arguments* of each case (never the expected values; the
tests file is never inside the sandbox) through a memfd on stdin. A small harness in the
child compiles the code, imports it, calls the entry point on each case's arguments and
writes one line per case to a private pipe: `<nonce> <i> ok <json>` or
`<nonce> <i> err <message>`, then `<nonce> end <n>`. The nonce is random per run.

The verdict is the parent's. It decodes every line with `json.loads` (NaN, Infinity and
anything malformed are rejected), checks the framing (nonce, case indices in order, one
end marker, nothing after it) and compares each decoded output with the expected value
with a type-aware `==` on plain JSON data (`True` is not `1`). Because the child never
sees the expected values, nothing it prints, patches or forges can turn a wrong answer
into a pass: the only way to make a case pass is to produce its expected output.
Outputs that do not serialise to JSON (objects whose `__eq__` says yes to everything,
generators, NaN) fail their case; a malformed or forged channel fails *every* case;
stdout/stderr are captured for diagnostics only and never read for the verdict.

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
"""

from __future__ import annotations

import functools
import json
import marshal
import math
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from reflectrl.errors import UserError

__all__ = [
    "STATUSES", "ISOLATION_MODES", "SandboxUnavailable", "InvalidTests", "CaseResult", "SandboxResult",
    "TestSuite", "load_tests", "run_code", "run_batch", "code_reward", "bwrap_available",
]

STATUSES = ("ok", "failed", "timeout", "memory", "crashed", "syntax_error", "killed")
ISOLATION_MODES = ("bwrap", "rlimits-only")

_INSTALL_HINT = ("install it with `apt-get install bubblewrap` (or run scripts/install_system_deps.sh), "
                 "or opt into the weaker rlimits-only mode (isolation='rlimits-only', CLI --unsafe-no-bwrap) "
                 "which has no filesystem, network or process isolation")


class SandboxUnavailable(UserError, RuntimeError):
    """The requested isolation cannot be set up here (e.g. bwrap is missing)."""


class InvalidTests(UserError, ValueError):
    """The tests are not of the form {"entry_point": str, "cases": [{"args": [...], "expected": ...}]}."""


# --------------------------------------------------------------------------- results


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


# --------------------------------------------------------------------------- tests


@dataclass(frozen=True)
class TestSuite:
    __test__ = False  # not a pytest class

    entry_point: str
    args: tuple          # per case: list of positional args (plain JSON data)
    kwargs: tuple        # per case: dict of keyword args
    expected: tuple      # per case: plain JSON data

    def __len__(self) -> int:
        return len(self.expected)


def _plain(value, what: str):
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidTests(f"{what} is not plain JSON data ({err})") from None


def load_tests(tests: Mapping | TestSuite, *, source: str = "tests") -> TestSuite:
    """Validate `{"entry_point": "solve", "cases": [{"args": [...], "kwargs": {...}?, "expected": ...}]}`.

    Raises InvalidTests (a UserError: the CLI shows it as one line) naming what is wrong.
    """
    if isinstance(tests, TestSuite):
        return tests
    if not isinstance(tests, Mapping):
        raise InvalidTests(f"{source} must be a JSON object with 'entry_point' and 'cases', got {type(tests).__name__}")
    if "entry_point" not in tests:
        raise InvalidTests(f"{source} has no 'entry_point' (the name of the function to call, e.g. \"solve\")")
    entry = tests["entry_point"]
    if not isinstance(entry, str) or not entry.isidentifier():
        raise InvalidTests(f"{source}: 'entry_point' must be a Python identifier, got {entry!r}")
    if "cases" not in tests:
        raise InvalidTests(f"{source} has no 'cases' (a list of {{\"args\": [...], \"expected\": ...}})")
    cases = tests["cases"]
    if not isinstance(cases, (list, tuple)):
        raise InvalidTests(f"{source}: 'cases' must be a list, got {type(cases).__name__}")
    args, kwargs, expected = [], [], []
    for i, case in enumerate(cases):
        where = f"{source}: case {i}"
        if not isinstance(case, Mapping):
            raise InvalidTests(f"{where} must be an object with 'args' and 'expected'")
        unknown = set(case) - {"args", "kwargs", "expected"}
        if unknown:
            raise InvalidTests(f"{where} has unknown key(s) {sorted(unknown)}; allowed: args, kwargs, expected")
        if "expected" not in case:
            raise InvalidTests(f"{where} has no 'expected'")
        a = case.get("args", [])
        if not isinstance(a, (list, tuple)):
            raise InvalidTests(f"{where}: 'args' must be a list, got {type(a).__name__}")
        k = case.get("kwargs", {})
        if not isinstance(k, Mapping) or not all(isinstance(key, str) and key.isidentifier() for key in k):
            raise InvalidTests(f"{where}: 'kwargs' must be an object whose keys are identifiers")
        args.append(_plain(list(a), f"{where} args"))
        kwargs.append(_plain(dict(k), f"{where} kwargs"))
        expected.append(_plain(case["expected"], f"{where} expected"))
    return TestSuite(entry, tuple(args), tuple(kwargs), tuple(expected))


def _same(got, want) -> bool:
    """== on plain JSON data, but bool is not a number and a list is not a dict."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and got == want
    if type(got) is not type(want):
        return False
    if isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return got == want  # str, None


# --------------------------------------------------------------------------- the child's harness


# Runs as `python -S -B -c _HARNESS`. Imports only built-in modules (marshal, posix, _json)
# and resource, so start-up stays near bare-interpreter cost. Everything it needs after
# the snippet is imported is bound to locals first; tampering with it can only garble or
# drop the outputs, which the parent then fails.
_HARNESS = r"""
import sys, posix, marshal, resource, _json
def _h():
    rd, wr, ex, BE, cal, ty, st = posix.read, posix.write, posix._exit, BaseException, callable, type, str
    esc, mk, out, err = _json.encode_basestring_ascii, _json.make_encoder, sys.stdout, sys.stderr
    buf = []
    while True:
        b = rd(0, 1048576)
        if not b:
            break
        buf.append(b)
    p = marshal.loads(b"".join(buf))
    del buf
    n = posix.open("/dev/null", posix.O_RDWR)
    posix.dup2(n, 0)
    posix.close(n)
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    sys.path.extend(p["paths"])
    if p["uid"] is not None:
        posix.setgroups([])
        posix.setresgid(p["gid"], p["gid"], p["gid"])
        posix.setresuid(p["uid"], p["uid"], p["uid"])
    for r, soft, hard in p["limits"]:
        resource.setrlimit(r, (soft, hard))
    fd, nonce, entry, cases, src = p["fd"], p["nonce"].encode(), p["entry"], p["cases"], p["code"]
    del p
    def emit(line):
        while line:
            line = line[wr(fd, line):]
    def say(e):
        try:
            s = ty(e).__name__ + ": " + st(e)
        except BE:
            s = "unprintable exception"
        return esc(s[:2000]).encode()
    def no_json(o):
        raise TypeError("output of type %s is not JSON-serialisable" % ty(o).__name__)
    def done():
        try:
            out.flush()
            err.flush()
        except BE:
            pass
        ex(0)
    try:
        code = compile(src, "solution.py", "exec", dont_inherit=True)
    except BE as e:
        emit(nonce + b" syntax " + say(e) + b"\n")
        done()
    del src
    ns = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, ns)
        fn = ns.get(entry)
        if fn is None:
            raise NameError("the code defines no %r" % entry)
        if not cal(fn):
            raise TypeError("%r is not callable" % entry)
    except BE as e:
        emit(nonce + b" load " + say(e) + b"\n")
        done()
    i = 0
    for a, k in cases:
        try:
            r = fn(*a, **k)
            line = nonce + b" %d ok " % i + "".join(mk({}, no_json, esc, None, ":", ",", False, False, False)(r, 0)).encode() + b"\n"
        except BE as e:
            line = nonce + b" %d err " % i + say(e) + b"\n"
        emit(line)
        i += 1
    emit(nonce + b" end %d\n" % i)
    done()
_h()
"""

_KEEP_BYTES = 8192        # stdout head / stderr tail kept in the result
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class _Python:
    exe: str                 # real path of the interpreter binary
    binds: tuple             # prefixes to bind read-only (not already under /usr)
    readable_by_others: bool  # can an unprivileged uid read its stdlib (for rlimits-only as root)


_layout_cache: dict = {}
_probe_cache: dict = {}
_cache_lock = threading.Lock()


def _python_layout(python: str | None) -> _Python:
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
    layout = _Python(exe, tuple(dirs), readable)
    with _cache_lock:
        _layout_cache[key] = layout
    return layout


def bwrap_available() -> bool:
    """Is bubblewrap installed (on PATH or in /usr/bin)?"""
    return _bwrap_path() is not None


def _bwrap_path() -> str | None:
    return shutil.which("bwrap") or (os.path.exists("/usr/bin/bwrap") and "/usr/bin/bwrap") or None


class _UidPool:
    """A uid per concurrent run (when root), so RLIMIT_NPROC and the final kill are per run."""

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


_uids = _UidPool()


@functools.lru_cache(maxsize=64)
def _bwrap_argv(bwrap: str, layout: _Python, extra_paths: tuple, root: bool, tmpfs_bytes: int) -> tuple:
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


def _child_env(home: str, hash_seed: int) -> dict:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TZ": "UTC",
            "PYTHONHASHSEED": str(hash_seed)}


def _probe_bwrap(argv_prefix: tuple, layout: _Python) -> None:
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


# --------------------------------------------------------------------------- running


@dataclass
class _Raw:
    channel: bytes
    stdout: bytes
    stderr: bytes
    returncode: int
    timed_out: bool
    killed_reason: str   # why the parent killed it early ('' if it did not)
    duration_s: float


def _memfd(data: bytes) -> int:
    try:
        fd = os.memfd_create("reflectrl-sandbox", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        f = tempfile.TemporaryFile()
        fd = os.dup(f.fileno())
        f.close()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is `uid` (a uid used by this run only)."""
    for _ in range(50):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid:
                                found = True
                                os.kill(int(entry), signal.SIGKILL)
                            break
            except (OSError, ValueError):
                continue
        if not found:
            return
        time.sleep(0.01)


def _execute(argv: list[str], payload: dict, *, info_fd: bool, env: dict, cwd: str | None, timeout: float,
             max_output_bytes: int, max_result_bytes: int) -> _Raw:
    """Spawn argv (+ `--info-fd N` before its `--` when info_fd, for bwrap), feed it the payload
    and collect its pipes until it exits, the deadline passes or an output cap is hit."""
    r_fd, w_fd = os.pipe()  # the result channel; the child finds it at the same fd number
    info_r, info_w = os.pipe() if info_fd else (-1, -1)
    keep = (w_fd, info_w) if info_fd else (w_fd,)
    if info_fd:
        split = argv.index("--")
        argv = [*argv[:split], "--info-fd", str(info_w), *argv[split:]]
    stdin_fd = -1
    try:
        stdin_fd = _memfd(marshal.dumps({**payload, "fd": w_fd}, 4))
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=keep, env=env, cwd=cwd, start_new_session=True)
    except BaseException:
        os.close(r_fd)
        if info_r >= 0:
            os.close(info_r)
        raise
    finally:
        for fd in (*keep, stdin_fd):
            if fd >= 0:
                os.close(fd)
    try:
        return _collect(proc, r_fd, info_r, t0, timeout, max_output_bytes, max_result_bytes)
    except BaseException:  # e.g. KeyboardInterrupt: leave nothing running
        _kill_sandbox(proc, info_r)
        _killpg(proc.pid)
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
        os.close(r_fd)
        if info_r >= 0:
            os.close(info_r)


def _kill_sandbox(proc: subprocess.Popen, info_r: int) -> None:
    """Kill a run. Under bwrap, SIGKILL the PID namespace's init (its host pid comes from
    bwrap's --info-fd): the kernel kills every process in the namespace before that init can
    be reaped, so once bwrap has exited nothing of the run is left. Otherwise, or if the
    pid is not known yet, SIGKILL the process group."""
    init_pid = None
    if info_r >= 0:
        try:
            os.set_blocking(info_r, False)
            init_pid = int(json.loads(os.read(info_r, 65536))["child-pid"])
        except (OSError, ValueError, KeyError, TypeError):
            init_pid = None
    if init_pid and init_pid > 1:
        try:
            os.kill(init_pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            pass
    _killpg(proc.pid)


def _collect(proc: subprocess.Popen, r_fd: int, info_r: int, t0: float, timeout: float, max_output_bytes: int,
             max_result_bytes: int) -> _Raw:
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict = {out_fd: [], err_fd: [], r_fd: []}
    sizes = {out_fd: 0, err_fd: 0, r_fd: 0}
    err_tail = bytearray()
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    open_fds = set(chunks)
    deadline = t0 + timeout
    timed_out, killed_reason, exited_at = False, "", None

    def take(fd: int, data: bytes) -> str:
        sizes[fd] += len(data)
        if fd == err_fd:
            err_tail.extend(data)
            del err_tail[:-_KEEP_BYTES]
        elif fd == out_fd:
            if sizes[fd] - len(data) < _KEEP_BYTES:
                chunks[fd].append(data)
        else:
            chunks[fd].append(data)
            if sizes[fd] > max_result_bytes:
                return f"the result channel passed {max_result_bytes} bytes"
        if sizes[out_fd] + sizes[err_fd] > max_output_bytes:
            return f"stdout+stderr passed {max_output_bytes} bytes"
        return ""

    def exited() -> bool:  # without reaping it, so its process group id stays ours
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    # A pidfd polls readable when the process exits: no sleeping or periodic checks on the
    # hot path. Without one (old kernels) fall back to checking every few milliseconds.
    try:
        pidfd = os.pidfd_open(proc.pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = None
    done = False
    try:
        while not killed_reason and (open_fds or not done):
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            wait = deadline - now
            if done:
                # the main process is gone; anything still holding a pipe gets a short grace
                exited_at = exited_at or now
                if now - exited_at > 0.1:
                    break
                wait = min(wait, 0.02)
            elif pidfd is None:
                wait = min(wait, 0.25 if open_fds else 0.002)
            for fd, _ in poller.poll(wait * 1000):
                if fd == pidfd:
                    done = True
                    poller.unregister(pidfd)
                    continue
                if fd not in open_fds:
                    continue
                data = os.read(fd, 65536)
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                killed_reason = take(fd, data)
                if killed_reason:
                    break
            if pidfd is None and not done:
                done = exited()
    finally:
        if pidfd is not None:
            os.close(pidfd)

    if timed_out or killed_reason:
        _kill_sandbox(proc, info_r)
        give_up = time.monotonic() + 5.0
        while not exited() and time.monotonic() < give_up:
            time.sleep(0.001)
        _killpg(proc.pid)
    while not exited():
        time.sleep(0.001)
    _killpg(proc.pid)  # anything left in its group, before reaping it so the group id cannot be reused
    returncode = proc.wait()
    duration = time.monotonic() - t0
    # read what is left in the pipes without blocking (a writer may survive in rlimits-only mode)
    for fd in list(open_fds):
        os.set_blocking(fd, False)
        try:
            while not killed_reason:
                data = os.read(fd, 65536)
                if not data:
                    break
                killed_reason = take(fd, data)
        except BlockingIOError:
            pass
    return _Raw(b"".join(chunks[r_fd]), b"".join(chunks[out_fd])[:_KEEP_BYTES], bytes(err_tail), returncode,
                timed_out, killed_reason, duration)


def _strict_constant(name):
    raise ValueError(f"{name} is not allowed")


def _parse_channel(data: bytes, nonce: bytes, total: int, cut_short: bool):
    """Decode the child's result lines. Returns (kind, payload): kind is 'cases' (payload: a list of
    ('ok', value) / ('err', message), complete flag), 'syntax' / 'load' (payload: message), or
    'malformed' (payload: why)."""
    lines = data.split(b"\n")
    if lines[-1]:
        if not cut_short:
            return "malformed", "a result line without its newline"
    lines.pop()
    prefix = nonce + b" "
    records: list = []
    ended = False

    def decode(raw: bytes):
        return json.loads(raw, parse_constant=_strict_constant)

    for n, line in enumerate(lines):
        if ended:
            return "malformed", "result lines after the end marker"
        if not line.startswith(prefix):
            return "malformed", "a result line without this run's nonce"
        parts = line[len(prefix):].split(b" ", 2)
        try:
            if parts[0] in (b"syntax", b"load") and len(parts) >= 2:
                if n != 0 or len(lines) != 1:
                    return "malformed", f"a '{parts[0].decode()}' record that is not the only one"
                msg = decode(b" ".join(parts[1:]))
                if not isinstance(msg, str):
                    return "malformed", "a non-string error message"
                return parts[0].decode(), msg
            if parts[0] == b"end" and len(parts) == 2:
                if int(parts[1]) != len(records) or len(records) != total:
                    return "malformed", "an end marker with the wrong case count"
                ended = True
                continue
            if len(parts) != 3 or int(parts[0]) != len(records) or len(records) >= total \
                    or parts[1] not in (b"ok", b"err") or not parts[0].isdigit():
                return "malformed", "a result line out of order or badly framed"
            value = decode(parts[2])
            if parts[1] == b"err" and not isinstance(value, str):
                return "malformed", "a non-string error message"
            records.append(("ok", value) if parts[1] == b"ok" else ("err", value[:2000]))
        except (ValueError, RecursionError, UnicodeDecodeError, MemoryError):
            return "malformed", "a result line that is not valid JSON"
    return "cases", (records, ended)


_SIGNAL_STATUS = {signal.SIGXCPU: ("timeout", "CPU time limit (SIGXCPU)"),
                  signal.SIGXFSZ: ("killed", "file size limit (SIGXFSZ)"),
                  signal.SIGKILL: ("killed", "killed by SIGKILL (out of memory, or the snippet killed itself)")}


def _verdict(raw: _Raw, suite: TestSuite, nonce: bytes, isolation: str, timeout: float) -> SandboxResult:
    total = len(suite)
    rc = raw.returncode
    sig = None
    if rc < 0:
        sig = -rc
    elif isolation == "bwrap" and rc > 128 and not raw.timed_out:
        sig = rc - 128
    cut_short = raw.timed_out or bool(raw.killed_reason) or sig is not None or rc != 0
    kind, payload = _parse_channel(raw.channel, nonce, total, cut_short)
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
                    ok = _same(value, suite.expected[i])
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
    the module docstring). python: the interpreter to run the code with (default: the
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
    layout = _python_layout(python)
    root = os.geteuid() == 0
    nonce = secrets.token_hex(16)
    cpu = max(1, math.ceil(timeout)) + 1
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory_mb << 20, memory_mb << 20),
        (resource.RLIMIT_NPROC, max_processes, max_processes),
        (resource.RLIMIT_FSIZE, max_file_mb << 20, max_file_mb << 20),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    uid = _uids.take() if root else None
    workdir = None
    try:
        payload = {"nonce": nonce, "code": code, "entry": suite.entry_point,
                   "cases": [(list(a), dict(k)) for a, k in zip(suite.args, suite.kwargs)],
                   "uid": uid, "gid": uid, "limits": limits, "paths": list(extra)}
        if isolation == "bwrap":
            bwrap = _bwrap_path()
            if bwrap is None:
                raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {_INSTALL_HINT}")
            prefix = _bwrap_argv(bwrap, layout, extra, root, tmpfs_mb << 20)
            _probe_bwrap(prefix, layout)
            argv = list(prefix)
            for k, v in _child_env("/tmp/work", hash_seed).items():
                argv += ["--setenv", k, v]
            argv += ["--", layout.exe, "-S", "-B", "-c", _HARNESS]
            env, cwd, info_fd = {}, "/", True
        else:
            if root and not layout.readable_by_others:
                raise SandboxUnavailable(
                    f"rlimits-only mode as root drops to an unprivileged uid, which cannot read the "
                    f"interpreter at {layout.exe} (a parent directory is not world-readable); pass "
                    f"python='/usr/bin/python3' (CLI --python) or install bubblewrap and use the default mode")
            workdir = tempfile.mkdtemp(prefix="reflectrl-sandbox-")
            if root:
                os.chown(workdir, uid, uid)
            argv = [layout.exe, "-S", "-B", "-c", _HARNESS]
            env, cwd, info_fd = _child_env(workdir, hash_seed), workdir, False
        raw = _execute(argv, payload, info_fd=info_fd, env=env, cwd=cwd, timeout=timeout,
                       max_output_bytes=max_output_bytes, max_result_bytes=max_result_bytes)
    finally:
        if uid is not None:
            if isolation != "bwrap":
                _kill_uid(uid)
            _uids.give(uid)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return _verdict(raw, suite, nonce.encode(), isolation, timeout)


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
