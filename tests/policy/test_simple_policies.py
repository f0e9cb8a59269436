import itertools

import pytest

from sglang_feather.policy import Decision, DecisionRecord, Observation, make_policy
from sglang_feather.policy.static import StaticConfig, StaticPolicy


def obs(batch, delta, sharing=0, depth=40):
    return Observation(batch, depth, depth - delta, sharing, 5, 0.0)


def test_always_never_stops():
    policy = make_policy("always")
    for batch, delta, sharing in itertools.product(range(0, 60, 7), range(0, 40, 3), (0, 9, 50)):
        policy.begin_pass()
        o = Observation(batch, 40, 40 if batch == 0 else 40 - delta, sharing, sharing + 1, 1e6)
        assert policy.decide(o) is Decision.ADD
    policy.feedback([DecisionRecord(obs(3, 30), Decision.ADD)], 10.0)
    assert policy.decide(obs(300, 39)) is Decision.ADD


def decide_all(policy, observations):
    policy.begin_pass()
    return [policy.decide(o).value for o in observations]


def test_static_first_request_always_admitted():
    assert decide_all(StaticPolicy(), [Observation(0, 3, 3, 0, 1, 0.0)]) == ["add"]


def test_static_ceiling_is_five_chunks_and_seven_with_ten_sharing():
    # A fresh policy (floor 1) at batch 1: only the ceiling matters.
    cases = {(5, 0): "add", (6, 0): "stop", (6, 9): "stop", (6, 10): "add", (7, 10): "add", (8, 10): "stop"}
    for (delta, sharing), expected in cases.items():
        assert decide_all(StaticPolicy(), [obs(1, delta, sharing=sharing)]) == [expected]


def test_static_floor_persists_across_passes_by_default():
    # The authors' code: the floor rises by one per homogeneous admission (not for the first request of an
    # empty batch), caps at 10 and is never reset, so a mismatched candidate gets in while batch < floor.
    policy = StaticPolicy()
    assert decide_all(policy, [obs(0, 0), obs(1, 0), obs(2, 1), obs(3, 9)]) == ["add", "add", "add", "stop"]
    assert policy.floor == 3
    assert decide_all(policy, [obs(2, 9)]) == ["add"]
    assert policy.floor == 3
    assert decide_all(policy, [obs(3, 9)]) == ["stop"]
    assert decide_all(policy, [obs(b, 5) for b in range(3, 20)]) == ["add"] * 17
    assert policy.floor == 10
    assert decide_all(policy, [obs(9, 30)]) == ["add"]
    assert decide_all(policy, [obs(10, 30)]) == ["stop"]


def test_static_floor_per_pass_resets_and_never_opens_for_a_growing_batch():
    policy = StaticPolicy(StaticConfig(floor_per_pass=True))
    assert decide_all(policy, [obs(b, 1) for b in range(1, 15)]) == ["add"] * 14
    assert policy.floor == 10
    assert policy.decide(obs(9, 20)) is Decision.ADD
    policy.begin_pass()
    assert policy.floor == 1
    for start in range(0, 4):
        seq = [obs(start + k, 0) for k in range(5)] + [obs(start + 5, 6)]
        assert decide_all(policy, seq) == ["add"] * 5 + ["stop"]


def test_static_custom_constants():
    policy = StaticPolicy(StaticConfig(max_chunk_loss=0, max_chunk_loss_lenient=1, high_load_sharing=2))
    assert decide_all(policy, [obs(1, 1)]) == ["stop"]
    assert decide_all(policy, [obs(1, 1, sharing=2)]) == ["add"]


def test_static_ignores_feedback():
    policy = StaticPolicy(StaticConfig(floor_per_pass=True))
    before = decide_all(policy, [obs(1, 0), obs(2, 6), obs(2, 6)])
    policy.feedback([DecisionRecord(obs(1, 6), Decision.STOP)], 123.0)
    assert decide_all(policy, [obs(1, 0), obs(2, 6), obs(2, 6)]) == before == ["add", "stop", "stop"]


def _new_group_obs(groups, peers):
    return Observation(
        20,
        0,
        0,
        0,
        5,
        0.0,
        adds_group=True,
        num_groups_running=groups,
        num_new_chunks=64,
        num_group_waiting=peers,
    )


def test_static_caps_the_groups_a_decode_step_reads():
    capped = make_policy("static", max_groups=4)
    assert capped.decide(_new_group_obs(groups=3, peers=0)) is Decision.ADD
    assert capped.decide(_new_group_obs(groups=4, peers=0)) is Decision.STOP
    assert make_policy("static").decide(_new_group_obs(groups=400, peers=0)) is Decision.ADD, "off by default"


def test_static_holds_back_a_group_too_small_for_an_attention_window():
    policy = make_policy("static", min_new_group=27)
    assert policy.decide(_new_group_obs(groups=3, peers=25)) is Decision.STOP
    assert policy.decide(_new_group_obs(groups=3, peers=26)) is Decision.ADD


@pytest.mark.parametrize("options", [{"max_groups": 0}, {"min_new_group": 0}, {"max_groups": 2.5}])
def test_static_new_group_options_are_checked(options):
    with pytest.raises(ValueError, match="static option"):
        make_policy("static", **options)
