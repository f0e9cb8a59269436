import pytest

from sglang_feather.policy import (
    POLICIES,
    Decision,
    Observation,
    StoppingPolicy,
    learning_policy_names,
    make_policy,
    policy_names,
)


def test_registry_names():
    assert policy_names() == ["always", "qlearn", "static", "step-model", "ucb", "ucb-adaptive"]
    assert set(POLICIES) == set(policy_names())


def test_the_learning_stoppers_are_those_that_learn_from_the_reward():
    assert learning_policy_names() == ["ucb", "ucb-adaptive", "qlearn"]


@pytest.mark.parametrize("name", ["always", "static", "ucb", "qlearn", "ucb-adaptive", "step-model"])
def test_every_policy_follows_the_protocol(name):
    policy = make_policy(name, seed=3)
    assert isinstance(policy, StoppingPolicy)
    assert policy.name == name
    policy.begin_pass()
    obs = Observation(batch_size=0, depth_before=4, depth_after=4, num_sharing=0, num_waiting=1, wait_s=0.0)
    assert policy.decide(obs) is Decision.ADD
    assert policy.feedback([], 100.0) == 1.0


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"'lpm'.*always, qlearn, static, step-model, ucb, ucb-adaptive"):
        make_policy("lpm")


def test_unknown_option_lists_valid_options():
    with pytest.raises(ValueError, match=r"c for policy 'ucb'; valid options: exploration"):
        make_policy("ucb", c=200)
    with pytest.raises(ValueError, match=r"valid options: none"):
        make_policy("always", exploration=1.0)


def test_bad_option_values_are_rejected():
    with pytest.raises(ValueError, match="exploration"):
        make_policy("ucb", exploration=-1.0)
    with pytest.raises(ValueError, match="discount"):
        make_policy("qlearn", discount=1.5)
    with pytest.raises(ValueError, match="max_floor"):
        make_policy("static", min_floor=5, max_floor=2)
    with pytest.raises(ValueError, match="seed"):
        make_policy("qlearn", seed="0")


def test_options_reach_the_policy():
    assert make_policy("ucb", exploration=200.0).config.exploration == 200.0
    assert make_policy("static", max_chunk_loss=3).config.max_chunk_loss == 3
    assert make_policy("qlearn", trace=0.0).config.trace == 0.0
