import pytest

from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.phase_shift import (
    ORACLE_GRID,
    STOPPERS,
    PhaseStats,
    Trial,
    compare,
    oracle,
    phase_of,
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


def test_the_oracle_is_the_best_threshold_schedule_found_and_switches_at_phase_starts():
    trial = Trial("a100-80gb", "llama-3-8b", 0, FixedCpu(0.0), SMALL, max_concurrency=16)
    grid = {name: ORACLE_GRID[name] for name in ("always", "max_groups=2", "min_new_group=16")}
    best, tried = oracle(trial, grid)
    assert len(best["schedule"]) == len(PHASE_SHIFT) and set(best["schedule"]) <= set(grid)
    assert best["tok_s"] == max(r["tok_s"] for r in tried)
    fixed = {name: trial.simulate(name, [grid[name]]) for name in grid}
    assert all(best["tok_s"] >= r["tok_s"] for r in fixed.values())
    # A phased schedule that never changes is the fixed stopper, run for run.
    # (Rewards are normalised by the stopper that gets them, and each phase's stopper gets its phase's.)
    same = trial.simulate("phased always", [grid["always"]] * len(PHASE_SHIFT))
    unrewarded = [
        {k: v for k, v in run["admission"].items() if k not in ("sum_reward", "last_reward")}
        for run in (same, fixed["always"])
    ]
    assert same["tok_s"] == fixed["always"]["tok_s"] and unrewarded[0] == unrewarded[1]
    # Holding new groups back from phase 1 on changes the run; from the last phase on, only that phase.
    late = trial.simulate("late", [grid["always"], grid["always"], grid["min_new_group=16"]])
    assert late["admission"]["num_stops"] > 0
    assert late["phases"][0]["window_tok_s"] == fixed["always"]["phases"][0]["window_tok_s"]
    rows = {name: trial.simulate(name, [STOPPERS[name]]) for name in ("always", "ucb-adaptive")}
    comparison = compare(rows, best)
    assert all(0 < c["x_oracle"] <= 1 + 1e-12 for c in comparison.values())
    for r in rows.values():
        assert sum(p["tok_s"] * (p["end_s"] - p["start_s"]) for p in r["phases"]) == pytest.approx(3 * 64 * 8)
    assert "oracle thresholds per phase" in table(rows, best)
