"""One bucket of grouped decode attention in Triton: K/V read through page indices, no gather."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_BLOCK = 16
"""`tl.dot` on the GPU needs every tile side >= 16: query rows, keys per tile and the head dims are padded."""

LOG2E = 1.4426950408889634


# How it works: one program per (span, KV head, block of BLOCK_M query rows), ordered span-major so the
# programs reading one span's KV run side by side. A program loads its query rows once, then walks the
# span's first `lengths[s]` keys in tiles of BLOCK_N: it reads the tile's page ids from `kv_pages` (token t
# of a span is slot `kv_pages[s, t // PAGE_SIZE] * PAGE_SIZE + t % PAGE_SIZE`), loads those K and V rows
# straight from the pool buffers (once for all BLOCK_M rows; slots past the span's length
# are neither read nor counted), and folds the tile in with an online softmax in float32 (running max `m`,
# normaliser `l`, un-normalised output), with base-2 exponentials of the scores prescaled by log2(e). It
# writes the normalised output in the queries' dtype and the natural log-sum-exp `m + ln l` of the scaled
# scores, the partial result that `kernel.merge_partials` merges across a request's spans. Importing this
# module imports Triton.
@triton.jit
def _span_kernel(
    Q,
    K,
    V,
    KvPages,
    Lengths,
    Out,
    Lse,
    qk_scale,
    num_rows,
    max_tokens,
    stride_qs,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kslot,
    stride_kh,
    stride_kd,
    stride_vslot,
    stride_vh,
    stride_vd,
    stride_ps,
    stride_pp,
    stride_os,
    stride_oh,
    stride_om,
    stride_od,
    stride_ls,
    stride_lh,
    stride_lm,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m_blocks = tl.cdiv(num_rows, BLOCK_M)
    m_block = pid % num_m_blocks
    kv_head = (pid // num_m_blocks) % NUM_KV_HEADS
    span = (pid // (num_m_blocks * NUM_KV_HEADS)).to(tl.int64)

    end = tl.minimum(tl.load(Lengths + span).to(tl.int32), max_tokens)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_m = offs_m < num_rows
    mask_d = offs_d < HEAD_DIM
    mask_dv = offs_dv < HEAD_DIM_V

    q_ptrs = (
        Q + span * stride_qs + kv_head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    k_base = K + kv_head * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + kv_head * stride_vh + offs_dv[None, :] * stride_vd
    pages_base = KvPages + span * stride_ps

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for tile in range(0, end, BLOCK_N):
        toks = tile + offs_n
        mask_n = toks < end
        pages = tl.load(pages_base + (toks // PAGE_SIZE) * stride_pp, mask=mask_n, other=0).to(tl.int64)
        slots = pages * PAGE_SIZE + toks % PAGE_SIZE
        k = tl.load(k_base + slots[:, None] * stride_kslot, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + slots[:, None] * stride_vslot, mask=mask_n[:, None] & mask_dv[None, :], other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision="ieee")
        m_i = m_new

    # An empty span (length 0) leaves l = 0: output 0 and log-sum-exp -inf, a partial that merges as nothing.
    nonempty = l_i > 0.0
    safe_l = tl.where(nonempty, l_i, 1.0)
    out = acc / safe_l[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(safe_l)) * 0.6931471805599453, float("-inf"))
    out_ptrs = (
        Out
        + span * stride_os
        + kv_head * stride_oh
        + offs_m[:, None] * stride_om
        + offs_dv[None, :] * stride_od
    )
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_dv[None, :])
    tl.store(Lse + span * stride_ls + kv_head * stride_lh + offs_m * stride_lm, lse, mask=mask_m)


def supported(device: torch.device) -> bool:
    """Whether `span_attention` can run on `device`: a CUDA device torch sees (Triton is importable: this
    module imported it; a caller without Triton gets ImportError from the import instead)."""
    return device.type == "cuda" and torch.cuda.is_available()


def default_blocks(num_rows: int, max_tokens: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for a bucket: rows padded to at most 64, keys per tile 64 (32 past head dim 128)."""
    block_m = min(64, max(MIN_BLOCK, triton.next_power_of_2(num_rows)))
    block_n = min(64 if head_dim <= 128 else 32, max(MIN_BLOCK, triton.next_power_of_2(max(1, max_tokens))))
    return block_m, block_n


def span_attention(
    queries: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_pages: torch.Tensor,
    lengths: torch.Tensor,
    scaling: float,
    *,
    page_size: int = 1,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each span's queries [S, Hkv, M, D] (any strides) over its first `lengths[s]` keys, K and V
    read from the pool buffers [num_slots, Hkv, D(v)] through the pages `kv_pages` ([S, P], int64 or int32):
    span s's token t is slot `kv_pages[s, t // page_size] * page_size + t % page_size` (page size 1: the
    entries are the slots). Tokens past a span's length are never read; lengths above P * page_size count as
    that. Returns the output [S, Hkv, M, Dv] in the queries' dtype and the natural log-sum-exp of the scaled
    scores [S, Hkv, M] in float32; a span of length 0 gives output 0 and log-sum-exp -inf. K/V are cast to
    the queries' dtype."""
    if queries.dim() != 4 or k_buffer.dim() != 3 or v_buffer.dim() != 3 or kv_pages.dim() != 2:
        raise ValueError(
            "need queries [S, Hkv, M, D], buffers [slots, Hkv, D], kv_pages [S, P]; got "
            f"{tuple(queries.shape)}, {tuple(k_buffer.shape)}, {tuple(v_buffer.shape)}, "
            f"{tuple(kv_pages.shape)}"
        )
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    num_spans, num_kv_heads, num_rows, head_dim = queries.shape
    head_dim_v = v_buffer.shape[2]
    if k_buffer.shape[1:] != (num_kv_heads, head_dim) or v_buffer.shape[:2] != k_buffer.shape[:2]:
        raise ValueError(
            f"buffers {tuple(k_buffer.shape)}, {tuple(v_buffer.shape)} do not fit "
            f"queries {tuple(queries.shape)}"
        )
    if kv_pages.shape[0] != num_spans or lengths.shape != (num_spans,):
        raise ValueError(
            f"kv_pages {tuple(kv_pages.shape)} and lengths {tuple(lengths.shape)} need {num_spans} rows"
        )
    if kv_pages.dtype not in (torch.int32, torch.int64) or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"kv_pages and lengths must be int32 or int64, got {kv_pages.dtype}, {lengths.dtype}"
        )
    max_tokens = kv_pages.shape[1] * page_size
    auto_m, auto_n = default_blocks(num_rows, max_tokens, head_dim)
    block_m, block_n = block_m or auto_m, block_n or auto_n
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < MIN_BLOCK or block & (block - 1):
            raise ValueError(f"{name} must be a power of two >= {MIN_BLOCK}, got {block}")
    out = torch.empty(
        (num_spans, num_kv_heads, num_rows, head_dim_v), dtype=queries.dtype, device=queries.device
    )
    lse = torch.empty((num_spans, num_kv_heads, num_rows), dtype=torch.float32, device=queries.device)
    grid = num_spans * num_kv_heads * triton.cdiv(num_rows, block_m)
    if grid == 0:
        return out, lse
    _span_kernel[(grid,)](
        queries,
        k_buffer,
        v_buffer,
        kv_pages,
        lengths,
        out,
        lse,
        scaling * LOG2E,
        num_rows,
        max_tokens,
        *queries.stride(),
        *k_buffer.stride(),
        *v_buffer.stride(),
        *kv_pages.stride(),
        *out.stride(),
        *lse.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(MIN_BLOCK, triton.next_power_of_2(head_dim)),
        BLOCK_DV=max(MIN_BLOCK, triton.next_power_of_2(head_dim_v)),
        PAGE_SIZE=page_size,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out, lse
