"""`--attention-backend feather_grouped`: SGLang's torch_native backend with a prefix-grouped decode."""

from __future__ import annotations

import logging
from typing import Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

from sglang_feather.sglang.grouped_attention.kernel import DecodePlan, grouped_decode, span_attention_for
from sglang_feather.sglang.grouped_attention.names import GROUPED, GroupedAttentionError
from sglang_feather.sglang.grouped_attention.observe import SegmentObserver, decode_seq_lens

logger = logging.getLogger(__name__)


class GroupedDecodeAttnBackend(TorchNativeAttnBackend):
    """Decode batches attend through `grouped_decode`, each shared prefix read once per step; extend, mixed
    and idle batches run torch_native's code unchanged. The segments are found once per forward, in
    `init_forward_metadata`, and every layer reuses the plan."""

    def __init__(self, model_runner: Any, observer: SegmentObserver) -> None:
        refuse_unservable(model_runner)
        super().__init__(model_runner)
        kv_pool, req_pool = self.token_to_kv_pool, self.req_to_token_pool
        if not isinstance(kv_pool, MHATokenToKVPool) or not isinstance(req_pool, ReqToTokenPool):
            raise GroupedAttentionError(
                f"attention backend {GROUPED} reads SGLang's MHA KV pool and request-to-token pool, got "
                f"{type(kv_pool).__name__} and {type(req_pool).__name__}"
            )
        self.kv_pool: MHATokenToKVPool = kv_pool
        self.req_pool: ReqToTokenPool = req_pool
        self.observer = observer
        self.plan: DecodePlan | None = None
        self.attend = span_attention_for(torch.device(self.device))
        k_buffer = kv_pool.get_key_buffer(0)
        self.kv_bytes_per_token = k_buffer[0].numel() * k_buffer.element_size()
        logger.info(
            "attention backend %s: prefix-grouped decode (each shared prefix read once per step; extend and "
            "mixed batches through torch_native), page size %d, spans attended by %s",
            GROUPED,
            observer.page_size,
            type(self.attend).__name__,
        )

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        self.plan = None
        seq_lens = decode_seq_lens(forward_batch)
        if seq_lens is None:
            return
        segments, rows = self.observer.observe(
            self.req_pool.req_to_token, forward_batch.req_pool_indices, seq_lens
        )
        self.plan = DecodePlan.build(segments, rows, self.kv_bytes_per_token, self.observer.page_size)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.plan is None:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        if save_kv_cache and k is not None and v is not None:
            self.kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )
        q = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = grouped_decode(
            q,
            self.kv_pool.get_key_buffer(layer.layer_id),
            self.kv_pool.get_value_buffer(layer.layer_id),
            self.plan,
            layer.scaling,
            self.attend,
        )
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)


def refuse_unservable(model_runner: Any) -> None:
    """Models whose decode attention is not plain causal self-attention over the whole KV are refused here, at
    startup, naming the flag (the grouped kernel has no masks, windows or latent KV)."""
    config = model_runner.model_config
    hf = getattr(config, "hf_text_config", None)
    reasons = {
        "MLA (latent KV)": bool(getattr(model_runner, "use_mla_backend", False)),
        "encoder-decoder cross-attention": bool(getattr(config, "is_encoder_decoder", False)),
        "sliding-window attention": getattr(model_runner, "sliding_window_size", None) is not None,
        "chunked local attention": getattr(config, "attention_chunk_size", None) is not None,
        "attention logit soft-capping": bool(getattr(hf, "attn_logit_softcapping", None)),
    }
    found = [reason for reason, present in reasons.items() if present]
    if found:
        raise GroupedAttentionError(
            f"--attention-backend {GROUPED} cannot serve this model ({', '.join(found)}); "
            "use --attention-backend torch_native"
        )
