"""Every request finishes exactly once and emits exactly its output length, under every policy."""

from __future__ import annotations

import pytest
from sim_helpers import ALL_POLICIES, run, small_gsp

from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.token_ratio import NewTokenRatio
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec


def _check(requests, log):
    finished = [r.rid for r in log.requests]
    assert sorted(finished) == sorted(r.rid for r in requests)
    assert len(set(finished)) == len(finished)
    by_rid = {r.rid: r for r in requests}
    assert all(r.output_len == by_rid[r.rid].output_len for r in log.requests)
    decode_tokens = sum(s.num_tokens for s in log.steps)
    first_tokens = sum(r.num_prefills for r in log.requests)
    assert decode_tokens + first_tokens >= sum(r.output_len for r in requests)
    for r in log.requests:
        assert r.arrival_s <= r.admit_s <= r.first_token_s <= r.finish_s


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_each_request_finishes_once(cost, policy):
    requests = small_gsp()
    log = run(requests, cost, policy)
    _check(requests, log)
    assert log.num_retractions == 0
    assert sum(s.num_tokens for s in log.steps) + len(requests) == sum(r.output_len for r in requests)


@pytest.mark.parametrize("policy", ["fcfs", "feather"])
@pytest.mark.parametrize("rate", [None, 50.0])
def test_conservation_under_retraction_chunking_and_poisson(cost, policy, rate):
    requests = small_gsp(seed=3, prompts_per_group=8, output_len=40, rate=rate)
    config = EngineConfig(
        kv_capacity_tokens=1500, new_token_ratio=NewTokenRatio.fixed(0.05), chunked_prefill_size=256
    )
    log = run(requests, cost, policy, config)
    _check(requests, log)
    assert log.num_retractions > 0
    assert log.max_cache_tokens <= 1500


def test_chat_followers_arrive_after_their_parent(cost):
    requests = make_workload(
        "chat",
        WorkloadConfig(
            SharedPrefixSpec(
                num_groups=1, num_requests=4, num_turns=3, prefix_len=100, question_len=10, output_len=8
            ),
            think_s=0.5,
        ),
    )
    log = run(requests, cost, "feather")
    _check(requests, log)
    done = {r.rid: r for r in log.requests}
    for r in requests:
        if r.follows is not None:
            assert done[r.rid].arrival_s == pytest.approx(done[r.follows].finish_s + 0.5)
