"""The forgetting non-negative least squares fit against SciPy's NNLS on the same weighted system, and its
invariants under random updates, saves and reloads."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from scipy.optimize import nnls

from sglang_feather.policy.nnls import ForgettingNNLS

VALUES = st.floats(-4, 4, allow_nan=False)
ROW = st.lists(VALUES, min_size=3, max_size=3)
SAMPLES = st.lists(st.tuples(ROW, VALUES), min_size=1, max_size=30)


def reference(samples, ridge, forgetting):
    """SciPy's NNLS of Σ λ^(n-1-i)·(y_i − θ·x_i)² + ridge·|θ|²: rows scaled by √weight, √ridge·I appended."""
    n = len(samples)
    weights = np.sqrt(forgetting ** np.arange(n - 1, -1, -1))
    x = np.array([s[0] for s in samples], dtype=float) * weights[:, None]
    y = np.array([s[1] for s in samples], dtype=float) * weights
    a = np.vstack([x, math.sqrt(ridge) * np.eye(3)])
    return nnls(a, np.concatenate([y, np.zeros(3)]))[0]


def objective(theta, samples, ridge, forgetting):
    n = len(samples)
    return sum(
        forgetting ** (n - 1 - i) * (y - float(np.dot(theta, x))) ** 2 for i, (x, y) in enumerate(samples)
    ) + ridge * float(np.dot(theta, theta))


@settings(max_examples=200, deadline=None)
@given(samples=SAMPLES, forgetting=st.sampled_from([1.0, 0.95]), ridge=st.sampled_from([1e-3, 1.0]))
def test_the_solve_equals_scipys_nnls(samples, forgetting, ridge):
    fit = ForgettingNNLS(3, ridge=ridge, forgetting=forgetting)
    for x, y in samples:
        fit.update(x, y)
    fit.check()
    expected = reference(samples, ridge, forgetting)
    assert all(t >= 0 for t in fit.theta)
    # The optimum is unique (ridge > 0 makes the objective strongly convex): equal objectives, and θ as close
    # as the objectives' gap allows, ridge · |θ - θ*|² <= f(θ) - f(θ*) (a flat direction, curvature near
    # `ridge`, leaves both solvers' θ there a few 1e-6 apart at equal objectives).
    ours, theirs = (objective(theta, samples, ridge, forgetting) for theta in (fit.theta, expected))
    assert ours == pytest.approx(theirs, rel=1e-7, abs=1e-9)
    gap = float(np.sum((np.array(fit.theta) - expected) ** 2))
    assert ridge * gap <= abs(ours - theirs) + 1e-7 * theirs + 1e-9, (fit.theta, list(expected))


def test_a_non_negative_law_is_recovered_and_a_negative_one_is_clipped():
    rng = np.random.default_rng(0)
    fit, clipped = ForgettingNNLS(3, ridge=1e-9), ForgettingNNLS(3, ridge=1e-9)
    for _ in range(60):
        x = [1.0, *rng.uniform(0, 2, 2)]
        fit.update(x, 3.0 + 2.0 * x[1] + 0.5 * x[2])
        clipped.update(x, 3.0 + 2.0 * x[1] - 0.5 * x[2])
    assert fit.theta == pytest.approx([3.0, 2.0, 0.5], abs=1e-6)
    assert fit.predict([1.0, 1.0, 1.0]) == pytest.approx(5.5, abs=1e-6)
    assert clipped.theta[2] == 0.0, "a cost cannot save time: the fit puts it at 0"


def test_leverage_is_small_where_samples_were_and_large_elsewhere():
    fit = ForgettingNNLS(2, ridge=1e-3)
    for b in range(1, 101):
        fit.update([1.0, b / 100], 1.0)
    assert fit.leverage([1.0, 0.5]) < 0.05
    fit_one_direction = ForgettingNNLS(2, ridge=1e-3)
    for _ in range(100):
        fit_one_direction.update([1.0, 0.0], 1.0)
    assert fit_one_direction.leverage([0.0, 1.0]) == pytest.approx(1e3), "never seen: the prior's 1 / ridge"


def test_forgetting_follows_a_change_of_law():
    fit = ForgettingNNLS(1, ridge=1e-6, forgetting=0.9)
    for _ in range(200):
        fit.update([1.0], 10.0)
    for _ in range(200):
        fit.update([1.0], 20.0)
    assert fit.theta[0] == pytest.approx(20.0, rel=1e-6)


@pytest.mark.parametrize(
    "x, y", [([1.0, 2.0], 1.0), ([1.0, 2.0, math.nan], 1.0), ([1.0, 2.0, 3.0], math.inf)]
)
def test_bad_samples_are_refused_and_change_nothing(x, y):
    fit = ForgettingNNLS(3)
    fit.update([1.0, 1.0, 1.0], 2.0)
    before = fit.state_dict()
    with pytest.raises(ValueError):
        fit.update(x, y)
    assert fit.state_dict() == before


@pytest.mark.parametrize(
    "change",
    [
        {"moment": [0.0, 0.0]},
        {"moment": [0.0, math.inf, 0.0]},
        {"gram": [[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]},  # not symmetric
        {"gram": [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]},  # negative diagonal
        {"gram": [[1.0, 5.0, 0.0], [5.0, 1.0, 0.0], [0.0, 0.0, 1.0]]},  # no sum of outer products
        {"num_samples": -1},
        {"num_samples": 1.5},
    ],
)
def test_a_malformed_state_is_refused(change):
    fit = ForgettingNNLS(3)
    with pytest.raises(ValueError):
        fit.parse_state({**fit.state_dict(), **change})


class NNLSMachine(RuleBasedStateMachine):
    """Random updates, saves and reloads: the invariants hold, a reload solves alike, and the solve matches
    the reference on every sample so far."""

    def __init__(self):
        super().__init__()
        self.fit = ForgettingNNLS(3, ridge=1e-2, forgetting=0.98)
        self.samples = []

    @rule(x=ROW, y=VALUES)
    def update(self, x, y):
        self.fit.update(x, y)
        self.samples.append((x, y))

    @rule()
    def save_and_reload(self):
        twin = self.fit.parse_state(self.fit.state_dict())
        # The optimum is unique (the ridge makes the objective strictly convex), but the reloaded fit solves
        # it cold and the live one from its last support: the two agree up to rounding.
        assert twin.theta == pytest.approx(self.fit.theta, rel=1e-9, abs=1e-12)
        self.fit = twin

    @invariant()
    def invariants_hold(self):
        self.fit.check()
        assert self.fit.num_samples == len(self.samples)

    @invariant()
    def solve_matches_the_reference(self):
        if self.samples:
            expected = reference(self.samples, 1e-2, 0.98)
            assert self.fit.theta == pytest.approx(list(expected), rel=1e-5, abs=1e-6)


TestNNLSMachine = NNLSMachine.TestCase
TestNNLSMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


@settings(max_examples=100, deadline=None)
@given(first=SAMPLES, more=SAMPLES)
def test_the_warm_started_solve_equals_a_fresh_enumeration(first, more):
    """After more samples the last support is tried first (kept if it meets the KKT conditions): the result is
    the one a fit that never solved before finds."""
    warm = ForgettingNNLS(3, ridge=1e-2, forgetting=0.97)
    for x, y in first:
        warm.update(x, y)
    assert all(t >= 0 for t in warm.theta)  # solved once: its support is kept for the next solve
    for x, y in more:
        warm.update(x, y)
    cold = warm.parse_state(warm.state_dict())
    assert warm.theta == pytest.approx(cold.theta, rel=1e-9, abs=1e-12)
