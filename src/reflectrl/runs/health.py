"""Warnings about a run that is going wrong while it still looks fine: a budget that would
take days, a policy whose entropy has collapsed, a loss that has grown by orders of
magnitude while staying finite (a non-finite one stops training, see errors.py).

Trainers hand each iteration's metrics row to `RunMonitor.after_iteration`; the monitor
knows no trainer, only metric names (`entropy`, and the trainer losses in `LOSSES`).
"""

from __future__ import annotations

import math
import sys
import warnings

# Losses watched for blow-ups; a signal's own losses may legitimately grow (more data, new rewards).
LOSSES = ("value_loss", "policy_loss", "loss")
ENTROPY_FLOOR = 1e-3       # nats: below it, a discrete policy is deterministic
EXPLOSION_FACTOR = 1e3     # a loss this many times its early level (at least 1) has blown up
REFERENCE_ITERATIONS = 5   # the early level is the median of the first iterations
LONG_RUN_SECONDS = 86_400  # warn when the estimated time exceeds a day
QUIET_BELOW_SECONDS = 60   # shorter runs get no estimate line (their progress bar shows it)
# The time estimate skips the first iteration (start-up: imports, JIT compilation, a step-0 evaluation) and
# measures the speed over the iterations after it: this many, or this many seconds, whichever comes first.
ESTIMATE_ITERATIONS = 3
ESTIMATE_SECONDS = 10.0
PSEUDO_COLLAPSE_RATE = 0.95  # pseudo_reward=verdict: "solved" on at least this share of answers ...
PSEUDO_WINDOW = 5            # ... for this many steps in a row is a collapse


def format_return(x: float) -> str:
    """A return for people: 4 significant digits, but no exponent for ordinary magnitudes."""
    return f"{x:,.0f}" if 1e4 <= abs(x) < 1e12 else f"{x:.4g}"


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "forever"
    if seconds < 90:
        return f"{seconds:.0f}s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 48:
        return f"{int(hours)}h{int(minutes % 60):02d}"
    days = hours / 24
    return f"{days:.0f} days" if days < 730 else f"{days / 365:.0f} years"


class RunMonitor:
    """One per training session. `unit` names what `total` counts (env steps, GRPO steps)."""

    def __init__(self, total: int, unit: str, discrete_entropy: bool = True, stream=None):
        self.total = total
        self.unit = unit
        self.discrete_entropy = discrete_entropy
        self.stream = stream
        self.estimated = False
        self.warm: tuple[int, float, int] | None = None  # (units, seconds, iterations) when the start-up ended
        self.early: dict[str, list[float]] = {}
        self.warned: set[str] = set()

    def after_iteration(self, row: dict, done: int, done_this_session: int, seconds: float) -> None:
        """`done`: units done in all; `done_this_session` and `seconds`: since this process started."""
        if not self.estimated and done_this_session > 0:
            self._estimate(done, done_this_session, seconds)
        self._check_entropy(row)
        self._check_pseudo_reward(row)
        for key in LOSSES:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._check_loss(key, float(value), row)

    def _estimate(self, done: int, done_this_session: int, seconds: float) -> None:
        """Once: the time to go (a line, for a run of a minute or more) and a warning past a day."""
        if self.warm is None:
            self.warm = (done_this_session, seconds, 0)  # the first iteration: start-up, not speed
            return
        units, since, iterations = self.warm
        iterations += 1
        self.warm = (units, since, iterations)
        elapsed = seconds - since
        if elapsed <= 0 or (iterations < ESTIMATE_ITERATIONS and elapsed < ESTIMATE_SECONDS):
            return
        self.estimated = True
        rate = (done_this_session - units) / elapsed
        left = max(self.total - done, 0) / rate if rate > 0 else math.inf
        shown = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
        if left >= QUIET_BELOW_SECONDS:
            print(f"reflectrl: about {format_duration(left)} to go for {self.total - done:,} {self.unit} "
                  f"at {shown} {self.unit}/s (measured after the first iteration, which includes the start-up)",
                  file=self.stream or sys.stderr)
        if left > LONG_RUN_SECONDS:
            warnings.warn(f"this run would take about {format_duration(left)} at the current speed; "
                          f"lower the budget ({self.total:,} {self.unit}) unless that is intended")

    def _check_entropy(self, row: dict) -> None:
        entropy = row.get("entropy")
        if (self.discrete_entropy and isinstance(entropy, (int, float)) and entropy < ENTROPY_FLOOR
                and "entropy" not in self.warned):
            self.warned.add("entropy")
            warnings.warn(f"the policy's entropy has collapsed to {entropy:.2g} at {self._at(row)}: it acts "
                          "deterministically and explores no more (a too-high learning_rate, or ent_coef=0?)")

    def _check_pseudo_reward(self, row: dict) -> None:
        """Self-improvement on the model's own verdict (pseudo_reward=verdict) can reinforce itself
        into saying "solved" on everything: warn once when it does, with the withheld accuracy."""
        rate = row.get("pseudo_solved_rate")
        if not isinstance(rate, (int, float)):
            return
        recent = self.early.setdefault("pseudo_solved_rate", [])
        recent.append(float(rate))
        del recent[:-PSEUDO_WINDOW]
        if (len(recent) == PSEUDO_WINDOW and min(recent) >= PSEUDO_COLLAPSE_RATE
                and "pseudo_solved_rate" not in self.warned):
            self.warned.add("pseudo_solved_rate")
            accuracy = row.get("pseudo_true_accuracy", float("nan"))
            warnings.warn(f"the verdict has drifted toward always 'solved' at {self._at(row)}: it says solved on "
                          f"{rate:.0%} of answers for {PSEUDO_WINDOW} steps while {accuracy:.0%} are correct; "
                          "the pseudo-reward now rewards everything (stop, or calibrate with grpo+verdict first)")

    def _check_loss(self, key: str, value: float, row: dict) -> None:
        early = self.early.setdefault(key, [])
        if len(early) < REFERENCE_ITERATIONS:
            early.append(abs(value))
            return
        reference = max(sorted(early)[len(early) // 2], 1.0)
        if abs(value) > EXPLOSION_FACTOR * reference and key not in self.warned:
            self.warned.add(key)
            warnings.warn(f"{key} is {value:.3g} at {self._at(row)}, over {EXPLOSION_FACTOR:.0f}x its early level "
                          f"({reference:.3g}): training is diverging (try a lower learning_rate)")

    @staticmethod
    def _at(row: dict) -> str:
        if "global_step" in row:
            return f"global_step {row['global_step']}"
        return f"step {row.get('step', '?')}"
