"""Running-batch order (admission vs prefix-grouped), the client concurrency limit, the RAG workload, the
wait-by-prompt-length report and the simulator's defaults (production's)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import ALL_POLICIES, run, small_gsp
from test_conservation import _check

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.cli import admission_config, build_parser, engine_config
from sglang_feather.sim.engine import BATCH_ORDERS, EngineConfig
from sglang_feather.sim.report import summarize, wait_by_length
from sglang_feather.sim.requests import ReqState
from sglang_feather.sim.run import RunSpec
from sglang_feather.sim.sharing import SharedNode
from sglang_feather.sim.trace import SimRequest
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("order", sorted(BATCH_ORDERS))
def test_both_orders_conserve_requests_and_tokens(cost, policy, order):
    requests = small_gsp(seed=2, num_groups=4, rate=300.0)
    log = run(requests, cost, policy, EngineConfig(batch_order=order))
    _check(requests, log)
    assert sum(s.num_tokens for s in log.steps) + len(requests) == sum(r.output_len for r in requests)
    assert log.cache_hit_tokens + log.cache_miss_tokens == sum(r.prompt_len for r in requests)


def _state(rid: str, path: tuple[int, ...]) -> ReqState:
    spec = SimRequest(rid, 0.0, 1)
    nodes = tuple(SharedNode(k, 16) for k in path)
    return ReqState(spec, np.zeros(1, np.int32), [], [], nodes, "g")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=40))
def test_prefix_order_makes_every_shared_prefix_contiguous(paths):
    states = [_state(f"r{i}", tuple(p)) for i, p in enumerate(paths)]
    ordered = BATCH_ORDERS["prefix"](states)
    assert sorted(s.rid for s in ordered) == sorted(s.rid for s in states)
    keys = [tuple(n.key for n in s.nodes) for s in ordered]
    for depth in (1, 2, 3):
        prefixes = {k[:depth] for k in keys if len(k) >= depth}
        seen, last = set(), None
        for k in [k[:depth] if len(k) >= depth else None for k in keys]:
            if k is not None and k != last:
                assert k not in seen, (depth, keys)
                seen.add(k)
            last = k
        assert seen == prefixes
    same_path = [s.rid for s in ordered if tuple(n.key for n in s.nodes) == keys[0]]
    assert same_path == [s.rid for s in states if tuple(n.key for n in s.nodes) == keys[0]]


def test_admission_order_keeps_the_batch_as_is():
    states = [_state(f"r{i}", (i % 2,)) for i in range(6)]
    assert BATCH_ORDERS["admission"](states) == states


@pytest.mark.parametrize("limit", [1, 3])
def test_max_concurrency_bounds_requests_in_flight(cost, limit):
    requests = small_gsp(seed=4)
    log = run(requests, cost, "fcfs", EngineConfig(max_concurrency=limit))
    _check(requests, log)
    events = sorted([(r.arrival_s, 1) for r in log.requests] + [(r.finish_s, -1) for r in log.requests])
    in_flight, peak = 0, 0
    for _, delta in events:
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak == limit


def test_rag_documents_follow_zipf_popularity_and_lengths():
    spec = SharedPrefixSpec(num_requests=2000, zipf_alpha=1.0, rate=20.0)
    cfg = WorkloadConfig(spec, num_docs=50, doc_len_range=(300, 900))
    reqs = make_workload("rag", cfg)
    assert len(reqs) == 2000 and len({r.rid for r in reqs}) == 2000
    counts = np.bincount([int(r.group.removeprefix("doc")) for r in reqs], minlength=50)
    assert counts[0] > counts[1] > counts[10] and counts[0] > 0.15 * len(reqs)
    assert all(300 <= r.segments[0].num_tokens <= 900 for r in reqs)
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals) and 80 < arrivals[-1] < 120


def test_wait_by_length_bins_cover_every_request(cost):
    requests = make_workload(
        "rag",
        WorkloadConfig(
            SharedPrefixSpec(num_requests=40, output_len=8), num_docs=10, doc_len_range=(200, 2000)
        ),
    )
    log = run(requests, cost, "fcfs")
    bins = wait_by_length(log, num_bins=3, over_s=0.0)
    assert sum(b.num_requests for b in bins) == len(requests)
    assert [b.min_len for b in bins] == sorted(b.min_len for b in bins)
    s = summarize("fcfs", log)
    assert max(b.wait_max_s for b in bins) == pytest.approx(s.max_queue_wait_s)
    assert sum(b.num_over for b in bins) == sum(r.admit_s > r.arrival_s for r in log.requests)
    assert -1.0 <= s.wait_len_corr <= 1.0


def test_defaults_are_production_defaults():
    args = build_parser().parse_args([])
    assert admission_config(args) == AdmissionConfig() == RunSpec("feather").admission
    assert AdmissionConfig().stopper == "always" and AdmissionConfig().max_wait_s == 300.0
    assert AdmissionConfig().defer_uncached_prefix
    assert engine_config(args).overlap_schedule and EngineConfig().overlap_schedule
    assert engine_config(args).batch_order == "admission"


def test_bad_engine_options_are_refused():
    with pytest.raises(ValueError, match="batch_order"):
        EngineConfig(batch_order="random")
    with pytest.raises(ValueError, match="max_concurrency"):
        EngineConfig(max_concurrency=0)


def test_sweep_tables_take_per_seed_ratios():
    from sglang_feather.sim.cpu import FixedCpu
    from sglang_feather.sim.sweeps import WAIT_METRICS, Case, order_table, run_case, table

    knobs = WorkloadConfig(SharedPrefixSpec.per_group(2, 3, prefix_len=64, question_len=8, output_len=6))
    rows = []
    for order in ("admission", "prefix"):
        case = Case(f"tiny {order}", "gsp", knobs, EngineConfig(batch_order=order))
        rows += run_case(case, ("fcfs", "feather"), [0, 1], FixedCpu(0.0))
    assert len(rows) == 8 and all(r["x_fcfs"] == 1.0 for r in rows if r["policy"] == "fcfs")
    assert "| tiny prefix | feather |" in table(rows, ("fcfs", "feather"))
    assert all(r["max_wait_q4"] <= r["max_queue_wait_s"] for r in rows)
    assert "| max wait s, length Q4 |" in table(rows, ("fcfs", "feather"), WAIT_METRICS)
    ratios = order_table(rows)
    assert "| tiny | fcfs |" in ratios and "| tiny | feather |" in ratios
