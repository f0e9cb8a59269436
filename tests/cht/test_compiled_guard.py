"""The compiled aging guard (guard.h) against the Python `AgingGuard`, its reference model, call for call."""

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sglang_feather.policy import AgingGuard
from tests.cht.conftest import native_tree

WAITS = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0, 9.5, 10.0, 30.0]),  # repeats: equal waits in the sorted window
    st.floats(min_value=0.0, max_value=200.0, allow_nan=False),
)


def compiled_guard_type():
    native_tree()  # fails loudly (or skips under SGLANG_FEATHER_CHT=python) when the core is not built
    from sglang_feather.cht._native._core import AgingGuard as CompiledGuard

    return CompiledGuard


def state(guard) -> tuple:
    return (
        guard.max_wait_s,
        guard.when_overtaken,
        guard.enabled,
        guard.lead_s,
        guard.due_wait_s,
        guard.bound_wait_s,
        guard.serves_early,
    )


class GuardTwins(RuleBasedStateMachine):
    """One Python and one compiled guard fed the same calls; every query must agree to the bit."""

    @initialize(
        max_wait_s=st.sampled_from([None, 1.0, 10.0, 60.0, 300.0]),
        when_overtaken=st.booleans(),
    )
    def start(self, max_wait_s, when_overtaken):
        self.twins = [
            AgingGuard(max_wait_s, when_overtaken),
            compiled_guard_type()(max_wait_s, when_overtaken),
        ]
        self.num_calls = 0

    @rule(wait_s=WAITS)
    def served(self, wait_s):
        for guard in self.twins:
            guard.served(wait_s)

    @rule(waits=st.lists(WAITS, max_size=20))
    def served_all(self, waits):
        for guard in self.twins:
            guard.served_all(waits)

    @rule(wait_s=WAITS, stranger=st.booleans())
    def admitted(self, wait_s, stranger):
        for guard in self.twins:
            guard.admitted(wait_s, stranger)

    @precondition(lambda self: self.num_calls < 3)
    @rule()
    def clone(self):
        """Go on with clones; the originals must not see what the clones are fed."""
        self.num_calls += 1
        originals = self.twins
        self.twins = [guard.clone() for guard in originals]
        for guard in self.twins:
            guard.served_all([0.0] * 20)
        for guard in originals:
            guard.served(1.0)
        assert state(originals[0]) == state(originals[1])
        assert state(self.twins[0]) == state(self.twins[1])

    @rule(wait_s=WAITS, limit=st.integers(min_value=0, max_value=40))
    def queries(self, wait_s, limit):
        python, compiled = self.twins
        assert python.is_starved(wait_s) == compiled.is_starved(wait_s)
        assert python.reached_bound(wait_s) == compiled.reached_bound(wait_s)
        assert python.num_not_due(wait_s, limit) == compiled.num_not_due(wait_s, limit)
        assert python.num_until_early(limit) == compiled.num_until_early(limit)

    @invariant()
    def same_state(self):
        if hasattr(self, "twins"):
            assert state(self.twins[0]) == state(self.twins[1])
            assert repr(self.twins[0]) == repr(self.twins[1])


TestGuardTwins = GuardTwins.TestCase
TestGuardTwins.settings = settings(max_examples=120, stateful_step_count=60, deadline=None)


def test_the_compiled_guard_refuses_what_the_python_one_refuses():
    compiled = compiled_guard_type()
    for bad in (0, -1.0, math.inf, math.nan, "300", [300]):
        with pytest.raises(ValueError, match="must be a finite number > 0 or None") as python_error:
            AgingGuard(bad)
        with pytest.raises(ValueError) as compiled_error:
            compiled(bad)
        assert str(compiled_error.value) == str(python_error.value)
    for query in ("is_starved", "reached_bound"):
        with pytest.raises(ValueError, match=f"AgingGuard.{query}: wait_s is NaN"):
            getattr(compiled(5.0), query)(math.nan)
