"""When a prefill's KV reaches the prefix cache: one pass later under SGLang's overlap scheduler, chunk by
chunk for a chunked prefill, and right after the step without overlap."""

from __future__ import annotations

import pytest
from sim_helpers import PROBES, make_probe, request, run

from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.policies import POLICIES


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setitem(POLICIES, "probe", make_probe)
    PROBES.clear()
    yield lambda: PROBES[-1]


def _pair():
    """`a` prefills alone; `b`, sharing its 320-token prefix, arrives during that prefill step."""
    a = request("a", [("sys", 320), ("qa", 16)], output_len=8)
    b = request("b", [("sys", 320), ("qb", 16)], output_len=8, arrival_s=1e-6)
    return [a, b]


def test_without_overlap_the_next_pass_hits_the_prefix(cost, probe):
    log = run(_pair(), cost, "probe", EngineConfig(overlap_schedule=False))
    assert probe().seen[:2] == [{"a": 0}, {"b": 320}]
    assert log.cache_hit_tokens == 320
    assert log.cache_miss_tokens == 336 + 16


def test_with_overlap_the_next_pass_misses_the_running_prefix(cost, probe):
    log = run(_pair(), cost, "probe", EngineConfig(overlap_schedule=True))
    assert probe().seen[:2] == [{"a": 0}, {"b": 0}]
    assert log.cache_hit_tokens == 0
    assert log.cache_miss_tokens == 2 * 336


def test_with_overlap_the_pass_after_next_hits(cost, probe):
    a, b = _pair()
    c = request("c", [("sys", 320), ("qc", 16)], output_len=8, arrival_s=1e-6)
    log = run([a, b, c], cost, "probe", EngineConfig(overlap_schedule=True, max_prefill_tokens=336))
    # pass 1 admits a; pass 2 admits b (a's prompt not cached yet); pass 3 sees a's prompt
    assert [dict(s) for s in probe().seen[:3]] == [{"a": 0}, {"b": 0, "c": 0}, {"c": 320}]
    assert log.cache_hit_tokens == 320


@pytest.mark.parametrize("overlap", [False, True])
def test_chunked_prefill_publishes_each_computed_chunk_at_the_next_pass(cost, probe, overlap):
    a = request("a", [("doc", 960), ("qa", 40)], output_len=4)
    b = request("b", [("doc", 960), ("qb", 40)], output_len=4, arrival_s=1e-6)
    config = EngineConfig(chunked_prefill_size=256, overlap_schedule=overlap)
    log = run([a, b], cost, "probe", config)
    # a is prefilled in chunks of 256; before each pass the chunks computed so far are cached, so b (which
    # only fits once a's last chunk leaves room) matches the 768 tokens of a's first three chunks
    assert [s.get("b") for s in probe().seen[:4]] == [None, 256, 512, 768]
    b_hit = log.cache_hit_tokens
    assert b_hit == 768
    assert log.cache_miss_tokens == 1000 + 1000 - 768
