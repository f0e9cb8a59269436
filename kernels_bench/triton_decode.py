"""Paged split-K decode attention in Triton (the algorithm of `splitk.py`, one program per request/head/split).

Grid order is request-major: program id = (request * num_kv_heads + kv_head) * num_splits + split, so the
programs resident at one time cover a window of consecutive requests of the batch (see `locality.py`). Each
program packs the `group` query heads of its KV head into one tile of BLOCK_H rows so a K/V tile is loaded
once for all of them. Importing this module imports Triton; `kernels.py` imports it only when asked for.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_bench.paged import DecodeInputs
from kernels_bench.splitk import SplitPlan


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    PageTable,
    SeqLens,
    PartOut,
    PartLse,
    scale,
    split_len,
    num_splits,
    stride_qb,
    stride_qh,
    stride_kslot,
    stride_kh,
    stride_pt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    split = pid % num_splits
    kv_head = (pid // num_splits) % NUM_KV_HEADS
    req = pid // (num_splits * NUM_KV_HEADS)

    seq_len = tl.load(SeqLens + req)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q = tl.load(
        Q + req * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=mask_h[:, None], other=0.0
    )

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        toks = tile + offs_n
        mask_n = toks < end
        pages = tl.load(PageTable + req * stride_pt + toks // PAGE_SIZE, mask=mask_n, other=0)
        slots = pages.to(tl.int64) * PAGE_SIZE + (toks % PAGE_SIZE)
        kv_offs = slots[:, None] * stride_kslot + kv_head * stride_kh + offs_d[None, :]
        k = tl.load(K + kv_offs, mask=mask_n[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_offs, mask=mask_n[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    nonempty = l_i > 0.0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    out_ptrs = PartOut + req * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(out_ptrs, out, mask=mask_h[:, None])
    tl.store(PartLse + req * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _merge_kernel(
    PartOut,
    PartLse,
    Out,
    num_splits,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_fb,
    stride_fh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_s = offs_s < num_splits
    lse = tl.load(PartLse + req * stride_lb + head * stride_lh + offs_s, mask=mask_s, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, 0))
    weights = weights / tl.sum(weights, 0)
    part_ptrs = PartOut + req * stride_ob + head * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :]
    parts = tl.load(part_ptrs, mask=mask_s[:, None], other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(Out + req * stride_fb + head * stride_fh + offs_d, out.to(Out.dtype.element_ty))


class TritonDecode:
    """Launches the two kernels on preallocated scratch; `__call__` returns (batch, q_heads, dim)."""

    def __init__(self, inputs: DecodeInputs, plan: SplitPlan, *, num_warps: int = 4, num_stages: int = 2):
        batch, num_q_heads, head_dim = inputs.q.shape
        num_kv_heads = inputs.k_cache.shape[2]
        if head_dim & (head_dim - 1) or head_dim < 16:
            raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
        self.inputs = inputs
        self.plan = plan
        self.group = num_q_heads // num_kv_heads
        self.num_kv_heads = num_kv_heads
        self.num_warps = num_warps
        self.num_stages = num_stages
        device = inputs.q.device
        self.part_out = torch.empty(
            batch, num_q_heads, plan.num_splits, head_dim, device=device, dtype=torch.float32
        )
        self.part_lse = torch.empty(batch, num_q_heads, plan.num_splits, device=device, dtype=torch.float32)
        self.out = torch.empty_like(inputs.q)

    def __call__(self) -> torch.Tensor:
        inputs, plan = self.inputs, self.plan
        batch, num_q_heads, head_dim = inputs.q.shape
        k_flat = inputs.k_cache.reshape(-1, self.num_kv_heads, head_dim)
        v_flat = inputs.v_cache.reshape(-1, self.num_kv_heads, head_dim)
        _split_kernel[(batch * self.num_kv_heads * plan.num_splits,)](
            inputs.q,
            k_flat,
            v_flat,
            inputs.page_table,
            inputs.seq_lens,
            self.part_out,
            self.part_lse,
            inputs.scale,
            plan.split_len,
            plan.num_splits,
            inputs.q.stride(0),
            inputs.q.stride(1),
            k_flat.stride(0),
            k_flat.stride(1),
            inputs.page_table.stride(0),
            self.part_out.stride(0),
            self.part_out.stride(1),
            self.part_out.stride(2),
            self.part_lse.stride(0),
            self.part_lse.stride(1),
            NUM_KV_HEADS=self.num_kv_heads,
            GROUP=self.group,
            BLOCK_H=max(16, triton.next_power_of_2(self.group)),
            HEAD_DIM=head_dim,
            PAGE_SIZE=inputs.page_size,
            BLOCK_N=plan.block_n,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )
        _merge_kernel[(batch, num_q_heads)](
            self.part_out,
            self.part_lse,
            self.out,
            plan.num_splits,
            self.part_out.stride(0),
            self.part_out.stride(1),
            self.part_out.stride(2),
            self.part_lse.stride(0),
            self.part_lse.stride(1),
            self.out.stride(0),
            self.out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_S=max(2, triton.next_power_of_2(plan.num_splits)),
        )
        return self.out
