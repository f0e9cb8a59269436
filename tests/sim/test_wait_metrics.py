"""The wait-versus-length metrics: the plain correlation and the one with arrival time taken out."""

import numpy as np

from sglang_feather.sim.report import _corr, _partial_corr


def test_a_trend_shared_through_time_is_taken_out():
    """Prompts that grow over the trace and waits that grow with the load: correlated through time only."""
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 100, 2000))
    length = 1000 + 30 * arrival + rng.normal(0, 300, 2000)
    wait = 0.05 * arrival + rng.normal(0, 1, 2000)
    assert _corr(list(wait), list(length)) > 0.5
    assert abs(_partial_corr(list(wait), list(length), list(arrival))) < 0.1


def test_a_schedule_that_favours_short_prompts_still_shows():
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0, 100, 2000))
    length = 1000 + 30 * arrival + rng.normal(0, 300, 2000)
    wait = 0.01 * (length - (1000 + 30 * arrival)) + rng.normal(0, 1, 2000)
    assert _partial_corr(list(wait), list(length), list(arrival)) > 0.8


def test_constant_arrivals_fall_back_to_the_plain_correlation():
    xs, ys = [1.0, 2.0, 3.0, 5.0], [2.0, 1.0, 4.0, 3.0]
    assert _partial_corr(xs, ys, [0.0] * 4) == _corr(xs, ys)
