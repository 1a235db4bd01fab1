"""Fate-sharing for a local Ray instance: its processes end within seconds of ours, however ours ends.

`ray.init()` without an address starts a local instance whose raylet and GCS die with this
process; but after a `kill -9` of it, Ray's per-node agents (DashboardAgent, RuntimeEnvAgent)
first try to report the raylet's death to the dead GCS, with a fixed 60-second timeout, and
linger that long. `start_reaper()` starts a small watcher process that holds the read end of a
pipe whose write end only this process holds: when it reads EOF (this process is gone, by
any means) it kills the descendants of this process it has seen. On a normal exit Ray has
already stopped them and the watcher finds nothing to kill.

    python -m reflectrl.distributed.reaper PID    (stdin: the pipe)
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

POLL_SECONDS = 1.0


def start_reaper() -> subprocess.Popen | None:
    """Start the watcher of this process (None where psutil is missing: nothing is reaped)."""
    try:
        import psutil  # noqa: F401  (Ray depends on it)
    except ImportError:
        return None
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl.distributed.reaper", str(os.getpid())],
                            stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # not in our process group: a Ctrl-C does not reach it
    os.close(read)
    os.set_inheritable(write, False)  # children (Ray's processes) must not keep the pipe open
    proc._reflectrl_pipe = write  # closed when this process ends, however it ends
    return proc


def stop_reaper(proc: subprocess.Popen | None) -> None:
    """After a normal shutdown: close the pipe, so the watcher checks once and exits."""
    if proc is None:
        return
    fd = getattr(proc, "_reflectrl_pipe", None)
    if fd is not None:
        os.close(fd)
        proc._reflectrl_pipe = None
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _watch(parent_pid: int) -> None:
    import psutil

    seen: dict[int, float] = {}  # pid -> create_time, so a reused pid is never killed
    me = os.getpid()
    gone = threading.Event()

    def wait_for_eof():
        while sys.stdin.buffer.read(4096):
            pass
        gone.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not gone.wait(POLL_SECONDS):
        try:
            for child in psutil.Process(parent_pid).children(recursive=True):
                if child.pid != me:
                    seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            break
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.kill()
        except psutil.Error:
            pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]))
