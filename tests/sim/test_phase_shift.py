import pytest

from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.phase_shift import (
    ORACLE_GRID,
    STOPPERS,
    PhaseStats,
    compare,
    phase_of,
    run,
    table,
    time_to_adapt,
)
from sglang_feather.sim.workloads import PHASE_SHIFT, WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec

SMALL = WorkloadConfig(SharedPrefixSpec(num_requests=64, question_len=16, output_len=8), prompt_len=256)


def test_phases_follow_each_other_and_share_no_token():
    reqs = make_workload("phase-shift", SMALL.with_spec(rate=50.0))
    phases = [phase_of(r.rid) for r in reqs]
    assert phases == sorted(phases) and set(phases) == set(range(len(PHASE_SHIFT)))
    for k in range(1, len(PHASE_SHIFT)):
        before = [r for r in reqs if phase_of(r.rid) == k - 1]
        after = [r for r in reqs if phase_of(r.rid) == k]
        assert len(after) == 64
        assert min(r.arrival_s for r in after) > max(r.arrival_s for r in before)
    keys = {}
    for r in reqs:
        for s in r.segments:
            keys.setdefault(s.key, set()).add(phase_of(r.rid))
    assert all(len(p) == 1 for p in keys.values())
    groups = {phase_of(r.rid): set() for r in reqs}
    for r in reqs:
        groups[phase_of(r.rid)].add(r.group)
    assert [len(groups[k]) for k in range(3)] == [8, 64, 64]
    first = [r for r in reqs if phase_of(r.rid) == 0]
    assert {s.num_tokens for r in first for s in r.segments[:1]} == {4096}


def test_without_a_rate_every_request_arrives_at_zero_in_phase_order():
    reqs = make_workload("phase-shift", SMALL)
    assert {r.arrival_s for r in reqs} == {0.0}
    assert [phase_of(r.rid) for r in reqs] == sorted(phase_of(r.rid) for r in reqs)


def test_time_to_adapt_is_the_first_pair_of_windows_near_the_oracle():
    oracle = PhaseStats(100.0, 0.0, 20.0, (100.0, 100.0, 100.0, 100.0))
    assert time_to_adapt(PhaseStats(90.0, 0.0, 20.0, (98.0, 97.0, 99.0, 99.0)), oracle) == 0.0
    assert time_to_adapt(PhaseStats(90.0, 0.0, 20.0, (50.0, 97.5, 40.0, 99.0)), oracle) is None
    assert time_to_adapt(PhaseStats(90.0, 0.0, 20.0, (50.0, 60.0, 99.0, 99.0)), oracle) == 10.0


def test_the_oracle_is_the_best_fixed_threshold_per_phase():
    names = ["always", "static", "ucb-adaptive", *list(ORACLE_GRID)[:2]]
    rows = run("a100-80gb", "llama-3-8b", 0, names, FixedCpu(0.0), SMALL, max_concurrency=16)
    assert set(rows) == set(names)
    comparison = compare(rows)
    assert set(comparison) == {"always", "static", "ucb-adaptive"} <= set(STOPPERS)
    for c in comparison.values():
        assert all(0 < x <= 1 + 1e-12 for x in c["x_oracle"])
        assert 0 < c["x_oracle_trace"] <= 1 + 1e-12
        for k, best in enumerate(c["oracle"]):
            assert rows[best]["phase_tok_s"][k] == max(r["phase_tok_s"][k] for r in rows.values())
    for r in rows.values():
        assert sum(r["phase_tokens"]) == 3 * 64 * 8
        assert r["tok_s"] == pytest.approx(sum(r["phase_tokens"]) / max(p["end_s"] for p in r["phases"]))
    assert "per-phase oracle" in table(rows, comparison)
