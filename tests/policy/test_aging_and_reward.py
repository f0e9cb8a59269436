import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_feather.policy import DEFAULT_MAX_WAIT_S, AgingGuard, RewardNormalizer
from sglang_feather.policy.aging import EARLY_EVERY, LEAD_WINDOW, _median


def test_aging_guard_fires_at_the_bound_and_not_before():
    guard = AgingGuard(30.0)
    assert not guard.is_starved(0.0)
    assert not guard.is_starved(math.nextafter(30.0, 0.0))
    assert guard.is_starved(30.0)
    assert guard.is_starved(1e9)


def test_the_lead_is_the_longest_recent_delay_and_at_most_half_the_bound():
    guard = AgingGuard(100.0)
    guard.admitted(130.0)
    assert guard.lead_s == 30.0 and guard.is_starved(70.0) and not guard.is_starved(69.9)
    guard.admitted(80.0)
    assert guard.lead_s == 30.0, "the window's longest delay"
    guard.admitted(500.0)
    assert guard.lead_s == 50.0, "capped at half the bound"
    off = AgingGuard(None)
    off.admitted(1e9)
    assert off.lead_s == 0.0 and not off.is_starved(1e12)


def test_a_request_is_due_once_it_waited_longer_than_the_median_recent_admission():
    guard = AgingGuard(100.0)
    for wait in range(LEAD_WINDOW - 1):
        guard.served(float(wait))
    assert guard.due_wait_s == 100.0, "not before a whole window of admissions was seen"
    guard.served(1000.0)
    assert guard.due_wait_s == (LEAD_WINDOW // 2 - 1 + LEAD_WINDOW // 2) / 2
    assert guard.is_starved(guard.due_wait_s) and not guard.is_starved(guard.due_wait_s - 0.01)
    for _ in range(LEAD_WINDOW):
        guard.served(0.5)
    assert guard.due_wait_s == 0.5, "the window slides"
    for _ in range(LEAD_WINDOW):
        guard.served(250.0)
    assert guard.due_wait_s == 100.0, "never later than the bound"
    bound_only = AgingGuard(100.0, when_overtaken=False)
    for _ in range(LEAD_WINDOW):
        bound_only.served(0.5)
    assert bound_only.due_wait_s == 100.0


def test_an_overtaken_admission_closes_the_rule_for_a_run_of_admissions():
    guard = AgingGuard(100.0)
    guard.served_all([1.0] * LEAD_WINDOW)
    assert guard.due_wait_s == 1.0
    guard.admitted(1.0)  # due by the overtaken rule alone (1 s < the 100 s bound), admitted at once
    guard.served(1.0)
    assert guard.due_wait_s == 100.0, "closed: no more overtaken admissions for a while"
    guard.served_all([1.0] * (EARLY_EVERY - 2))
    assert guard.due_wait_s == 100.0, "one admission short of EARLY_EVERY"
    guard.served(1.0)
    assert guard.due_wait_s == 1.0, "at most one admission in EARLY_EVERY is an overtaken one"
    guard.admitted(100.0)  # due by the bound: the budget is shared, so the overtaken rule closes too
    guard.served(100.0)
    assert guard.due_wait_s == guard.bound_wait_s and not guard.serves_early


def test_the_guard_serves_at_most_one_admission_in_early_every_bound_included():
    for when_overtaken in (True, False):
        guard = AgingGuard(100.0, when_overtaken=when_overtaken)
        assert guard.serves_early and guard.num_until_early(5) == 0, "the budget starts open"
        guard.admitted(150.0, stranger=False)  # past the bound
        guard.served(150.0)
        assert not guard.serves_early
        assert guard.num_until_early(100) == EARLY_EVERY - 1
        assert guard.num_until_early(3) == 3
        guard.served_all([1.0] * (EARLY_EVERY - 2))
        assert not guard.serves_early and guard.num_until_early(100) == 1
        guard.served(1.0)
        assert guard.serves_early and guard.num_until_early(100) == 0


def test_aging_guard_default_and_off():
    assert AgingGuard().max_wait_s == DEFAULT_MAX_WAIT_S == 300.0
    off = AgingGuard(None)
    assert not off.enabled
    assert not off.is_starved(1e12)


@pytest.mark.parametrize("bound", [0.0, -1.0, math.inf, math.nan, "60"])
def test_aging_guard_rejects_bad_bounds(bound):
    with pytest.raises(ValueError, match="max_wait_s"):
        AgingGuard(bound)


def test_aging_guard_rejects_nan_wait():
    with pytest.raises(ValueError, match="NaN"):
        AgingGuard(5.0).is_starved(math.nan)


def test_normalizer_divides_by_the_running_peak():
    norm = RewardNormalizer(decay=1.0)
    assert norm.update(2000.0) == 1.0
    assert norm.update(1000.0) == 0.5
    assert norm.update(4000.0) == 1.0
    assert norm.update(1000.0) == 0.25
    assert norm.num_windows == 4


def test_normalizer_is_scale_free():
    fast, slow = RewardNormalizer(), RewardNormalizer()
    series = [3.0, 5.0, 4.0, 1.0, 5.5, 2.0]
    assert [fast.update(20_000 * x) for x in series] == pytest.approx([slow.update(300 * x) for x in series])


def test_normalizer_peak_decays_so_a_slower_machine_recovers():
    norm = RewardNormalizer(decay=0.5)
    norm.update(1000.0)
    rewards = [norm.update(100.0) for _ in range(6)]
    assert rewards[0] == pytest.approx(0.2)
    assert rewards[-1] == 1.0
    assert all(0.0 <= r <= 1.0 for r in rewards)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "10"])
def test_normalizer_rejects_bad_throughput_without_changing_state(bad):
    norm = RewardNormalizer()
    norm.update(10.0)
    with pytest.raises(ValueError, match="throughput"):
        norm.update(bad)
    assert norm.state_dict() == {"peak": 10.0, "num_windows": 1}


def test_normalizer_zero_throughput():
    norm = RewardNormalizer()
    assert norm.update(0.0) == 0.0
    assert norm.update(50.0) == 1.0


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=LEAD_WINDOW))
def test_the_guards_median_is_statistics_median(waits):
    assert _median(sorted(waits)) == statistics.median(waits)


@given(
    st.lists(
        st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=2 * LEAD_WINDOW + 1), max_size=12
    )
)
def test_the_due_wait_follows_the_median_of_the_last_served_waits(runs):
    """However the waits arrive (one by one or in runs, short or past the window), the due wait is the
    bound or, once the window is full, the median of the last LEAD_WINDOW served waits (brute force)."""
    guard = AgingGuard(1e9)
    served: list[float] = []
    for i, waits in enumerate(runs):
        if i % 2:
            guard.served_all(waits)
        else:
            for wait in waits:
                guard.served(wait)
        served += waits
        twin = guard.clone()
        last = served[-LEAD_WINDOW:]
        expected = statistics.median(last) if len(last) == LEAD_WINDOW else 1e9
        assert guard.due_wait_s == min(1e9, expected) == twin.due_wait_s
        assert guard._ordered == sorted(last)


_GUARD_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("served"), st.floats(0, 200, allow_nan=False)),
        st.tuples(
            st.just("served_all"), st.lists(st.floats(0, 200, allow_nan=False), max_size=LEAD_WINDOW + 3)
        ),
        st.tuples(st.just("aged"), st.floats(0, 200, allow_nan=False)),
    ),
    max_size=60,
)


@given(_GUARD_STEPS)
def test_the_guard_matches_a_brute_force_model(steps):
    """Served waits, runs of them and aged admissions in any order: the due wait is `bound - lead`, or the
    median of the last LEAD_WINDOW served waits when that is sooner, the window is full and none of the last
    EARLY_EVERY admissions was an aged one (a model that keeps every event)."""
    bound = 100.0
    guard = AgingGuard(bound)
    served: list[float] = []
    delays: list[float] = []
    last_aged: int | None = None  # index in `served` of the last aged admission
    for kind, value in steps:
        if kind == "served":
            guard.served(value)
            served.append(value)
        elif kind == "served_all":
            guard.served_all(value)
            served += value
        else:
            due, lead = guard.due_wait_s, min(max(delays, default=0.0), bound / 2)
            guard.admitted(value)
            guard.served(value)
            last_aged = len(served)
            delays.append(max(0.0, value - due))
            served.append(value)
        lead = min(max(delays[-LEAD_WINDOW:], default=0.0), bound / 2)
        expected = bound - lead
        window = served[-LEAD_WINDOW:]
        since = len(served) - (-EARLY_EVERY if last_aged is None else last_aged)
        if len(window) == LEAD_WINDOW and since >= EARLY_EVERY:
            expected = min(expected, statistics.median(window))
        assert guard.lead_s == lead
        assert guard.due_wait_s == expected
        assert guard.clone().due_wait_s == expected
        assert guard.serves_early == (since >= EARLY_EVERY)


@given(
    _GUARD_STEPS,
    st.floats(0, 200, allow_nan=False),
    st.integers(0, 2 * LEAD_WINDOW),
    st.lists(st.floats(0, 1, allow_nan=False), min_size=2 * LEAD_WINDOW, max_size=2 * LEAD_WINDOW),
)
def test_num_not_due_holds_for_any_waits_and_is_tight_for_the_shortest(steps, wait, limit, fractions):
    """`num_not_due(wait, limit)` = k: after any k-1 served waits no longer than `wait`, a request that waited
    `wait` is still not due before each of the k admissions; and when k < limit, k waits shorter than every one
    the guard kept make it due (so k is the most a planned pass can take without a due check)."""
    guard = AgingGuard(100.0)
    for kind, value in steps:
        if kind == "served":
            guard.served(value)
        elif kind == "served_all":
            guard.served_all(value)
        else:
            guard.admitted(value)
            guard.served(value)
    k = guard.num_not_due(wait, limit)
    assert 0 <= k <= limit
    twin = guard.clone()
    for i in range(k):
        assert not twin.is_starved(wait), f"due before admission {i} of {k}"
        twin.served(wait * fractions[i])
    if k < limit:
        shortest = guard.clone()
        for _ in range(k):
            shortest.served(-1e18)
        assert shortest.is_starved(wait), "the count stops where the shortest waits would make it due"


def test_num_not_due_without_a_guard_or_the_overtaken_rule():
    assert AgingGuard(None).num_not_due(1e9, 7) == 7
    guard = AgingGuard(10.0, when_overtaken=False)
    for _ in range(LEAD_WINDOW):
        guard.served(0.0)
    assert guard.num_not_due(9.0, 7) == 7 and guard.num_not_due(10.0, 7) == 0
