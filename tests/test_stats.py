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
    assert _verdict_greater((0.0, 0.0, 0.0)) == "inconclusive"  # every seed tied: neither side (a tie is the TOST's)
    assert _verdict_greater((0.05, -0.1, 0.2)) == "inconclusive"


# ------------------------------------------------------- vectorised bootstrap, tests, rliable

def test_vectorised_statistics_match_one_resample_at_a_time():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(4, 3))
    batch = np.stack([x, x[::-1] * 2, x + 1])
    assert stats.iqm(batch).tolist() == pytest.approx([stats.iqm(b) for b in batch])
    ybatch = np.stack([y, y * 0, y - 1])
    assert stats.probability_of_improvement(batch, ybatch).tolist() == pytest.approx(
        [stats.probability_of_improvement(a, b) for a, b in zip(batch, ybatch)])
    # a statistic written for one matrix gives the same samples as its batched form
    a = stats.stratified_bootstrap([x, y], stats.iqm_difference, reps=500, seed=2)
    b = stats.stratified_bootstrap([x, y], lambda p, q: float(stats.iqm(p) - stats.iqm(q)), reps=500, seed=2)
    assert np.allclose(a, b)


def test_bootstrap_chunks_do_not_change_the_samples(monkeypatch):
    m = np.random.default_rng(4).normal(size=(5, 2))
    whole = stats.stratified_bootstrap([m], stats.iqm, reps=1000, seed=1)
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", 37)  # a few resamples per chunk
    # one matrix: the generator's stream is drawn in the same order, so the samples are the same
    assert np.array_equal(stats.stratified_bootstrap([m], stats.iqm, reps=1000, seed=1), whole)


def test_holm_known_answers():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04) (monotone)
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5]) == [0.5]
    assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert stats.holm([]) == []


def test_one_sided_p_values_and_tost():
    samples = np.array([-0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert stats.p_value_above(samples, 0.0) == 0.3  # three resamples at or below 0
    assert stats.p_value_below(samples, 0.0) == 0.8
    # equivalence within 1: every resample inside (-1, 1)
    assert stats.tost_p_value(samples, 1.0) == 0.0
    # within 0.5: 2 of 10 resamples at or above +0.5
    assert stats.tost_p_value(samples, 0.5) == 0.3
    assert stats.tost_p_value(np.zeros(10), 0.0) == 1.0  # a zero margin can never show equivalence


def test_a_tie_shows_neither_direction_only_equivalence():
    tied = np.zeros(100)  # every resample exactly on the line
    assert stats.p_value_above(tied, 0.0) == 1.0 and stats.p_value_below(tied, 0.0) == 1.0
    assert stats.tost_p_value(tied, 0.05) == 0.0


def test_tost_around_another_center():
    ratios = np.array([0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03, 1.04, 1.06, 0.93])  # a ratio tied at 1
    assert stats.tost_p_value(ratios, 0.05, center=1.0) == 0.1  # 0.93 at or below 0.95; 1.06 at or above 1.05
    assert stats.tost_p_value(ratios, 0.1, center=1.0) == 0.0
    assert stats.tost_p_value(ratios, 0.1) == 1.0  # around 0: every ratio is far outside +-0.1


def test_pointwise_band_matches_a_bootstrap_per_point():
    curves = np.random.default_rng(5).normal(size=(6, 4))
    mid, lo, hi = stats.pointwise_interval(curves, reps=4000, seed=0)
    for t in range(4):
        p, a, b = stats.interval([curves[:, t:t + 1]], stats.iqm, reps=4000, seed=9)
        assert mid[t] == pytest.approx(p)
        assert (lo[t], hi[t]) == pytest.approx((a, b), abs=0.12)


@pytest.mark.slow
def test_iqm_intervals_and_probability_of_improvement_match_rliable():
    pytest.importorskip("rliable")  # the test extra installs it
    from rliable import library as rly
    from rliable import metrics

    rng = np.random.default_rng(11)
    for n, tasks in ((5, 1), (10, 3), (7, 4)):
        x, y = rng.normal(size=(n, tasks)), rng.normal(0.3, 1.0, size=(n, tasks))
        assert stats.iqm(x) == pytest.approx(metrics.aggregate_iqm(x))
        points, cis = rly.get_interval_estimates({"x": x}, lambda s: np.array([metrics.aggregate_iqm(s)]),
                                                 reps=20000, random_state=np.random.RandomState(0))
        point, lo, hi = stats.interval([x], stats.iqm, reps=20000, seed=0)
        assert point == pytest.approx(points["x"][0])
        # two independent bootstraps of 20,000 resamples: the endpoints agree within Monte-Carlo error
        spread = hi - lo
        assert (lo, hi) == pytest.approx((cis["x"][0, 0], cis["x"][1, 0]), abs=0.05 * spread)
        assert stats.probability_of_improvement(x, y) == pytest.approx(
            metrics.probability_of_improvement(x, y))
