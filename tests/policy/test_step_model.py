"""The `step-model` stopper: a step-time model fitted on decode steps, throughput with and without a group."""

import random

import pytest

from sglang_feather.policy import (
    Decision,
    Observation,
    StepSample,
    learning_policy_names,
    make_policy,
    step_policy_names,
)
from sglang_feather.policy.step_model import step_features


def grouped_law(b, g, distinct, per_request):
    """A step of a kernel that reads each distinct chunk once (ms)."""
    return 10 + 0.05 * b + 0.3 * g + 0.02 * distinct


def plain_law(b, g, distinct, per_request):
    """A step of a kernel that reads every request's chunks (ms)."""
    return 10 + 0.05 * b + 0.02 * per_request


def trained(law, num_steps=300, **options):
    policy = make_policy("step-model", **options)
    rng = random.Random(0)
    for _ in range(num_steps):
        b, g = rng.randint(1, 256), rng.randint(1, 16)
        distinct, per_request = rng.randint(0, 4000), rng.randint(0, 40000)
        elapsed_s = law(b, g, distinct, per_request) / 1e3
        policy.observe_step(StepSample(b, elapsed_s, g, distinct, per_request))
    return policy


def new_group(batch, groups, peers=0, chunks=130):
    """A candidate bringing a prefix group of `chunks` chunks to a batch of `groups` groups of the same size."""
    return Observation(
        batch_size=batch,
        depth_before=0,
        depth_after=0,
        num_sharing=0,
        num_waiting=peers + 1,
        wait_s=0.0,
        adds_group=True,
        num_groups_running=groups,
        num_running_chunks=groups * chunks,
        num_new_chunks=chunks,
        num_group_waiting=peers,
        num_read_chunks=batch * chunks,
        num_chunks=chunks,
    )


def test_the_fit_recovers_the_step_law():
    policy = trained(grouped_law)
    assert policy.model.num_samples == 300
    for b, g, d, r in ((1, 1, 10, 10), (200, 8, 1040, 26000)):
        x = (b, g, d, r)
        assert policy.model.predict(step_features(*x)) == pytest.approx(grouped_law(*x), rel=1e-3)


def test_cold_it_adds_like_always():
    policy = trained(grouped_law, num_steps=31)
    assert policy.verdict(new_group(200, 8)) is None
    assert policy.decide(new_group(200, 8)) is Decision.ADD


def test_forced_cases_add_without_asking_the_model():
    policy = trained(grouped_law)
    running_group = Observation(200, 0, 0, 0, 1, 0.0, num_read_chunks=26000, num_chunks=130)
    assert policy.verdict(running_group) is None
    assert policy.verdict(new_group(0, 0)) is None


def test_a_lone_group_is_stopped_where_its_prefix_read_costs_more_than_its_token():
    """Grouped kernel, 200 requests in 8 groups: one more group's 130-chunk read lowers throughput ~5 %."""
    policy = trained(grouped_law)
    verdict = policy.verdict(new_group(200, 8))
    assert verdict.decision is Decision.STOP
    assert verdict.with_group < 0.98 * verdict.without
    assert verdict.num_joining == 1


def test_a_group_with_many_waiting_peers_is_added():
    """The same group with 20 requests waiting: they join behind it and share the read."""
    verdict = trained(grouped_law).verdict(new_group(200, 8, peers=20))
    assert verdict.decision is Decision.ADD and verdict.num_joining == 21


def test_a_small_batch_takes_a_new_group():
    """4 requests: the step's fixed cost dominates and the new request's token is worth its read."""
    assert trained(grouped_law).decide(new_group(4, 2)) is Decision.ADD


def test_a_per_request_kernel_never_pays_for_holding_a_group_back():
    """Every request reads its own prefix: a new group costs what any request costs, so it is added."""
    policy = trained(plain_law)
    for batch, groups in ((4, 2), (200, 8), (400, 32)):
        assert policy.decide(new_group(batch, groups)) is Decision.ADD


def test_a_larger_margin_stops_less():
    assert trained(grouped_law, margin=0.1).decide(new_group(200, 8)) is Decision.ADD


def test_state_round_trip_and_a_malformed_state_leaves_it_fresh():
    policy = trained(grouped_law)
    twin = make_policy("step-model")
    twin.load_state_dict(policy.state_dict())
    assert twin.verdict(new_group(200, 8)) == policy.verdict(new_group(200, 8))
    fresh = make_policy("step-model")
    bad = policy.state_dict()
    bad["model"] = {**bad["model"], "moment": [0.0]}
    with pytest.raises(ValueError):
        fresh.load_state_dict(bad)
    assert fresh.model.num_samples == 0


@pytest.mark.parametrize(
    "options",
    [
        {"min_samples": 0},
        {"margin": -0.1},
        {"margin": 1.5},
        {"forgetting": 0.0},
        {"ridge": 0.0},
        {"bogus": 1},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        make_policy("step-model", **options)


def test_it_is_listed_as_a_stopper_that_learns_from_steps():
    assert step_policy_names() == ["step-model"]
    assert "step-model" not in learning_policy_names(), "it learns nothing from the throughput reward"


@pytest.mark.parametrize("elapsed_s", [0.0, -1.0, float("nan")])
def test_a_step_without_a_positive_time_is_refused(elapsed_s):
    with pytest.raises(ValueError):
        StepSample(1, elapsed_s, 1, 1, 1)
