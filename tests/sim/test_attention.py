"""The simulator's decode attention kernels: plain, vLLM's all-or-nothing cascade and per-group reads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_helpers import run, small_gsp

from sglang_feather.sim.attention import (
    ATTENTION_KERNELS,
    FA2_STREAMING,
    FLASHINFER_STREAMING,
    AllOrNothingCascade,
    GroupedAttention,
    common_prefix_nodes,
    distinct_shared_tokens,
)
from sglang_feather.sim.cost import KVSplit
from sglang_feather.sim.metrics import StepKind
from sglang_feather.sim.run import DEFAULT_ENGINE

SYSTEM = ("system", 512)


def batch_of(num_requests: int, *paths: tuple) -> list[tuple]:
    """`num_requests` requests cycling over `paths` (each a tuple of (key, tokens) nodes)."""
    return [paths[i % len(paths)] for i in range(num_requests)]


def tokens(split: KVSplit) -> tuple[int, int]:
    return split.dram_tokens, split.l2_tokens


@pytest.mark.parametrize(
    ("name", "streaming"), [("plain", FLASHINFER_STREAMING), ("plain-fa2", FA2_STREAMING)]
)
def test_plain_is_the_cost_models_reuse_window_at_the_kernels_l2_streaming(cost, name, streaming):
    batch = batch_of(16, (SYSTEM, ("doc-a", 2048)), (SYSTEM, ("doc-b", 2048)))
    split = ATTENTION_KERNELS[name].shared_split(cost, batch)
    assert tokens(split) == tokens(cost.shared_split(batch))
    assert split.l2_tokens > 0 and split.l2_streaming == streaming


def test_a_slower_streaming_kernel_costs_more_and_an_l2_hit_never_costs_more_than_a_dram_read(cost):
    fa2, flashinfer = (KVSplit(4_000, 6_000, s) for s in (FA2_STREAMING, FLASHINFER_STREAMING))
    assert cost.decode_s(16, fa2) > cost.decode_s(16, flashinfer) > cost.decode_s(16, KVSplit(4_000, 6_000))
    for streaming in (FA2_STREAMING, FLASHINFER_STREAMING, 1.0):
        for l2 in (0, 3_000, 10_000):
            hit, miss = KVSplit(10_000 - l2, l2, streaming), KVSplit(10_000, 0, streaming)
            assert cost.decode_s(16, hit) <= cost.decode_s(16, miss)
    # On the H200 FlashInfer streams faster than DRAM: DRAM-only reads cost what DRAM says.
    assert cost.decode_s(16, KVSplit(10_000, 0, FLASHINFER_STREAMING)) == cost.decode_s(
        16, KVSplit(10_000, 0)
    )


def test_grouped_reads_each_distinct_node_once_from_dram(cost):
    batch = batch_of(16, (SYSTEM, ("doc-a", 2048)), (SYSTEM, ("doc-b", 1024)))
    assert GroupedAttention().shared_split(cost, batch) == KVSplit(512 + 2048 + 1024, 0)


def test_cascade_reads_the_common_prefix_once_only_when_every_request_shares_enough():
    kernel = AllOrNothingCascade()
    plain = ATTENTION_KERNELS["plain-fa2"]  # what vLLM runs when the cascade is off

    class NoL2:
        """Every shared read from DRAM: what the cascade changes is then exactly visible."""

        def shared_split(self, batch):
            return KVSplit(sum(n for nodes in batch for _, n in nodes), 0)

    cost = NoL2()
    homogeneous = batch_of(8, (SYSTEM, ("doc-a", 2048)))
    assert tokens(kernel.shared_split(cost, homogeneous)) == (512 + 2048, 0)
    # One outlier turns it off for the whole batch: every request reads its prefix again.
    outlier = [*homogeneous[:7], (("other", 2560),)]
    assert (
        kernel.shared_split(cost, outlier)
        == plain.shared_split(cost, outlier)
        == KVSplit(7 * 2560 + 2560, 0, FA2_STREAMING)
    )
    # Under vLLM's thresholds: 7 requests, or a common prefix of 255 tokens.
    assert tokens(kernel.shared_split(cost, homogeneous[:7])) == (7 * 2560, 0)
    short = batch_of(8, (("short", 255), ("doc-a", 2048)), (("short", 255), ("doc-b", 2048)))
    assert tokens(kernel.shared_split(cost, short)) == (8 * (255 + 2048), 0)
    # Two documents under one system prompt: the system prompt once, each document per request.
    nested = batch_of(8, (SYSTEM, ("doc-a", 2048)), (SYSTEM, ("doc-b", 2048)))
    assert tokens(kernel.shared_split(cost, nested)) == (512 + 8 * 2048, 0)


NODE_TOKENS = {"a": 300, "b": 17, "c": 600}
node_paths = st.lists(
    st.lists(st.sampled_from(sorted(NODE_TOKENS)), max_size=4).map(
        lambda keys: tuple((f"{i}:{key}", NODE_TOKENS[key] * (i + 1)) for i, key in enumerate(keys))
    ),
    max_size=12,
)
"""Batches of node paths: a node's key is its depth and letter, its size a function of both (as a trie's)."""


@given(node_paths)
def test_common_prefix_and_distinct_tokens_match_their_definitions(batch):
    num = common_prefix_nodes(batch)
    expected = 0
    if batch:
        while (
            expected < min(len(nodes) for nodes in batch)
            and len({nodes[expected][0] for nodes in batch}) == 1
        ):
            expected += 1
    assert num == expected
    seen = {}
    for nodes in batch:
        for key, n in nodes:
            seen.setdefault(key, n)
    assert distinct_shared_tokens(batch) == sum(seen.values())


@given(node_paths)
def test_no_kernel_reads_more_than_plain_or_less_than_each_node_once(batch):
    class NoL2:
        def shared_split(self, batch):
            return KVSplit(sum(n for nodes in batch for _, n in nodes), 0)

    cost = NoL2()
    total = {name: sum(tokens(k.shared_split(cost, batch))) for name, k in ATTENTION_KERNELS.items()}
    assert total["grouped"] <= total["cascade"] <= total["plain"]
    assert total["grouped"] == distinct_shared_tokens(batch)


def test_a_group_a_step_costs_more_under_grouped_the_more_groups_it_holds(cost):
    config = replace(DEFAULT_ENGINE, attention="grouped")

    def mean_decode_s(num_groups: int) -> float:
        log = run(
            small_gsp(num_groups=num_groups, prompts_per_group=24 // num_groups, prefix_len=2048),
            cost,
            "fcfs",
            config,
        )
        steps = [s for s in log.steps if s.kind is StepKind.DECODE and s.batch_size == 24]
        assert steps, "no full decode step"
        return sum(s.gpu_s for s in steps) / len(steps)

    times = [mean_decode_s(g) for g in (1, 2, 4, 8)]
    assert times == sorted(times) and times[0] < times[-1], times


def test_the_kernel_changes_only_decode_cost(cost):
    requests = small_gsp(num_groups=4, prompts_per_group=6, prefix_len=1024)
    logs = {
        name: run(requests, cost, "fcfs", replace(DEFAULT_ENGINE, attention=name))
        for name in ATTENTION_KERNELS
    }
    prefill = {name: [s.gpu_s for s in log.steps if s.kind is StepKind.PREFILL] for name, log in logs.items()}
    assert prefill["plain"] == prefill["cascade"] == prefill["grouped"]
    decode = {
        name: sum(s.gpu_s for s in log.steps if s.kind is StepKind.DECODE) for name, log in logs.items()
    }
    assert decode["grouped"] < decode["plain"], decode


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="attention must be one of"):
        replace(DEFAULT_ENGINE, attention="flash")


def test_the_stop_map_and_the_decode_heavy_sweep_run_under_the_kernel_asked():
    from sglang_feather.sim.stopmap import Cell, _gsp, run_cell
    from sglang_feather.sim.sweeps import SWEEPS

    cell = Cell("tiny", "gsp", _gsp(2, 256, 12, seed=3), "h200", 256)
    results = {kernel: run_cell(cell, kernel) for kernel in ("plain", "grouped")}
    assert [(results[k]["attention"], results[k]["seed"]) for k in results] == [("plain", 3), ("grouped", 3)]
    always = {k: next(r for r in res["runs"] if r["label"] == "always") for k, res in results.items()}
    assert always["grouped"]["summary"]["output_tok_s"] >= always["plain"]["summary"]["output_tok_s"]
    cases = list(SWEEPS["decode-heavy"]())
    assert {case.engine.attention for case in cases} == set(ATTENTION_KERNELS)
    assert all(case.engine.max_running_requests == 64 for case in cases)


def test_the_stop_maps_learner_lines_score_the_share_of_the_oracles_gain():
    from sglang_feather.sim.stopmap import learner_lines

    def res(cell: str, always: float, cap: float, ucb: float) -> dict:
        runs = [
            ("always", always),
            ("cap 2", cap),
            ("ucb", ucb),
            ("ucb-adaptive", always),
            ("qlearn", always),
            ("step-model", always),
        ]
        counts = {"num_consults": 7, "num_stops": 2}
        return {
            "cell": cell,
            "seed": 0,
            "runs": [
                {"label": la, "summary": {"output_tok_s": tok}, "admission": counts} for la, tok in runs
            ],
        }

    results = [res("pays", 100.0, 110.0, 108.0), res("flat", 100.0, 99.0, 99.5), res("near", 100, 102, 99.0)]
    lines = learner_lines(results)
    assert lines[0].startswith("ucb: ")
    assert "1 cells where a STOP pays >= 5% (consults/stops): 80% (pays s0, 7/2)" in lines[0]
    assert "1 cells where always is best: 0.995 (flat s0)" in lines[0]
    assert "in the 1 where the oracle gains less: 0.990 (near s0)" in lines[0]
    assert "(consults/stops): 0% (pays s0, 7/2)" in lines[1]
    assert len(lines) == 4 and lines[3].startswith("step-model: ")


def test_the_sweeps_attention_flag_runs_every_case_under_that_kernel(tmp_path, monkeypatch):
    import json

    from sglang_feather.sim import sweeps
    from sglang_feather.sim.engine import EngineConfig
    from sglang_feather.sim.stopmap import _gsp

    tiny = sweeps.Case("tiny gsp", "gsp", _gsp(2, 256, 12, seed=0), EngineConfig(), "h200")
    monkeypatch.setitem(sweeps.SWEEPS, "tiny", lambda: iter([tiny]))
    out = tmp_path / "rows.json"
    argv = ["tiny", "--seeds", "1", "--fixed-cpu-ms", "0", "--policies", "fcfs,feather", "--json", str(out)]
    for kernel in ("grouped", None):
        assert sweeps.main(argv + ([] if kernel is None else ["--attention", kernel])) == 0
        rows = json.loads(out.read_text())
        assert {r["attention"] for r in rows} == {kernel or "plain"}
    with pytest.raises(SystemExit):  # an unknown kernel is refused by the parser
        sweeps.main([*argv, "--attention", "flash"])
    # A sweep whose cases name their own kernels is not overridden under their labels.
    with pytest.raises(SystemExit, match="kernels of their own"):
        sweeps.main(["decode-heavy", "--attention", "grouped", "--seeds", "1", "--fixed-cpu-ms", "0"])
