"""What a run says of its progress while and after it trains.

`progress_bar` is the one progress display of every command that trains (train, train-group,
compare, sweep's re-run, llm train, llm sft): a tqdm bar when stderr is a terminal; otherwise (a
log file, a pipe, a notebook's captured output) one plain line every PROGRESS_SECONDS, because a
bar's refreshes written to a file are hundreds of carriage-return fragments. Both measure the
speed after the first update: the first iteration carries the start-up (imports, JIT
compilation, a step-0 evaluation), and a time to go computed from it is far too long.

`recent_return_text` is the return the end-of-run summary states, the same on every backend: the
mean of the last RECENT_EPISODES episodes that ended in training.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings

import numpy as np

from reflectrl.runs.health import format_duration, format_return

PROGRESS_SECONDS = 30.0  # without a terminal: one progress line this often ...
PROGRESS_SECONDS_VARIABLE = "REFLECTRL_PROGRESS_SECONDS"  # ... or as often as this environment variable says
RECENT_EPISODES = 20  # the return a run reports (progress, end-of-run summary): the mean of its last episodes


def line_seconds() -> float:
    """The seconds between two progress lines: PROGRESS_SECONDS, or the environment's override."""
    text = os.environ.get(PROGRESS_SECONDS_VARIABLE, "").strip()
    if not text:
        return PROGRESS_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # also NaN
        warnings.warn(f"{PROGRESS_SECONDS_VARIABLE}={text!r} is not a number of seconds >= 0; "
                      f"printing progress every {PROGRESS_SECONDS:.0f}s", stacklevel=3)
        return PROGRESS_SECONDS
    return seconds


def progress_bar(total: int, unit: str, *, initial: int = 0, enabled: bool = True, smoothing: float = 0.1,
                 mininterval: float = 0.5, stream=None):
    """The progress display of `total` `unit`s (plural: "env steps", "steps"), `initial` of them done:
    update(n), set_postfix_str(text) and close(), as a tqdm bar's."""
    stream = stream or sys.stderr
    if not enabled:
        from tqdm import tqdm

        return tqdm(total=total, disable=True)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm

        return TerminalBar(tqdm(total=total, initial=initial, unit=unit.split()[-1].rstrip("s") or "step",
                                unit_scale=True, dynamic_ncols=True, smoothing=smoothing, mininterval=mininterval,
                                file=stream))
    return ProgressLines(total, unit, initial=initial, every=line_seconds(), stream=stream)


class TerminalBar:
    """A tqdm bar whose speed (a moving average) starts after the first update."""

    def __init__(self, bar):
        self.bar = bar
        self.warm = False

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        if n and not self.warm:
            self.warm = True
            # what tqdm's own reset() does, keeping the count and the elapsed time: the moving average
            # of the speed forgets the first update (start-up); fresh averages of tqdm's own kind
            bar = self.bar
            if hasattr(bar, "_ema_dn") and not bar.disable:
                bar._ema_dn, bar._ema_dt = type(bar._ema_dn)(bar.smoothing), type(bar._ema_dt)(bar.smoothing)
                bar.last_print_n, bar.last_print_t = bar.n, bar._time()

    def set_postfix_str(self, text: str = "", refresh: bool = False) -> None:
        self.bar.set_postfix_str(text, refresh=refresh)

    def close(self) -> None:
        self.bar.close()

    def __getattr__(self, name: str):  # n, total, postfix: the bar's
        if name == "bar":  # not set yet
            raise AttributeError(name)
        return getattr(self.bar, name)


class ProgressLines:
    """What a bar shows, as a line every `every` seconds after the first update, for a stream that is no
    terminal:

        reflectrl: 12,288/50,000 env steps (25%) in 1 min, 410 env steps/s, about 2 min to go; return=21.3

    The speed is that since the previous line (the first line's: since the first update)."""

    def __init__(self, total: int, unit: str, *, initial: int = 0, every: float = PROGRESS_SECONDS, stream=None,
                 clock=time.monotonic):
        self.total, self.n, self.unit, self.every = total, initial, unit, every
        self.stream = stream or sys.stderr
        self.clock = clock
        self.postfix = ""
        self.started = self.last_line = clock()
        self.since: tuple[float, int] | None = None  # (time, count) the speed is measured from

    def update(self, n: int = 1) -> None:
        if not n:
            return
        self.n += n
        now = self.clock()
        if self.since is None:  # the first update ends the start-up: the lines and their speed start here
            self.since, self.last_line = (now, self.n), now
        elif now - self.last_line >= self.every:
            self._line(now)

    def set_postfix_str(self, text: str = "", refresh: bool = False) -> None:
        """The text after the counts; a caller that sets it while waiting for work it cannot count yet
        (compare's poll of runs that are still starting or compiling, such as a JAX group's) gets a line
        every `every` seconds all the same, so that a long start is not silence."""
        self.postfix = text
        now = self.clock()
        if now - self.last_line >= self.every:
            self._line(now)

    def close(self) -> None:
        pass  # the command's own closing line follows

    def _line(self, now: float) -> None:
        then, before = self.since or (now, self.n)  # before the first update: no speed yet
        rate = (self.n - before) / (now - then) if now > then else 0.0
        parts = [f"{self.n:,}/{self.total:,} {self.unit}"
                 + (f" ({self.n / self.total:.0%})" if self.total else "")
                 + f" in {format_duration(now - self.started)}"]
        if rate > 0:
            parts.append(f"{rate:,.0f} {self.unit}/s" if rate >= 100 else f"{rate:.3g} {self.unit}/s")
            if self.n < self.total:
                parts.append(f"about {format_duration((self.total - self.n) / rate)} to go")
        print("reflectrl: " + ", ".join(parts) + (f"; {self.postfix}" if self.postfix else ""),
              file=self.stream, flush=True)
        self.last_line = now
        if self.since is not None:
            self.since = (now, self.n)


def recent_return_text(returns) -> str:
    """The end-of-run summary's return: the mean of the last RECENT_EPISODES (or fewer) episodes."""
    if not len(returns):
        return "no episode ended in training (the budget was shorter than an episode, or the env has no time limit)"
    return f"mean return of the last {len(returns)} episodes {format_return(float(np.mean(returns)))}"
