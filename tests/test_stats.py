"""IQM, bootstrap intervals, probability of improvement and thresholds on known answers."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from reflectrl.report import stats


def test_iqm_known_answers():
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # trims 2 from each end: mean(3, 4, 5, 6)
    assert stats.iqm([5.0]) == 5.0
    assert stats.iqm([1, 100, 2, 3]) == 2.5  # the outlier is trimmed
    assert math.isnan(stats.iqm([]))


@pytest.mark.parametrize("n", [3, 4, 5, 10, 17, 50])
def test_iqm_matches_scipy_trim_mean(n):
    x = np.random.default_rng(n).normal(size=n) ** 3
    assert stats.iqm(x) == pytest.approx(scipy_stats.trim_mean(x, 0.25))


def test_bootstrap_interval_constant_data_is_a_point():
    m = np.full((5, 2), 3.0)
    assert stats.interval([m], stats.iqm, reps=200) == (3.0, 3.0, 3.0)


def test_bootstrap_interval_covers_mean_with_expected_width():
    x = np.random.default_rng(0).normal(10.0, 2.0, size=(400, 1))
    point, lo, hi = stats.interval([x], lambda m: float(m.mean()), reps=1000)
    assert lo < 10.0 < hi
    assert hi - lo == pytest.approx(2 * 1.96 * 2.0 / math.sqrt(400), rel=0.2)


def test_bootstrap_is_stratified_per_task():
    # task 0 is always 0 and task 1 always 1: a stratified resample keeps both, so the
    # mean over the matrix is exactly 0.5 in every resample
    m = np.array([[0.0, 1.0]] * 6)
    samples = stats.stratified_bootstrap([m], lambda a: float(a.mean()), reps=200)
    assert np.all(samples == 0.5)


def test_bootstrap_is_seeded():
    m = np.random.default_rng(1).normal(size=(7, 3))
    a = stats.interval([m], stats.iqm, reps=300, seed=5)
    b = stats.interval([m], stats.iqm, reps=300, seed=5)
    assert a == b


def test_probability_of_improvement():
    assert stats.probability_of_improvement(np.array([[1.0], [2.0]]), np.array([[0.0], [0.5]])) == 1.0
    assert stats.probability_of_improvement(np.array([[1.0], [1.0]]), np.array([[1.0], [1.0]])) == 0.5
    # x = [1, 3], y = [2, 2]: pairs (1>2 no, 1>2 no, 3>2 yes, 3>2 yes) -> 0.5
    assert stats.probability_of_improvement(np.array([[1.0], [3.0]]), np.array([[2.0], [2.0]])) == 0.5
    # averaged over tasks: task 0 -> 1.0, task 1 -> 0.0
    x = np.array([[5.0, 0.0], [6.0, 0.0]])
    y = np.array([[1.0, 9.0], [2.0, 9.0]])
    assert stats.probability_of_improvement(x, y) == 0.5


def test_steps_to_threshold():
    steps = np.array([100, 200, 300, 400])
    assert stats.steps_to_threshold(steps, np.array([0.1, 0.5, 0.9, 0.95]), 0.9) == 300
    assert stats.steps_to_threshold(steps, np.array([0.1, 0.5, 0.6, 0.7]), 0.9) == math.inf
    # held, not touched: the lucky first point does not count with a window of 2
    assert stats.steps_to_threshold(steps, np.array([1.0, 0.0, 0.9, 1.0]), 0.9, window=2) == 300
    assert stats.steps_to_threshold(steps, np.array([1.0, 0.0, 0.9, 1.0]), 0.9) == 100


def test_claim_verdicts():
    from reflectrl.report.analysis import _verdict_greater

    assert _verdict_greater((0.2, 0.05, 0.3)) == "supported"
    assert _verdict_greater((-0.2, -0.3, -0.05)) == "not supported"
    assert _verdict_greater((0.0, 0.0, 0.0)) == "not supported"  # every seed tied: no improvement
    assert _verdict_greater((0.05, -0.1, 0.2)) == "inconclusive"
