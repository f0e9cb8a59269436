import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_feather.policy.change import PageHinkley, PageHinkleyConfig


def stream(rng, mean, sigma, n):
    return np.clip(mean + sigma * rng.standard_normal(n), 0.0, 1.0)


def first_alarm(detector, values):
    """1-based index of the first alarm in `values`, None if none."""
    for i, x in enumerate(values, start=1):
        if detector.update(float(x)):
            return i
    return None


@pytest.mark.parametrize("direction", [-0.3, 0.3])
@pytest.mark.parametrize("seed", range(10))
def test_detects_a_mean_shift_within_a_dozen_samples(seed, direction):
    """The defaults at the synthetic environments' per-decision noise (σ = 0.1) and arm flip (0.3): the
    docstring's "about 6-10 samples"."""
    rng = np.random.default_rng(seed)
    detector = PageHinkley()
    assert first_alarm(detector, stream(rng, 0.5, 0.1, 300)) is None
    delay = first_alarm(detector, stream(rng, 0.5 + direction, 0.1, 300))
    assert delay is not None and delay <= 12


def test_no_false_alarm_on_a_stationary_stream_at_the_stated_rate():
    """No alarm in 5 x 20,000 stationary samples at σ = 0.1 (the docstring's rate); at σ = 0.15, the widest
    per-(context, arm) spread measured on the synthetic environments but one, under 1 per 1,000 samples."""
    for sigma, max_alarms in ((0.1, 0), (0.15, 100)):
        alarms = 0
        for seed in range(5):
            detector = PageHinkley()
            alarms += sum(
                detector.update(float(x)) for x in stream(np.random.default_rng(seed), 0.5, sigma, 20_000)
            )
        assert alarms <= max_alarms, (sigma, alarms)


def test_a_shift_smaller_than_delta_is_tolerated():
    rng = np.random.default_rng(3)
    detector = PageHinkley(PageHinkleyConfig(delta=0.05, threshold=1.5))
    assert first_alarm(detector, stream(rng, 0.5, 0.02, 500)) is None
    assert first_alarm(detector, stream(rng, 0.53, 0.02, 5000)) is None


def test_no_alarm_before_min_samples_and_a_fresh_start_after_one():
    detector = PageHinkley(PageHinkleyConfig(delta=0.0, threshold=0.1, min_samples=5))
    assert [detector.update(x) for x in (0.0, 1.0, 0.0, 1.0)] == [False] * 4
    assert detector.update(1.0) is True
    assert detector.state_dict() == PageHinkley().state_dict()


@pytest.mark.parametrize(
    "options",
    [
        {"delta": -0.1},
        {"delta": float("nan")},
        {"threshold": 0.0},
        {"threshold": float("inf")},
        {"threshold": "1"},
        {"min_samples": 0},
        {"min_samples": 2.0},
    ],
)
def test_parameters_are_validated(options):
    with pytest.raises(ValueError, match="Page-Hinkley"):
        PageHinkleyConfig(**options)


def test_samples_are_validated():
    with pytest.raises(ValueError, match="finite"):
        PageHinkley().update(float("nan"))


@given(st.lists(st.floats(0.0, 1.0), max_size=60), st.lists(st.floats(0.0, 1.0), max_size=30))
def test_state_round_trip_continues_identically(head, tail):
    detector = PageHinkley(PageHinkleyConfig(threshold=0.5, min_samples=3))
    for x in head:
        detector.update(x)
    copy = PageHinkley(PageHinkleyConfig(threshold=0.5, min_samples=3))
    copy.load_state_dict(detector.state_dict())
    assert [copy.update(x) for x in tail] == [detector.update(x) for x in tail]
    assert copy.state_dict() == detector.state_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"num_samples": -1},
        {"num_samples": 1.5},
        {"mean": float("nan")},
        {"min_up": 1.0},
        {"extra": 0},
    ],
)
def test_malformed_state_is_refused_and_changes_nothing(change):
    detector = PageHinkley()
    for x in (0.2, 0.4):
        detector.update(x)
    before = detector.state_dict()
    with pytest.raises(ValueError):
        detector.load_state_dict({**before, **change})
    assert detector.state_dict() == before
