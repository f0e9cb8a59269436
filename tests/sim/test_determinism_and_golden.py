"""Same seed, same run (CPU time fixed); small traces whose timelines follow from the cost model by hand."""

from __future__ import annotations

import pytest
from sim_helpers import request, run, small_gsp

from sglang_feather.sim.cost import KVSplit
from sglang_feather.sim.engine import EngineConfig


@pytest.mark.parametrize("policy", ["fcfs", "feather"])
def test_same_seed_gives_identical_runs(cost, policy):
    a = run(small_gsp(seed=7, rate=40.0), cost, policy, cpu_s=1e-4, stopper="ucb")
    b = run(small_gsp(seed=7, rate=40.0), cost, policy, cpu_s=1e-4, stopper="ucb")
    assert a.steps == b.steps and a.requests == b.requests
    c = run(small_gsp(seed=8, rate=40.0), cost, policy, cpu_s=1e-4, stopper="ucb")
    assert c.requests != a.requests


def test_single_request_timeline(cost):
    log = run([request("r", [("p", 100)], output_len=4)], cost, "feather", cpu_s=0.0)
    prefill = cost.prefill_s([100], [0])
    # the prefill samples token 1; decode steps 2..4 read 100 prompt tokens plus the outputs so far
    decode = sum(cost.decode_s(1, KVSplit(100 + k, 0)) for k in (1, 2, 3))
    (r,) = log.requests
    assert r.first_token_s == pytest.approx(prefill)
    assert r.finish_s == pytest.approx(prefill + decode)
    assert log.cache_hit_tokens == 0 and log.cache_miss_tokens == 100


def test_cpu_time_is_added_serially_or_overlapped(cost):
    reqs = [request("r", [("p", 100)], output_len=4)]
    serial = run(reqs, cost, "feather", EngineConfig(overlap_schedule=False), cpu_s=0.5)
    overlap = run(reqs, cost, "feather", EngineConfig(overlap_schedule=True), cpu_s=0.5)
    base = run(reqs, cost, "feather", cpu_s=0.0)
    assert serial.end_s > base.end_s + 0.5
    assert base.end_s < overlap.end_s < serial.end_s


def test_second_wave_hits_the_prefix_the_first_wave_cached(cost):
    shared = [("sys", 320)]
    first = request("a", [*shared, ("qa", 16)], output_len=2)
    later = request("b", [*shared, ("qb", 16)], output_len=2, arrival_s=10.0)
    log = run([first, later], cost, "fcfs")
    assert log.cache_miss_tokens == 336 + 16
    assert log.cache_hit_tokens == 320
    b = next(r for r in log.requests if r.rid == "b")
    assert b.first_token_s - b.arrival_s == pytest.approx(cost.prefill_s([16], [320]))
