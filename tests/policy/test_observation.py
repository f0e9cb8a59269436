import math

import pytest

from sglang_feather.policy import Observation
from sglang_feather.policy.context import Context, context_of, is_forced


def obs(batch=5, before=10, after=7, sharing=3, waiting=4, wait=0.5):
    return Observation(batch, before, after, sharing, waiting, wait)


def test_delta():
    assert obs(before=10, after=7).delta == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch": -1},
        {"before": 3, "after": 4},
        {"sharing": -2},
        {"waiting": -1},
        {"wait": -0.1},
        {"wait": math.nan},
        {"wait": math.inf},
    ],
)
def test_invalid_observations_raise(kwargs):
    with pytest.raises(ValueError, match="Observation"):
        obs(**kwargs)


def test_context_discretisation_matches_the_authors():
    assert context_of(obs(batch=0, before=9, after=9, sharing=0)) == Context(0, 0, 0)
    assert context_of(obs(batch=7, before=10, after=7, sharing=4)) == Context(1, 3, 1)
    assert context_of(obs(batch=8, before=10, after=5, sharing=11)) == Context(2, 5, 2)
    assert context_of(obs(batch=500, before=90, after=2, sharing=1000)) == Context(10, 5, 10)
    assert context_of(obs(batch=43, before=90, after=84, sharing=39)) == Context(10, 5, 9)


def test_forced_cases():
    assert is_forced(obs(batch=0, before=6, after=6))
    assert is_forced(obs(batch=9, before=6, after=6))
    assert is_forced(obs(batch=9, before=0, after=0))
    assert not is_forced(obs(batch=9, before=6, after=5))


def new_group(batch=40, groups=5, new=64, waiting_peers=3, room=0.2, **kw):
    return Observation(
        batch,
        0,
        0,
        0,
        10,
        1.0,
        adds_group=True,
        num_groups_running=groups,
        num_running_chunks=300,
        num_new_chunks=new,
        num_missing=new,
        num_group_waiting=waiting_peers,
        kv_free_fraction=room,
        **kw,
    )


def test_a_candidate_that_adds_a_group_is_never_forced_unless_the_batch_is_empty():
    assert not is_forced(new_group())
    assert is_forced(new_group(batch=0))


def test_new_group_contexts_bucket_groups_kv_room_and_peers():
    assert context_of(new_group()) == Context(10, 0, 0, 3, 2, 2, 2)
    assert context_of(new_group(groups=1, new=200, waiting_peers=0, room=None)) == Context(
        10, 0, 0, 1, 4, 0, 1
    )
    assert context_of(new_group(groups=100, new=3, waiting_peers=40, room=0.05)) == Context(
        10, 0, 0, 6, 1, 1, 4
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_new_chunks": -1},
        {"kv_free_fraction": 1.5},
        {"kv_free_fraction": math.nan},
        {"oldest_wait_s": -1.0},
    ],
)
def test_invalid_cost_fields_raise(kwargs):
    with pytest.raises(ValueError, match="Observation"):
        Observation(1, 0, 0, 0, 1, 0.0, **kwargs)
