"""`bench grouped-attention`: the quick run, the output check, the slot sharing, the byte count."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_feather.bench import __main__ as cli
from sglang_feather.bench import grouped_attention as ga
from sglang_feather.sglang.grouped_attention import kernel
from sglang_feather.sglang.grouped_attention.segments import find_segments


def test_quick_run_times_every_method_and_checks_outputs_in_every_cell(tmp_path):
    out = tmp_path / "grouped.json"
    threads = torch.get_num_threads()
    assert cli.main(["grouped-attention", "--quick", "--repeat", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["threads"] == 1 and result["header"].startswith("SGLang ")
    rows = result["rows"]
    assert [(r["shape"], r["groups"]) for r in rows] == [
        ("tiny", 1),
        ("tiny", 3),
        ("tiny", ga.DISTINCT),
        ("llama3-8b", 1),
        ("llama3-8b", ga.DISTINCT),
    ]
    for r in rows:
        tolerance = ga.TOLERANCE[ga.HEAD_SHAPES[r["shape"]].dtype]
        assert set(r["methods"]) == set(ga.METHODS)
        assert r["methods"]["torch_native"]["max_abs_diff"] == 0.0
        for name in ("grouped", "control"):
            assert 0.0 <= r["methods"][name]["max_abs_diff"] <= tolerance
        for method in r["methods"].values():
            layer, step = method["layer_s"], method["step_s"]
            assert 0 < layer["min"] <= layer["median"] <= layer["max"] < step["median"]
        assert r["num_shared_segments"] == (0 if r["groups"] == ga.DISTINCT else r["groups"])
        assert r["speedup_vs_torch_native"] > 0 and r["speedup_vs_control"] > 0
    assert torch.get_num_threads() == threads, "the run's --threads is undone"


def test_a_grouped_kernel_that_drifts_fails_the_run(monkeypatch, capsys):
    real = kernel.grouped_decode

    def off_by_a_little(*args, **kwargs):
        return real(*args, **kwargs) + 1e-3

    monkeypatch.setattr(kernel, "grouped_decode", off_by_a_little)
    argv = ["grouped-attention", "--quick", "--shapes", "tiny", "--groups", "2", "--repeat", "1"]
    assert cli.main(argv) == 1
    assert "differs from torch_native's" in capsys.readouterr().err


def test_the_check_passes_within_tolerance_and_raises_beyond_it():
    reference = [torch.zeros(3, 2, 4)]
    close = [torch.full((3, 2, 4), 5e-5)]
    assert ga.check_outputs("float32", reference, {"grouped": close}, "cell") == {
        "grouped": pytest.approx(5e-5)
    }
    wrong = [reference[0].clone()]
    wrong[0][1, 0, 2] = 1e-3
    with pytest.raises(ga.MismatchError, match="grouped max abs diff 0.001"):
        ga.check_outputs("float32", reference, {"grouped": wrong, "control": close}, "cell")
    with pytest.raises(ga.MismatchError):
        ga.check_outputs("float32", reference, {"control": [torch.full((3, 2, 4), float("nan"))]}, "cell")


def test_requests_share_slots_exactly_within_their_group():
    batch, num_groups, prefix, tail = 7, 3, 48, 20
    work = ga.build_workload(batch, num_groups, prefix, tail, seed=1)
    assert work.req_to_token.dtype == torch.int32 and sorted(work.req_pool_indices.tolist()) == list(range(7))
    assert work.req_pool_indices.tolist() != list(range(7)), "pool rows are handed out shuffled"
    rows = work.req_to_token[work.req_pool_indices]
    assert tuple(rows.shape) == (batch, prefix + tail) and work.seq_lens == (prefix + tail,) * batch
    assert work.group_of == tuple(i % num_groups for i in range(batch))
    for i in range(batch):
        for j in range(i + 1, batch):
            common = set(rows[i].tolist()) & set(rows[j].tolist())
            if i % num_groups == j % num_groups:
                assert torch.equal(rows[i, :prefix], rows[j, :prefix])
                assert common == set(rows[i, :prefix].tolist())
            else:
                assert not common
    slots = rows.flatten().tolist()
    assert len(set(slots)) == num_groups * prefix + batch * tail, "no slot used twice except a group's prefix"
    assert min(slots) >= ga.PAGE_SIZE and max(slots) < work.num_slots, "page 0 (slot 0) is never handed out"
    first = rows[0, :prefix]
    assert not torch.equal(first, torch.arange(int(first[0]), int(first[0]) + prefix, dtype=torch.int32))
    segments = find_segments(rows, list(work.seq_lens), ga.PAGE_SIZE)
    shared = sorted(span.members for span in segments.spans if span.is_shared)
    assert shared == [(0, 3, 6), (1, 4), (2, 5)]
    assert all(span.num_tokens == prefix for span in segments.spans if span.is_shared)


def test_bytes_per_step_for_two_groups_by_hand():
    shape = ga.HEAD_SHAPES["tiny"]
    work = ga.build_workload(batch=4, num_groups=2, prefix=32, tail=16, seed=0)
    segments = find_segments(work.req_to_token[work.req_pool_indices], list(work.seq_lens), ga.PAGE_SIZE)
    kv_bytes = 2 * 1 * 64 * 4  # K and V of one KV head of 64 float32 values, per token and layer
    whole = 4 * (32 + 16) * kv_bytes * 2  # every request's 48 tokens, 2 layers
    once = (2 * 32 + 4 * 16) * kv_bytes * 2  # each group's prefix once, every tail
    assert ga.bytes_per_step(shape, segments) == {"torch_native": whole, "grouped": once, "control": whole}
