"""Reference decode attention: gather each request's K/V through its page table, then PyTorch SDPA."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels_bench.paged import DecodeInputs


def token_slots(inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat cache slot of every (request, position) up to the longest context, and the validity mask."""
    max_len = int(inputs.seq_lens.max())
    positions = torch.arange(max_len, device=inputs.page_table.device)
    page_size = inputs.page_size
    num_table_pages = inputs.page_table.shape[1]
    page_index = torch.clamp(positions // page_size, max=num_table_pages - 1)
    pages = inputs.page_table[:, page_index].to(torch.int64)
    slots = pages * page_size + positions % page_size
    valid = positions[None, :] < inputs.seq_lens[:, None].to(torch.int64)
    return slots, valid


def gather_kv(inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-request K and V, (batch, num_kv_heads, max_len, head_dim), plus the (batch, max_len) valid mask."""
    slots, valid = token_slots(inputs)
    _, _, num_kv_heads, head_dim = inputs.k_cache.shape
    flat_k = inputs.k_cache.reshape(-1, num_kv_heads, head_dim)
    flat_v = inputs.v_cache.reshape(-1, num_kv_heads, head_dim)
    k = flat_k[slots].transpose(1, 2)
    v = flat_v[slots].transpose(1, 2)
    return k, v, valid


def sdpa_decode(inputs: DecodeInputs, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """(batch, num_q_heads, head_dim) attention (GQA via `enable_gqa`), computed in `compute_dtype` if given.

    K/V are gathered in the cache's dtype and only then converted, so a float32 reference of a few rows
    never copies the whole cache.
    """
    k, v, valid = gather_kv(inputs)
    dtype = compute_dtype or inputs.q.dtype
    q = inputs.q[:, :, None, :].to(dtype)
    mask = None if bool(valid.all()) else valid[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q, k.to(dtype), v.to(dtype), attn_mask=mask, scale=inputs.scale, enable_gqa=True
    )
    return out[:, :, 0, :]


def select_rows(inputs: DecodeInputs, rows: torch.Tensor) -> DecodeInputs:
    """The same cache with only the requests `rows` (for a cheap spot check of a large batch)."""
    return DecodeInputs(
        q=inputs.q[rows],
        k_cache=inputs.k_cache,
        v_cache=inputs.v_cache,
        page_table=inputs.page_table[rows],
        seq_lens=inputs.seq_lens[rows],
        scale=inputs.scale,
    )
