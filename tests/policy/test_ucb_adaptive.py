import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sglang_feather.policy import Decision, DecisionRecord, Observation, make_policy
from sglang_feather.policy.change import PageHinkley, PageHinkleyConfig
from sglang_feather.policy.context import context_of, is_forced
from sglang_feather.policy.shifts import PHASES, run_shifts
from sglang_feather.policy.tables import ARM_INDEX


def obs(batch, delta, sharing=0, depth=30):
    return Observation(
        batch_size=batch,
        depth_before=depth,
        depth_after=depth - delta,
        num_sharing=sharing,
        num_waiting=sharing + 1,
        wait_s=0.0,
    )


def window(policy, records, reward_fraction, peak=1000.0):
    """Feed one window whose reward is exactly `reward_fraction` (a fixed peak, decay 1)."""
    policy.normalizer.decay = 1.0
    policy.normalizer.peak = peak
    return policy.feedback(records, reward_fraction * peak)


def test_forced_cases_add_and_teach_nothing():
    policy = make_policy("ucb-adaptive")
    forced = [o for o in (obs(0, 0), obs(12, 0), obs(0, 3)) if is_forced(o)]
    assert forced
    for o in forced:
        assert policy.decide(o) is Decision.ADD
    window(policy, [DecisionRecord(o, Decision.ADD) for o in forced], 0.1)
    assert policy.counts == {} and policy.detectors == {}


def test_untried_arms_add_first_then_stop_then_the_discounted_ucb_score():
    policy = make_policy("ucb-adaptive", discount=0.5, exploration=0.5)
    o = obs(9, 3)
    ctx = context_of(o)
    assert policy.decide(o) is Decision.ADD
    window(policy, [DecisionRecord(o, Decision.ADD)], 0.9)
    assert policy.decide(o) is Decision.STOP
    window(policy, [DecisionRecord(o, Decision.STOP)], 0.2)
    # ADD's sample was discounted once by the STOP update: counts [0.5, 1], sums [0.45, 0.2].
    assert policy.counts[ctx] == pytest.approx([0.5, 1.0])
    assert policy.sums[ctx] == pytest.approx([0.45, 0.2])
    add = 0.9 + 0.5 * math.sqrt(math.log(2.5) / 0.5)
    stop = 0.2 + 0.5 * math.sqrt(math.log(2.5) / 1.0)
    assert add > stop
    assert policy.decide(o) is Decision.ADD
    assert policy.greedy(o) is Decision.ADD


def test_discount_bounds_the_memory():
    policy = make_policy("ucb-adaptive", discount=0.9, detector_threshold=1e9)
    o = obs(9, 3)
    for _ in range(500):
        window(policy, [DecisionRecord(o, Decision.ADD)], 0.5)
    total = sum(policy.counts[context_of(o)])
    assert total == pytest.approx(1 / (1 - 0.9), rel=1e-6)


def test_a_shift_restarts_only_its_context():
    policy = make_policy("ucb-adaptive", exploration=0.0)
    shifted, calm = obs(20, 5), obs(4, 2)
    for _ in range(40):
        window(policy, [DecisionRecord(shifted, Decision.ADD), DecisionRecord(calm, Decision.ADD)], 0.8)
    calm_counts = list(policy.counts[context_of(calm)])
    for _ in range(12):
        window(policy, [DecisionRecord(shifted, Decision.ADD)], 0.1)
    assert policy.num_restarts == 1
    assert sum(policy.counts[context_of(shifted)]) < 12
    assert policy.counts[context_of(calm)] == calm_counts


def test_stationary_ucb_keeps_the_stale_arm_where_the_adaptive_one_moves_on():
    """ADD paid 0.8 for 300 windows, then pays 0.2 while STOP pays 0.5: after 60 more windows the adaptive
    stopper has restarted and prefers STOP; UCB1 still averages 300 old samples into ADD."""
    o = obs(20, 5)
    stopper = {name: make_policy(name) for name in ("ucb", "ucb-adaptive")}
    for policy in stopper.values():
        for i in range(300):
            decision = Decision.STOP if i % 50 == 0 else Decision.ADD
            window(policy, [DecisionRecord(o, decision)], 0.8 if decision is Decision.ADD else 0.5)
        for _ in range(60):
            decision = policy.decide(o)
            window(policy, [DecisionRecord(o, decision)], 0.2 if decision is Decision.ADD else 0.5)
    assert stopper["ucb-adaptive"].greedy(o) is Decision.STOP
    assert stopper["ucb"].greedy(o) is Decision.ADD


@pytest.mark.parametrize(
    "options",
    [
        {"discount": 0.0},
        {"discount": 1.5},
        {"exploration": -1.0},
        {"detector_threshold": 0.0},
        {"detector_min_samples": 0},
        {"detector_delta": float("nan")},
    ],
)
def test_options_are_validated(options):
    with pytest.raises(ValueError, match="ucb-adaptive"):
        make_policy("ucb-adaptive", **options)


def test_malformed_state_leaves_the_policy_fresh():
    policy = make_policy("ucb-adaptive")
    window(policy, [DecisionRecord(obs(9, 3), Decision.ADD)], 0.5)
    good = policy.state_dict()
    fresh = make_policy("ucb-adaptive")
    for bad in (
        {**good, "num_restarts": -1},
        {**good, "counts": [[2, 3, 0, -1.0, 0.0]]},
        {**good, "detectors": [{"context": [2, 3, 0], "arms": [{}]}]},
        {**good, "detectors": good["detectors"] * 2},
        {**good, "sums": []},
    ):
        with pytest.raises((KeyError, TypeError, ValueError)):
            fresh.load_state_dict(bad)
        assert fresh.counts == {} and fresh.detectors == {} and fresh.num_restarts == 0


observations = st.builds(
    lambda batch, before, cut, sharing: obs(batch, min(cut, before), sharing, depth=before),
    st.integers(0, 12),
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(0, 9),
)

GAMMA = 0.9
DETECTOR = PageHinkleyConfig(delta=0.05, threshold=0.6, min_samples=2)


class AdaptiveUCBMachine(RuleBasedStateMachine):
    """The policy's discounted tables against a model that keeps every (arm, reward) of each context since
    its last restart and recomputes the discounted counts and sums from scratch (restarts decided by the
    model's own detectors, `PageHinkley` being tested on its own)."""

    def __init__(self):
        super().__init__()
        self.policy = make_policy(
            "ucb-adaptive",
            discount=GAMMA,
            detector_delta=DETECTOR.delta,
            detector_threshold=DETECTOR.threshold,
            detector_min_samples=DETECTOR.min_samples,
        )
        self.policy.normalizer.decay = 1.0
        self.policy.normalizer.peak = 1.0
        self.history = {}
        self.detectors = {}
        self.restarts = 0

    @rule(observation=observations)
    def decide_forced_adds(self, observation):
        decision = self.policy.decide(observation)
        counts = self.policy.counts.get(context_of(observation))
        if is_forced(observation):
            assert decision is Decision.ADD
        elif counts is not None and min(counts) == 0:
            assert decision is (Decision.ADD if counts[0] == 0 else Decision.STOP)

    @rule(
        records=st.lists(st.tuples(observations, st.sampled_from(list(Decision))), max_size=6),
        reward=st.floats(0.0, 1.0),
    )
    def feedback(self, records, reward):
        reward = self.policy.feedback([DecisionRecord(o, d) for o, d in records], reward)
        for o, d in records:
            if is_forced(o):
                continue
            ctx, arm = context_of(o), ARM_INDEX[d]
            pair = self.detectors.setdefault(ctx, (PageHinkley(DETECTOR), PageHinkley(DETECTOR)))
            if pair[arm].update(reward):
                self.history[ctx] = []
                for detector in pair:
                    detector.reset()
                self.restarts += 1
            self.history.setdefault(ctx, []).append((arm, reward))

    @rule()
    def save_and_reload(self):
        copy = make_policy(
            "ucb-adaptive",
            discount=GAMMA,
            detector_delta=DETECTOR.delta,
            detector_threshold=DETECTOR.threshold,
            detector_min_samples=DETECTOR.min_samples,
        )
        copy.load_state_dict(self.policy.state_dict())
        assert copy.state_dict() == self.policy.state_dict()
        self.policy = copy

    @invariant()
    def tables_match_the_model(self):
        policy = self.policy
        assert policy.num_restarts == self.restarts
        assert set(policy.counts) == set(policy.sums) == {c for c, h in self.history.items() if h}
        for ctx, history in self.history.items():
            if not history:
                continue
            n = len(history)
            counts, sums = [0.0, 0.0], [0.0, 0.0]
            for k, (arm, reward) in enumerate(history):
                counts[arm] += GAMMA ** (n - 1 - k)
                sums[arm] += reward * GAMMA ** (n - 1 - k)
            assert policy.counts[ctx] == pytest.approx(counts, abs=1e-9)
            assert policy.sums[ctx] == pytest.approx(sums, abs=1e-9)
            assert sum(policy.counts[ctx]) < 1 / (1 - GAMMA) + 1e-9
            for s, c in zip(policy.sums[ctx], policy.counts[ctx], strict=True):
                assert -1e-12 <= s <= c + 1e-12
            for mine, model in zip(policy.detectors[ctx], self.detectors[ctx], strict=True):
                assert mine.state_dict() == pytest.approx(model.state_dict())


TestAdaptiveUCBMachine = AdaptiveUCBMachine.TestCase
TestAdaptiveUCBMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("seed", [0, 1])
def test_follows_the_synthetic_phase_shifts_where_ucb_does_not(seed):
    """policy/shifts.py's three phases (grouped -> homogeneous -> lenient, 3,000 episodes each): regret
    against each phase's optimal rule, and the learnable decisions until 90 % of a window of 200 match it."""
    ucb, adaptive = run_shifts("ucb", seed), run_shifts("ucb-adaptive", seed)
    assert len(adaptive.regrets) == sum(n for _, _, n in PHASES)
    # The price of adaptivity on the first, stationary phase is small ...
    assert adaptive.phase_regret(0) < 1.3 * ucb.phase_regret(0)
    # ... the ADD -> STOP flip is followed within a few hundred decisions, UCB1 needs thousands ...
    assert adaptive.decisions_to_adapt(1) < 600 < 2000 < ucb.decisions_to_adapt(1)
    assert adaptive.phase_regret(1) < 0.4 * ucb.phase_regret(1)
    # ... the STOP -> ADD flip (rarely sampled arm) is slower, but followed within the phase.
    assert adaptive.decisions_to_adapt(2) is not None
    assert adaptive.phase_regret(2) < ucb.phase_regret(2)
    assert adaptive.regrets.sum() < 0.8 * ucb.regrets.sum()
