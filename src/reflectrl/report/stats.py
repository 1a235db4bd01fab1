"""rliable-style statistics over seeds (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice"), written out in numpy to match rliable's definitions (a test
checks them against the `rliable` package):

* interquartile mean (IQM): the mean of the middle 50% of scores, trimming
  int(0.25 * n) from each end, as `scipy.stats.trim_mean(x, 0.25)`;
* stratified bootstrap: resample runs with replacement *within each task* (env), then
  aggregate; percentile confidence intervals;
* probability of improvement P(X > Y): per task, the Mann-Whitney statistic
  (ties count half), averaged over tasks.

A score matrix is (runs, tasks): one row per seed, one column per env. The bootstrap is
vectorised: a statistic receives a batch of resampled matrices, (resamples, runs, tasks),
and returns one value per resample (`iqm`, `probability_of_improvement` and
`iqm_difference` do; any other callable is applied one resample at a time). From the
bootstrap samples come one-sided p-values for the report's verdicts (each claim is tested
in its own direction and in the opposite one), Holm's correction for testing several of
them, and the TOST equivalence test (a tie is only ever called "equivalent" through it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reflectrl.report import BOOTSTRAP_REPS

VERDICT_SEEDS = (0, 1, 2, 3, 4)  # the bootstrap seeds a verdict must agree under (a flip is flagged)
_CHUNK_ELEMENTS = 4_000_000  # resampled values held at once


def _as_batch(scores) -> tuple[np.ndarray, bool]:
    """(batch, values) view of a score matrix or a batch of them; True when batched."""
    x = np.asarray(scores, dtype=float)
    if x.ndim <= 2:
        return x.reshape(1, -1), False
    return x.reshape(x.shape[0], -1), True


def iqm(scores):
    """The interquartile mean of a score matrix (a float), or of each matrix in a batch
    (resamples, runs, tasks) -> (resamples,)."""
    x, batched = _as_batch(scores)
    n = x.shape[1]
    if n == 0:
        out = np.full(x.shape[0], np.nan)
    else:
        k = int(0.25 * n)
        out = (np.sort(x, axis=1) if k else x)[:, k:n - k].mean(axis=1)  # k = 0 (n < 4): the mean, no sort
    return out if batched else float(out[0])


def iqm_difference(x, y):
    """IQM(x) - IQM(y), per resample when batched."""
    return iqm(x) - iqm(y)


def probability_of_improvement(x: np.ndarray, y: np.ndarray):
    """P(X > Y) averaged over tasks; x and y are (runs, tasks) with the same tasks, or
    batches of them (resamples, runs, tasks) -> (resamples,)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    batched = x.ndim == 3
    if not batched:
        x, y = np.atleast_2d(x)[None], np.atleast_2d(y)[None]
    xt, yt = x[:, :, None, :], y[:, None, :, :]  # pairs: (batch, n, m, tasks)
    # (count of x > y) + (count of x >= y) = 2 x (wins + ties / 2)
    twice = (xt > yt).sum(axis=(1, 2), dtype=np.int64) + (xt >= yt).sum(axis=(1, 2), dtype=np.int64)
    out = (twice / (2 * x.shape[1] * y.shape[1])).mean(axis=1)
    return out if batched else float(out[0])


def stratified_bootstrap(matrices: list[np.ndarray], statistic: Callable[..., float], reps: int = BOOTSTRAP_REPS,
                         seed: int = 0) -> np.ndarray:
    """`statistic(*resampled)` for `reps` stratified resamples of each (runs, tasks) matrix,
    in chunks of resamples (each task's column resampled on its own)."""
    rng = np.random.default_rng(seed)
    matrices = [np.asarray(m, dtype=float) for m in matrices]
    per_rep = max(1, sum(m.size for m in matrices))
    chunk = max(1, min(reps, _CHUNK_ELEMENTS // per_rep))
    out = np.empty(reps)
    done = 0
    while done < reps:
        k = min(chunk, reps - done)
        batch = []
        for m in matrices:
            n, t = m.shape
            idx = rng.integers(0, n, size=(k, n, t))
            batch.append(m[idx, np.arange(t)])
        try:
            values = statistic(*batch)
        except (TypeError, ValueError):  # a statistic that takes one matrix at a time, and says so
            values = None
        if np.shape(values) != (k,):  # a statistic that takes one matrix at a time
            values = [statistic(*(b[i] for b in batch)) for i in range(k)]
        out[done:done + k] = values
        done += k
    return out


def interval(matrices: list[np.ndarray], statistic: Callable[..., float], reps: int = BOOTSTRAP_REPS,
             size: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(point estimate, lower, upper) with a percentile bootstrap CI."""
    point = statistic(*matrices)
    samples = stratified_bootstrap(matrices, statistic, reps, seed)
    lo, hi = np.percentile(samples, [100 * (1 - size) / 2, 100 * (1 + size) / 2])
    return float(point), float(lo), float(hi)


def pointwise_interval(curves: np.ndarray, reps: int = BOOTSTRAP_REPS, size: float = 0.95,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM across runs at each point of (runs, points) learning curves, with a percentile
    bootstrap band: whole runs are resampled (the bootstrap of the tables, one task)."""
    curves = np.asarray(curves, dtype=float)
    mid = iqm(curves[:, :, None].transpose(1, 0, 2))  # each point's column as a batch entry
    samples = np.empty((reps, curves.shape[1]))
    rng = np.random.default_rng(seed)
    n = curves.shape[0]
    chunk = max(1, _CHUNK_ELEMENTS // max(1, curves.size))
    for start in range(0, reps, chunk):
        k = min(chunk, reps - start)
        resampled = curves[rng.integers(0, n, size=(k, n))]  # (k, n, points)
        per_point = resampled.transpose(0, 2, 1).reshape(-1, n, 1)  # one (runs, 1) matrix per (resample, point)
        samples[start:start + k] = iqm(per_point).reshape(k, -1)
    lo, hi = np.percentile(samples, [100 * (1 - size) / 2, 100 * (1 + size) / 2], axis=0)
    return mid, lo, hi


def p_value_above(samples: np.ndarray, null: float) -> float:
    """One-sided bootstrap p-value for "the statistic is above `null`": the share of
    resamples at or below it (the percentile CI's lower end is above `null` exactly when
    this is below (1 - size) / 2)."""
    return float(np.mean(np.asarray(samples) <= null))


def p_value_below(samples: np.ndarray, null: float) -> float:
    """One-sided bootstrap p-value for "the statistic is below `null`"."""
    return float(np.mean(np.asarray(samples) >= null))


def tost_p_value(samples: np.ndarray, margin: float, center: float = 0.0) -> float:
    """Two one-sided tests for equivalence within (center - margin, center + margin): the
    larger of the two one-sided p-values; equivalence is shown at level a when this is below
    a (the (1 - 2a) CI lies inside the margins). A zero margin never shows equivalence."""
    return max(p_value_above(samples, center - margin), p_value_below(samples, center + margin))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control for several tests):
    the i-th smallest p times (m - i + 1), made monotone, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def steps_to_threshold(steps: np.ndarray, values: np.ndarray, threshold: float, window: int = 1) -> float:
    """The first step from which the curve's mean over the next `window` points reaches
    `threshold`; inf if it never does.

    A window > 1 asks for the level to be held, not touched once: early in training the
    episodes that end first are often the lucky short ones, so a raw curve can start high.
    """
    values = np.asarray(values, dtype=float)
    for t in range(len(values)):
        if np.mean(values[t:t + window]) >= threshold:
            return float(steps[t])
    return float("inf")
