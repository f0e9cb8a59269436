"""Split-K (flash-decoding) plan and a PyTorch rendering of the algorithm the Triton kernel runs.

How it works: each request's context is cut into `num_splits` equal token ranges (`split_len`, a multiple of
the tile `block_n`). One program per (request, KV head, split) walks its range tile by tile, gathering the
tile's K/V rows through the page table, and keeps a running max `m`, normaliser `l` and un-normalised output
for the query heads of that KV head (online softmax). It writes the normalised partial output and its
log-sum-exp `m + log l` (-inf for an empty range). A second pass merges the splits of each (request, query
head) with weights `exp(lse_s - max lse)`. `splitk_decode` does the same arithmetic in PyTorch so CPU tests
can check the plan and the merge that `triton_decode.py` implements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels_bench.paged import DecodeInputs
from kernels_bench.reference import token_slots


@dataclass(frozen=True)
class SplitPlan:
    num_splits: int
    split_len: int
    """Tokens per split, a multiple of `block_n`."""
    block_n: int


def plan_splits(
    batch_size: int,
    max_len: int,
    num_kv_heads: int,
    num_sms: int,
    *,
    block_n: int = 64,
    min_split_tokens: int = 256,
    max_splits: int = 64,
) -> SplitPlan:
    """Enough splits for about two programs per SM, never splits shorter than `min_split_tokens`."""
    if min(batch_size, max_len, num_kv_heads, num_sms, block_n) < 1:
        raise ValueError("plan_splits needs positive sizes")
    wanted = -(-2 * num_sms // (batch_size * num_kv_heads))
    cap = -(-max_len // min_split_tokens)
    num_splits = max(1, min(wanted, cap, max_splits))
    split_len = -(-max_len // num_splits)
    split_len = -(-split_len // block_n) * block_n
    return SplitPlan(num_splits=num_splits, split_len=split_len, block_n=block_n)


def splitk_partials(inputs: DecodeInputs, plan: SplitPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised partial outputs (batch, q_heads, splits, dim) and their log-sum-exp (batch, q_heads, splits).

    Accumulates in float32 at least, as the Triton kernel does.
    """
    batch, num_q_heads, head_dim = inputs.q.shape
    num_kv_heads = inputs.k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    slots, valid = token_slots(inputs)
    flat_k = inputs.k_cache.reshape(-1, num_kv_heads, head_dim)
    flat_v = inputs.v_cache.reshape(-1, num_kv_heads, head_dim)
    q = inputs.q.reshape(batch, num_kv_heads, group, head_dim)
    dtype = torch.promote_types(inputs.q.dtype, torch.float32)
    q = q.to(dtype)
    out = torch.zeros(batch, num_q_heads, plan.num_splits, head_dim, dtype=dtype, device=inputs.q.device)
    lse = torch.full(
        (batch, num_q_heads, plan.num_splits), float("-inf"), dtype=dtype, device=inputs.q.device
    )
    max_len = slots.shape[1]
    for split in range(plan.num_splits):
        m = torch.full((batch, num_kv_heads, group), float("-inf"), dtype=dtype, device=q.device)
        denom = torch.zeros_like(m)
        acc = torch.zeros(batch, num_kv_heads, group, head_dim, dtype=dtype, device=q.device)
        start = split * plan.split_len
        for tile in range(start, min(start + plan.split_len, max_len), plan.block_n):
            cols = slice(tile, min(tile + plan.block_n, start + plan.split_len, max_len))
            k = flat_k[slots[:, cols]].to(dtype)
            v = flat_v[slots[:, cols]].to(dtype)
            s = torch.einsum("bhgd,bnhd->bhgn", q, k) * inputs.scale
            s = s.masked_fill(~valid[:, None, None, cols], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - safe)
            p = torch.exp(s - safe[..., None])
            denom = denom * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("bhgn,bnhd->bhgd", p, v)
            m = m_new
        nonempty = denom > 0
        part = acc / torch.where(nonempty, denom, torch.ones_like(denom))[..., None]
        out[:, :, split] = part.reshape(batch, num_q_heads, head_dim)
        split_lse = torch.where(nonempty, m + torch.log(denom), torch.full_like(m, float("-inf")))
        lse[:, :, split] = split_lse.reshape(batch, num_q_heads)
    return out, lse


def merge_splits(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Combine per-split partials into (batch, q_heads, dim); every row needs one non-empty split."""
    weights = torch.softmax(lse, dim=-1)
    return (out * weights[..., None]).sum(dim=2)


def splitk_decode(inputs: DecodeInputs, plan: SplitPlan) -> torch.Tensor:
    return merge_splits(*splitk_partials(inputs, plan)).to(inputs.q.dtype)
