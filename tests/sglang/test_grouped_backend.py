"""The `feather_grouped` backend object against SGLang's `TorchNativeAttnBackend` on real pools and layers
(the model runner and forward batch are stand-ins holding only the fields attention reads)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_feather.sglang.grouped_attention import GROUPED, GroupedAttentionError
from sglang_feather.sglang.grouped_attention.backend import GroupedDecodeAttnBackend
from sglang_feather.sglang.grouped_attention.observe import SegmentObserver
from sglang_feather.sglang.grouped_attention.registration import create_backend
from tests.sglang.grouped_batches import Family, HeadShape, build_batch

SHAPE = HeadShape(4, 2, 32)


def _runner(batch, **overrides):
    model_config = SimpleNamespace(
        is_encoder_decoder=False, attention_chunk_size=None, hf_text_config=SimpleNamespace()
    )
    fields = dict(
        device="cpu",
        req_to_token_pool=batch.req_to_token_pool,
        token_to_kv_pool=batch.kv_pool,
        model_config=model_config,
        use_mla_backend=False,
        sliding_window_size=None,
        page_size=batch.page_size,
        server_args=SimpleNamespace(enable_metrics=False),
    )
    return SimpleNamespace(**{**fields, **overrides})


def _decode_batch(batch, new_slots):
    seq_lens = torch.tensor(batch.seq_lens)
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(batch.seq_lens),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens,
        req_pool_indices=batch.req_pool_indices,
        out_cache_loc=new_slots,
        encoder_lens=None,
    )


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_equals_torch_native_and_books_the_segments(page_size):
    batch = build_batch([Family(600, 9, (Family(100, 4),)), Family(33, 2)], page_size, SHAPE, seed=11)
    # Each request's last position is the token this step decodes: its slot is written by the backend.
    table = batch.req_to_token_pool.req_to_token
    new_slots = table[batch.req_pool_indices, torch.tensor(batch.seq_lens) - 1].to(torch.int64)
    layer = RadixAttention(
        SHAPE.num_q_heads, SHAPE.head_dim, SHAPE.head_dim**-0.5, SHAPE.num_kv_heads, layer_id=0
    )
    num = len(batch.seq_lens)
    q = torch.randn(num, SHAPE.num_q_heads * SHAPE.head_dim)
    k, v = (
        torch.randn(num, SHAPE.num_kv_heads, SHAPE.head_dim),
        torch.randn(num, SHAPE.num_kv_heads, SHAPE.head_dim),
    )
    forward = _decode_batch(batch, new_slots)

    native = TorchNativeAttnBackend(_runner(batch))
    native.init_forward_metadata(forward)
    expected = native.forward_decode(q, k.clone(), v.clone(), layer, forward)

    observer = SegmentObserver(GROUPED, page_size)
    grouped = GroupedDecodeAttnBackend(_runner(batch), observer)
    grouped.init_forward_metadata(forward)
    assert grouped.plan is not None
    got = grouped.forward_decode(q, k.clone(), v.clone(), layer, forward)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=2e-5, rtol=0)
    assert torch.equal(batch.kv_pool.get_key_buffer(0)[new_slots], k), "the step's own K is written first"
    totals = observer.totals
    # The 600-token prompt, the 100 under it, and the 33-token one (its 32 whole tokens with 16-token pages).
    assert (totals.num_steps, totals.num_shared_segments) == (1, 3)
    assert totals.num_tokens_read < totals.num_tokens_logical / 3
    assert totals.detection_s > 0


def test_extend_batches_run_torch_natives_code():
    batch = build_batch([Family(64, 3)], 1, SHAPE, seed=2)
    grouped = GroupedDecodeAttnBackend(_runner(batch), SegmentObserver(GROUPED, 1))
    grouped.init_forward_metadata(
        SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=3, out_cache_loc=None)
    )
    assert grouped.plan is None
    assert type(grouped).forward_extend is TorchNativeAttnBackend.forward_extend
    assert grouped.observer.totals.num_steps == 0


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"use_mla_backend": True}, "MLA"),
        ({"sliding_window_size": 4096}, "sliding-window"),
        (
            {
                "model_config": SimpleNamespace(
                    is_encoder_decoder=True, attention_chunk_size=None, hf_text_config=SimpleNamespace()
                )
            },
            "cross-attention",
        ),
        (
            {
                "model_config": SimpleNamespace(
                    is_encoder_decoder=False,
                    attention_chunk_size=None,
                    hf_text_config=SimpleNamespace(attn_logit_softcapping=50.0),
                )
            },
            "soft-capping",
        ),
    ],
)
def test_models_it_cannot_serve_are_refused_at_startup_naming_the_flag(overrides, reason):
    batch = build_batch([Family(16, 1)], 1, SHAPE, seed=0)
    with pytest.raises(
        GroupedAttentionError, match=rf"--attention-backend {GROUPED} .*{reason}.*torch_native"
    ):
        create_backend(_runner(batch, **overrides))


def test_each_decode_step_exports_its_segments_and_detection_time():
    from prometheus_client import CollectorRegistry

    from sglang_feather.sglang.grouped_attention.observe import SegmentMetrics

    batch = build_batch([Family(256, 5), Family(64, 3)], 16, SHAPE, seed=4)
    registry = CollectorRegistry()
    observer = SegmentObserver(GROUPED, 16, SegmentMetrics(GROUPED, registry))
    segments, _ = observer.observe(
        batch.req_to_token_pool.req_to_token, batch.req_pool_indices, batch.seq_lens
    )
    observer.observe(batch.req_to_token_pool.req_to_token, batch.req_pool_indices, batch.seq_lens)
    labels = {"attention_backend": GROUPED}
    value = lambda name: registry.get_sample_value(name, labels)  # noqa: E731
    assert value("sglang:feather_decode_shared_segments_count") == 2
    assert value("sglang:feather_decode_shared_segments_sum") == 2 * segments.num_shared_segments == 4
    assert value("sglang:feather_decode_grouping_seconds_count") == 2
    assert value("sglang:feather_decode_kv_tokens_logical_total") == 2 * sum(batch.seq_lens)
    assert value("sglang:feather_decode_kv_tokens_grouped_total") == 2 * segments.num_tokens_read
    assert value("sglang:feather_decode_shared_segment_reads_total") == 2 * (5 + 3)
