"""Process control: spawn one run, feed it its payload, watch its pipes, enforce the wall
clock and the output caps, kill it, and hand back the raw bytes (`Raw`).

`execute(argv, payload, ...)` writes the payload (marshal) to a memfd that becomes the
child's stdin, opens the private result pipe (the child finds its write end at the same
fd number, named in the payload) and, under bwrap, an `--info-fd` pipe from which it
learns the host pid of the PID namespace's init. It then polls stdout, stderr, the result
pipe and a pidfd (no sleeping on the hot path; every few ms without a pidfd) until the
process exits, the deadline passes or a cap is hit:

* stdout: only the first KEEP_BYTES are kept (diagnostics only, never read for the verdict);
* stderr: only the last KEEP_BYTES are kept;
* stdout+stderr over max_output_bytes, or the result channel over max_result_bytes: killed.

Killing a bwrap run SIGKILLs the namespace's init, so the kernel kills everything in the
namespace; otherwise (or before the pid is known) the process group is SIGKILLed. The
child is not reaped until its group has been killed, so the group id cannot be reused;
on any exception in the parent (e.g. KeyboardInterrupt) the run is killed before it
propagates. `kill_uid` SIGKILLs every process of a per-run uid (as root, after every run:
daemons that left the group included; under bwrap, beside the namespace's own end). The
caller runs this on the thread that must outlive the run: bwrap's --die-with-parent follows
the spawning *thread*.

Nothing here decides anything about the tests: the verdict is `reflectrl.sandbox.verdict`,
what the command line contains is `reflectrl.sandbox.isolation`.
"""

from __future__ import annotations

import json
import marshal
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

__all__ = ["KEEP_BYTES", "Raw", "execute", "kill_uid"]

KEEP_BYTES = 8192        # stdout head / stderr tail kept in the result


@dataclass
class Raw:
    """What one run left behind, before any judging."""
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


def kill_uid(uid: int) -> None:
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


def execute(argv: list[str], payload: dict, *, info_fd: bool, env: dict, cwd: str | None, timeout: float,
             max_output_bytes: int, max_result_bytes: int) -> Raw:
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
             max_result_bytes: int) -> Raw:
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
            del err_tail[:-KEEP_BYTES]
        elif fd == out_fd:
            if sizes[fd] - len(data) < KEEP_BYTES:
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
    return Raw(b"".join(chunks[r_fd]), b"".join(chunks[out_fd])[:KEEP_BYTES], bytes(err_tail), returncode,
                timed_out, killed_reason, duration)
