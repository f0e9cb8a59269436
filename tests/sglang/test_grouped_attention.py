"""The grouped decode backend against SGLang's torch_native on real pools: segments, kernel, backend, plugin."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_feather.sglang.grouped_attention.kernel import (
    DecodePlan,
    attend_with_lse,
    attend_with_lse_unfused,
    grouped_decode,
    span_attention_for,
)
from sglang_feather.sglang.grouped_attention.segments import (
    BatchSegments,
    Span,
    check_segments,
    find_segments,
    private_segments,
)
from tests.sglang.grouped_batches import Family, HeadShape, build_batch, families, torch_native_decode

SHAPES = (HeadShape(2, 1, 64), HeadShape(4, 2, 32), HeadShape(3, 3, 16), HeadShape(8, 2, 16))
"""The tiny model's heads (2 q / 1 KV x 64), GQA and plain multi-head."""

TOLERANCE = 2e-5
"""float32: the grouped sums run in another order than SDPA's, nothing more."""

batches = st.fixed_dictionaries(
    {
        "roots": st.lists(families(), min_size=1, max_size=4),
        "page_size": st.sampled_from([1, 16]),
        "shape": st.sampled_from(SHAPES),
        "seed": st.integers(0, 2**31),
    }
)


def _grouped(batch, q, scaling, segments: BatchSegments):
    k, v = batch.kv_pool.get_key_buffer(0), batch.kv_pool.get_value_buffer(0)
    plan = DecodePlan.build(segments, batch.rows, k[0].numel() * k.element_size(), batch.page_size)
    return grouped_decode(q, k, v, plan, scaling)


@settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_segments_hold_their_invariants_and_attention_equals_torch_native(params):
    batch = build_batch(**params)
    rows = batch.rows
    segments = find_segments(rows, batch.seq_lens, batch.page_size)
    check_segments(segments, rows, batch.page_size)
    shape = params["shape"]
    q = torch.randn(
        len(batch.seq_lens), shape.num_q_heads, shape.head_dim, generator=torch.Generator().manual_seed(1)
    )
    scaling = shape.head_dim**-0.5
    expected = torch_native_decode(batch, q, scaling)
    for candidate in (segments, private_segments(batch.seq_lens)):
        assert torch.allclose(_grouped(batch, q, scaling, candidate), expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_group_of_64_reads_its_prefix_once_and_nested_prefixes_nest(page_size):
    system = Family(512, 0, (Family(256, 64), Family(300, 3, (Family(40, 5),))))
    batch = build_batch([system, Family(100, 1)], page_size, HeadShape(2, 1, 64), seed=7)
    segments = find_segments(batch.rows, batch.seq_lens, page_size)
    check_segments(segments, batch.rows, page_size)
    shared = sorted((len(s.members), s.num_tokens) for s in segments.spans if s.is_shared)
    # The system prompt (72 requests), the 64-request document under it, the 8-request one and the 5 under that.
    assert [members for members, _ in shared] == [5, 8, 64, 72]
    assert dict((m, n) for m, n in shared)[72] == 512
    assert segments.num_tokens_read < segments.num_tokens_logical / 10
    q = torch.randn(len(batch.seq_lens), 2, 64)
    assert torch.allclose(
        _grouped(batch, q, 0.125, segments), torch_native_decode(batch, q, 0.125), atol=TOLERANCE
    )


def test_entries_past_seq_len_are_never_compared():
    """Two requests whose rows agree past the shorter one's length (a stale row after a retraction) share
    only up to that length."""
    rows = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10], [5, 6, 1, 2, 3, 4]], dtype=torch.int32)
    segments = find_segments(rows, [3, 6, 4], page_size=1)
    check_segments(segments, rows, 1)
    assert Span(0, 0, 2, (0, 1, 2)) in segments.spans and Span(0, 2, 3, (0, 1)) in segments.spans


def test_the_checker_catches_a_segmentation_that_shares_too_much_or_too_little():
    rows = torch.tensor([[1, 2, 3, 4], [1, 2, 9, 9]], dtype=torch.int32)
    good = find_segments(rows, [4, 4], page_size=1)
    check_segments(good, rows, 1)
    too_much = BatchSegments.from_spans(
        (Span(0, 0, 3, (0, 1)), Span(0, 3, 4, (0,)), Span(1, 3, 4, (1,))), (4, 4)
    )
    with pytest.raises(AssertionError, match="expected"):
        check_segments(too_much, rows, 1)
    with pytest.raises(AssertionError, match="only in part"):
        check_segments(private_segments([4, 4]), rows, 1)
    gap = BatchSegments.from_spans((Span(0, 0, 2, (0, 1)), Span(0, 3, 4, (0,)), Span(1, 2, 4, (1,))), (4, 4))
    with pytest.raises(AssertionError, match="starts at"):
        check_segments(gap, rows, 1)


def test_a_partial_page_is_not_shared():
    # Both hold page 1 (slots 16-31), the second only up to its length of 18: its first two slots are read by
    # both, yet only the whole page 0 is shared.
    rows = torch.tensor([list(range(20)), list(range(18)) + [0, 0]], dtype=torch.int32)
    segments = find_segments(rows, [20, 18], page_size=16)
    check_segments(segments, rows, 16)
    assert [s.num_tokens for s in segments.spans if s.is_shared] == [16]


def test_the_checker_refuses_rows_that_are_not_whole_pages():
    rows = torch.tensor([list(range(16)) + [40, 41, 90, 91]], dtype=torch.int32)  # page 2 ends in a stranger
    with pytest.raises(AssertionError, match="not whole pages"):
        check_segments(find_segments(rows, [20], page_size=16), rows, 16)


def test_bad_input_is_refused_with_a_clear_error():
    rows = torch.zeros((2, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match="page_size"):
        find_segments(rows, [4, 4], page_size=0)
    with pytest.raises(ValueError, match="seq_len"):
        find_segments(rows, [4, 5], page_size=1)
    with pytest.raises(ValueError, match="rows must be"):
        find_segments(rows, [4], page_size=1)


@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 2e-2), (torch.float32, TOLERANCE)])
def test_low_precision_kv_attends_in_float32(dtype, tolerance):
    batch = build_batch([Family(700, 12), Family(64, 3)], 16, HeadShape(4, 2, 32), seed=3, dtype=dtype)
    q = torch.randn(len(batch.seq_lens), 4, 32).to(dtype)
    segments = find_segments(batch.rows, batch.seq_lens, 16)
    got = _grouped(batch, q, 32**-0.5, segments)
    assert got.dtype == dtype
    reference = torch_native_decode(batch, q.float(), 32**-0.5)  # the same bf16 values, attended in float32
    assert (got.float() - reference).abs().max() < tolerance


def test_plan_cuts_a_bucket_into_gathers_of_bounded_size():
    batch = build_batch([Family(16, 1) for _ in range(40)], 16, HeadShape(2, 1, 64), seed=5, max_tail=64)
    rows = batch.rows
    plan = DecodePlan.build(private_segments(batch.seq_lens), rows, kv_bytes_per_token=1 << 20)
    assert len(plan.buckets) >= len(batch.seq_lens)  # 1 MB per token: one span per gather
    q = torch.randn(len(batch.seq_lens), 2, 64)
    k, v = batch.kv_pool.get_key_buffer(0), batch.kv_pool.get_value_buffer(0)
    assert torch.allclose(
        grouped_decode(q, k, v, plan, 0.125), torch_native_decode(batch, q, 0.125), atol=TOLERANCE
    )
    # Nothing shared: one partial per request, each request's query once (so the merge is one row each).
    assert sorted(plan.query_rows.tolist()) == list(range(len(batch.seq_lens)))
    rows = plan.merge_rows
    assert rows is None or sorted(rows.view(-1).tolist()) == list(range(len(batch.seq_lens)))


def test_the_unfused_path_other_devices_run_equals_the_fused_cpu_kernel():
    generator = torch.Generator().manual_seed(4)
    queries, keys, values = (torch.randn(3, 2, n, 16, generator=generator) for n in (5, 40, 40))
    mask = torch.zeros(3, 1, 1, 40)
    mask[1, ..., 25:] = float("-inf")
    fused = attend_with_lse(queries, keys, values, mask, 0.25)
    unfused = attend_with_lse_unfused(queries, keys, values, mask, 0.25)
    for a, b in zip(fused, unfused, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_cpu_gathers_then_attends_and_cuda_asks_for_the_triton_kernel():
    assert type(span_attention_for(torch.device("cpu"))).__name__ == "GatherThenAttend"
    # On a CUDA device the Triton kernel is chosen (Triton is installed here; no GPU runs it in this test).
    assert type(span_attention_for(torch.device("cuda"))).__name__ == "TritonSpans"
