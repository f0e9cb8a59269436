"""N instances behind the SMG cache_aware model: the router's rules, and whole cluster runs that conserve requests."""

from __future__ import annotations

import pytest
from sim_helpers import ALL_POLICIES, h200_cost, small_gsp

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.cluster import ClusterConfig, LoadReports, simulate_cluster
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.router import CacheAwareRouter, InstanceLoad, RouterConfig
from sglang_feather.sim.run import RunSpec
from sglang_feather.sim.trace import TraceError

HASHES, ENDS = (11, 12, 13, 14), (16, 32, 48, 64)
OTHER = (21, 22, 23, 24)


def idle(num: int, **fields) -> list[InstanceLoad]:
    return [
        InstanceLoad(**{"in_flight": 0, "waiting": 0, "waiting_tokens": 0, "token_usage": 0.0, **fields})
    ] * num


def test_a_cache_miss_goes_to_the_least_waiting_work_and_its_prefix_then_sticks():
    router = CacheAwareRouter(3)
    loads = [InstanceLoad(5, 1, 900, 0.1), InstanceLoad(5, 1, 100, 0.1), InstanceLoad(1, 1, 500, 0.1)]
    assert router.route(HASHES, ENDS, 64, loads) == 1
    assert router.route(HASHES, ENDS, 64, idle(3)) == 1  # 64/64 matched > 0.3
    assert router.route(HASHES[:1] + OTHER[1:], ENDS, 64, idle(3)) == 0  # 16/64 = 0.25: a miss, least work
    assert router.branches == {"expected_wait_fallback": 2, "tree_match": 1}


def test_a_hot_holder_spills_to_a_cool_worker():
    """Hot: above 1.5 x the mean and the mean plus min(64, max(4, 2 sqrt(mean)))."""
    router = CacheAwareRouter(2)
    router.route(HASHES, ENDS, 64, idle(2))
    hot = [InstanceLoad(100, 0, 0, 0.1), InstanceLoad(10, 0, 0, 0.1)]  # mean 55: 100 > 82.5 and > 69.8
    assert router.route(HASHES, ENDS, 64, hot) == 1
    assert router.branches["spill"] == 1  # and worker 1 now holds the prefix too
    fresh = CacheAwareRouter(2)
    fresh.route(HASHES, ENDS, 64, idle(2))
    warm = [InstanceLoad(80, 0, 0, 0.1), InstanceLoad(30, 0, 0, 0.1)]  # mean 55: 80 < 82.5
    assert fresh.route(HASHES, ENDS, 64, warm) == 0


def test_an_overloaded_holder_is_left_out_while_another_is_not():
    router = CacheAwareRouter(2)
    router.route(HASHES, ENDS, 64, idle(2))
    queued = [InstanceLoad(9, 8, 0, 0.1), InstanceLoad(9, 7, 5000, 0.1)]  # 8 waiting: overloaded
    assert router.route(HASHES, ENDS, 64, queued) == 1
    assert router.route(HASHES, ENDS, 64, [queued[0], queued[0]]) == 0  # both overloaded: both eligible
    off = CacheAwareRouter(2, RouterConfig(overload_waiting_requests=None))
    off.route(HASHES, ENDS, 64, idle(2))
    assert off.route(HASHES, ENDS, 64, queued) == 0


def test_load_reports_are_read_every_poll_and_dispatches_credited_between():
    class Reporting:
        def __init__(self):
            self.waiting_tokens = 100

        def report(self):
            return InstanceLoad(0, 1, self.waiting_tokens, 0.2)

    instance = Reporting()
    reports = LoadReports([instance], poll_s=10.0)
    assert reports.loads(0.0, [3]) == [InstanceLoad(3, 1, 100, 0.2)]
    reports.credit(0, 50)
    instance.waiting_tokens = 7
    assert reports.loads(9.9, [4]) == [InstanceLoad(4, 1, 150, 0.2)]  # the old report, plus the credit
    assert reports.loads(10.0, [4]) == [InstanceLoad(4, 1, 7, 0.2)]  # a new report, credits cleared


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_request_is_placed_once_and_served(policy):
    requests = small_gsp(num_groups=6, prompts_per_group=5, rate=200.0)
    log = simulate_cluster(
        requests,
        h200_cost(),
        RunSpec(policy, AdmissionConfig()),
        ClusterConfig(num_instances=3),
        EngineConfig(),
    )
    served = sorted(r.rid for run in log.instances for r in run.requests)
    assert served == sorted(r.rid for r in requests) == sorted(log.placement)
    assert {log.placement[r.rid] for run_index, run in enumerate(log.instances) for r in run.requests} <= {
        0,
        1,
        2,
    }
    for index, run in enumerate(log.instances):
        assert all(log.placement[r.rid] == index for r in run.requests)
    assert log.num_groups == 6
    assert sum(log.branches.values()) == len(requests)


def test_a_client_limit_holds_requests_back_across_the_cluster():
    requests = small_gsp(num_groups=4, prompts_per_group=6)
    config = EngineConfig(max_concurrency=4)
    log = simulate_cluster(requests, h200_cost(), RunSpec("fcfs"), ClusterConfig(num_instances=2), config)
    spans = sorted((r.arrival_s, r.finish_s) for run in log.instances for r in run.requests)
    for t, _ in spans:
        assert sum(a <= t < f for a, f in spans) <= 4


def test_chat_turns_are_refused():
    requests = small_gsp()
    chained = [requests[0], type(requests[1])(**{**requests[1].__dict__, "follows": requests[0].rid})]
    with pytest.raises(TraceError, match="chat turns"):
        simulate_cluster(chained, h200_cost(), RunSpec("fcfs"), ClusterConfig(num_instances=2))
