"""SGLang's decaying `new_token_ratio` and EOS-terminated outputs in the simulator."""

from __future__ import annotations

import pytest
from sim_helpers import run

from sglang_feather.sim.cli import build_parser, engine_config, workload_config
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.requests import build_states
from sglang_feather.sim.token_ratio import SGLANG_RATIO, NewTokenRatio, RatioTracker, parse_ratio
from sglang_feather.sim.trace import SimRequest, TokenSource, TraceError, from_record, to_record, validate
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import Segment, SharedPrefixSpec


def test_sglang_schedule_matches_its_tracker_defaults():
    assert SGLANG_RATIO.init == pytest.approx(0.7)
    assert SGLANG_RATIO.min == pytest.approx(0.098)
    t = RatioTracker(SGLANG_RATIO)
    for _ in range(300):
        t.decay_step()
    assert t.current == pytest.approx((0.7 + 0.098) / 2)
    for _ in range(1000):
        t.decay_step()
    assert t.current == pytest.approx(0.098)
    t.reset()
    assert t.current == pytest.approx(0.7)


def test_a_fixed_ratio_never_moves():
    t = RatioTracker(NewTokenRatio.fixed(0.4))
    for _ in range(50):
        t.decay_step()
    t.after_retract([])
    assert t.current == 0.4


def test_retraction_re_estimates_from_the_survivors():
    requests = [SimRequest(f"r{i}", 0.0, 10, (Segment(f"p{i}", 32),), max_new_tokens=100) for i in range(2)]
    states = build_states(requests, TokenSource(), 16)
    states[0].num_out, states[1].num_out = 30, 50
    t = RatioTracker(SGLANG_RATIO)
    t.after_retract(states)
    assert t.current == pytest.approx((30 + 50 + 20 * 2) / (200 + 1))
    states[0].num_out = states[1].num_out = 95
    t.after_retract(states)
    assert t.current == 1.0


@pytest.mark.parametrize(
    ("text", "want"),
    [("sglang", SGLANG_RATIO), ("1", NewTokenRatio.fixed(1.0)), ("0.25", NewTokenRatio.fixed(0.25))],
)
def test_parse_ratio(text, want):
    assert parse_ratio(text) == want


@pytest.mark.parametrize("text", ["fast", "1.5", "-0.1"])
def test_parse_ratio_refuses_bad_values(text):
    with pytest.raises(ValueError, match="ratio"):
        parse_ratio(text)


def test_max_new_tokens_below_the_output_is_refused_and_round_trips():
    bad = SimRequest("r", 0.0, 10, (Segment("p", 8),), max_new_tokens=5)
    with pytest.raises(TraceError, match="max_new_tokens 5 below its output_len 10"):
        validate([bad])
    good = SimRequest("r", 0.0, 10, (Segment("p", 8),), max_new_tokens=64)
    assert from_record(to_record(good), "line 1") == good
    assert "max_new_tokens" not in to_record(SimRequest("r", 0.0, 10, (Segment("p", 8),)))


def test_eos_outputs_ask_for_the_cap_and_stop_at_their_draw():
    spec = SharedPrefixSpec.per_group(2, 5, prefix_len=64, question_len=8, output_len=4, output_len_max=12)
    fixed = make_workload("gsp", WorkloadConfig(spec))
    eos = make_workload("gsp", WorkloadConfig(spec, eos_outputs=True))
    assert [r.output_len for r in eos] == [r.output_len for r in fixed]
    assert all(r.max_new == r.output_len for r in fixed)
    assert {r.max_new for r in eos} == {12}
    assert any(r.output_len < 12 for r in eos)


def test_decaying_ratio_under_eos_outputs_retracts_and_still_finishes_everything(cost):
    """Outputs use 83-100 % of their cap while SGLang reserves 70 % and less, the pool overflows, SGLang's retraction frees room and the
    ratio is re-estimated; every request still finishes once with exactly its drawn output."""
    eos = make_workload(
        "gsp",
        WorkloadConfig(
            SharedPrefixSpec.per_group(
                3, 10, seed=2, prefix_len=300, question_len=20, output_len=200, output_len_max=240, rate=40.0
            ),
            eos_outputs=True,
        ),
    )
    config = EngineConfig(kv_capacity_tokens=2000, new_token_ratio=SGLANG_RATIO, chunked_prefill_size=256)
    log = run(eos, cost, "feather", config)
    assert sorted(r.rid for r in log.requests) == sorted(r.rid for r in eos)
    by_rid = {r.rid: r for r in eos}
    assert all(r.output_len == by_rid[r.rid].output_len for r in log.requests)
    assert log.num_retractions > 0
    assert log.max_cache_tokens <= 2000
    exact = run(eos, cost, "feather", EngineConfig(kv_capacity_tokens=2000, chunked_prefill_size=256))
    assert exact.num_retractions == 0


def test_cli_flags_reach_the_engine_and_the_workload():
    args = build_parser().parse_args(
        [
            "--workload",
            "gsp",
            "--output-len",
            "16",
            "--output-len-max",
            "64",
            "--eos-outputs",
            "--new-token-ratio",
            "sglang",
        ]
    )
    assert engine_config(args).new_token_ratio == SGLANG_RATIO
    cfg = workload_config(args)
    assert cfg.eos_outputs and cfg.max_new_tokens == 64
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--new-token-ratio", "often"])
