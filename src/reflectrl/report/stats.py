"""rliable-style statistics over seeds (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice"), written out in numpy to match rliable's definitions:

* interquartile mean (IQM): the mean of the middle 50% of scores, trimming
  int(0.25 * n) from each end, as `scipy.stats.trim_mean(x, 0.25)`;
* stratified bootstrap: resample runs with replacement *within each task* (env), then
  aggregate; percentile confidence intervals;
* probability of improvement P(X > Y): per task, the Mann-Whitney statistic
  (ties count half), averaged over tasks.

A score matrix is (runs, tasks): one row per seed, one column per env.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def iqm(scores) -> float:
    x = np.sort(np.asarray(scores, dtype=float).ravel())
    k = int(0.25 * x.size)
    return float(x[k:x.size - k].mean()) if x.size else float("nan")


def stratified_bootstrap(matrices: list[np.ndarray], statistic: Callable[..., float], reps: int = 2000,
                         seed: int = 0) -> np.ndarray:
    """`statistic(*resampled)` for `reps` stratified resamples of each (runs, tasks) matrix."""
    rng = np.random.default_rng(seed)
    out = np.empty(reps)
    for r in range(reps):
        resampled = []
        for m in matrices:
            n = m.shape[0]
            idx = rng.integers(0, n, size=m.shape)  # each task (column) resampled on its own
            resampled.append(np.take_along_axis(m, idx, axis=0))
        out[r] = statistic(*resampled)
    return out


def interval(matrices: list[np.ndarray], statistic: Callable[..., float], reps: int = 2000, size: float = 0.95,
             seed: int = 0) -> tuple[float, float, float]:
    """(point estimate, lower, upper) with a percentile bootstrap CI."""
    point = statistic(*matrices)
    samples = stratified_bootstrap(matrices, statistic, reps, seed)
    lo, hi = np.percentile(samples, [100 * (1 - size) / 2, 100 * (1 + size) / 2])
    return float(point), float(lo), float(hi)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) averaged over tasks; x and y are (runs, tasks) with the same tasks."""
    x, y = np.atleast_2d(x), np.atleast_2d(y)
    probs = []
    for t in range(x.shape[1]):
        xt, yt = x[:, t][:, None], y[:, t][None, :]
        probs.append(float(((xt > yt) + 0.5 * (xt == yt)).mean()))
    return float(np.mean(probs))


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
