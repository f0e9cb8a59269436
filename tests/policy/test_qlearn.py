import numpy as np
import pytest

from sglang_feather.policy import Decision, DecisionRecord, Observation, make_policy
from sglang_feather.policy.context import context_of
from sglang_feather.policy.qlearn import split_passes


def obs(batch, delta, sharing=0, depth=30):
    return Observation(batch, depth, depth - delta, sharing, sharing + 1, 0.0)


def rec(o, decision="add"):
    return DecisionRecord(o, Decision(decision))


def feed(policy, records, reward):
    policy.normalizer.decay = 1.0
    policy.normalizer.peak = 1000.0
    return policy.feedback(records, reward * 1000.0)


def test_split_passes_at_stop_and_at_batch_jumps():
    a, b, c, d, e = rec(obs(3, 0)), rec(obs(4, 2)), rec(obs(5, 6), "stop"), rec(obs(6, 1)), rec(obs(2, 1))
    assert split_passes([a, b, c, d, e]) == [[a, b, c], [d], [e]]
    assert split_passes([]) == []


def test_terminal_decision_learns_the_window_reward():
    policy = make_policy("qlearn")
    o = obs(9, 4)
    feed(policy, [rec(o, "stop")], 0.3)
    assert policy.q[context_of(o)] == pytest.approx([1.0, 0.3])
    feed(policy, [rec(o, "stop")], 0.5)
    assert policy.q[context_of(o)] == pytest.approx([1.0, 0.4])


def test_add_is_valued_by_the_greedy_continuation():
    # First decision ADD, second (the next candidate of the same pass) explored a bad ADD. With λ = 1 the
    # first decision's target is the window reward corrected by the second state's greedy gap:
    # 0.2 + (max(Q2) - Q2[add]) = 0.2 + (0.7 - 0.1).
    policy = make_policy("qlearn")
    first, second = obs(8, 1), obs(9, 5)
    policy.q[context_of(second)] = [0.1, 0.7]
    policy.visits[context_of(second)] = [5, 5]
    feed(policy, [rec(first), rec(second)], 0.2)
    assert policy.q[context_of(first)][0] == pytest.approx(0.8)
    one_step = make_policy("qlearn", trace=0.0)
    one_step.q[context_of(second)] = [0.1, 0.7]
    one_step.visits[context_of(second)] = [5, 5]
    feed(one_step, [rec(first), rec(second)], 0.2)
    assert one_step.q[context_of(first)][0] == pytest.approx(0.7)


def test_forced_decisions_are_skipped_in_transitions():
    policy = make_policy("qlearn")
    first = obs(8, 2)
    feed(policy, [rec(first), rec(obs(9, 0)), rec(obs(10, 0))], 0.45)
    assert policy.q == {context_of(first): pytest.approx([0.45, 1.0])}


def test_epsilon_decays_per_state():
    policy = make_policy("qlearn", epsilon_start=0.3, epsilon_decay_visits=20.0, epsilon_min=0.01)
    o = obs(9, 4)
    assert policy.epsilon(context_of(o)) == pytest.approx(0.3)
    policy.visits[context_of(o)] = [10, 10]
    assert policy.epsilon(context_of(o)) == pytest.approx(0.15)
    policy.visits[context_of(o)] = [10_000, 0]
    assert policy.epsilon(context_of(o)) == pytest.approx(0.01)


def test_same_seed_same_decisions_other_seed_differs():
    def decisions(seed):
        policy = make_policy("qlearn", seed=seed, epsilon_min=0.5, epsilon_start=0.5)
        return [policy.decide(obs(9, 4)).value for _ in range(64)]

    assert decisions(7) == decisions(7)
    assert decisions(7) != decisions(8)
    assert {"add", "stop"} == set(decisions(7))


def test_rng_comes_from_numpy_seed():
    policy = make_policy("qlearn", seed=11)
    assert policy.rng.bit_generator.state == np.random.default_rng(11).bit_generator.state
