import math

import pytest

from sglang_feather.policy import Decision, DecisionRecord, Observation, make_policy
from sglang_feather.policy.context import Context


def obs(batch, delta, sharing=0, depth=30):
    return Observation(batch, depth, depth - delta, sharing, sharing + 1, 0.0)


def window(policy, records, reward_fraction, peak=1000.0):
    """Feed one window whose throughput is `reward_fraction` of a fixed peak (decay 1 keeps it exact)."""
    policy.normalizer.decay = 1.0
    policy.normalizer.peak = peak
    return policy.feedback(records, reward_fraction * peak)


def test_forced_cases_always_add_and_teach_nothing():
    policy = make_policy("ucb")
    forced = [obs(0, 0), obs(12, 0)]
    for o in forced:
        assert policy.decide(o) is Decision.ADD
    window(policy, [DecisionRecord(o, Decision.ADD) for o in forced], 0.1)
    assert policy.counts == {}


def test_untried_arms_first_add_then_stop():
    policy = make_policy("ucb")
    o = obs(9, 3)
    assert policy.decide(o) is Decision.ADD
    window(policy, [DecisionRecord(o, Decision.ADD)], 0.9)
    assert policy.decide(o) is Decision.STOP
    window(policy, [DecisionRecord(o, Decision.STOP)], 0.2)
    assert policy.counts[Context(2, 3, 0)] == [1, 1]
    assert policy.sums[Context(2, 3, 0)] == pytest.approx([0.9, 0.2])


def test_ucb_score_formula():
    policy = make_policy("ucb", exploration=0.5)
    o = obs(9, 3)
    ctx = Context(2, 3, 0)
    policy.counts[ctx] = [10, 2]
    policy.sums[ctx] = [7.0, 1.0]
    add = 0.7 + 0.5 * math.sqrt(math.log(13) / 10)
    stop = 0.5 + 0.5 * math.sqrt(math.log(13) / 2)
    assert stop > add
    assert policy.decide(o) is Decision.STOP
    assert policy.greedy(o) is Decision.ADD
    policy.sums[ctx] = [7.0, 0.6]
    assert 0.3 + 0.5 * math.sqrt(math.log(13) / 2) < add
    assert policy.decide(o) is Decision.ADD


def test_every_learnable_decision_of_the_window_gets_its_reward():
    policy = make_policy("ucb")
    records = [
        DecisionRecord(obs(8, 0), Decision.ADD),
        DecisionRecord(obs(9, 1), Decision.ADD),
        DecisionRecord(obs(10, 4, sharing=5), Decision.STOP),
    ]
    reward = window(policy, records, 0.6)
    assert reward == pytest.approx(0.6)
    assert policy.counts == {Context(2, 1, 0): [1, 0], Context(2, 4, 1): [0, 1]}
    assert policy.sums[Context(2, 4, 1)] == pytest.approx([0.0, 0.6])


def test_contexts_are_independent():
    policy = make_policy("ucb", exploration=0.0)
    hot, cold = obs(20, 5), obs(2, 5)
    for decision, reward in ((Decision.ADD, 0.2), (Decision.STOP, 0.8)):
        window(policy, [DecisionRecord(hot, decision)], reward)
    for decision, reward in ((Decision.ADD, 0.9), (Decision.STOP, 0.1)):
        window(policy, [DecisionRecord(cold, decision)], reward)
    assert policy.decide(hot) is Decision.STOP
    assert policy.decide(cold) is Decision.ADD
