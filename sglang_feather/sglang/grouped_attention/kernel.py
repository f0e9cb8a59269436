"""Grouped decode attention in torch operations: each span's KV read once for all of its queries."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from sglang_feather.sglang.grouped_attention.segments import BatchSegments, host_rows

GATHER_BYTES = 4 << 20
"""Most bytes of K one gather may hold (V as much again). A bucket of long private tails would otherwise
gather a whole batch's KV per layer at once and stream it through memory twice; in gathers of a few MB, as
per-request attention makes, it stays in cache between the gather and the product (on this CPU, 64 private
2K-token spans x 4 KV heads x 64, one layer: 64 ms in 4 MB gathers, 128 ms in 16 MB, 256 ms in 64 MB)."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """Spans padded to one shape: `kv_pages[s, p]` is the KV page holding span s's tokens `[p * page_size,
    (p + 1) * page_size)` (every span starts on a page boundary), `q_index[s, n]` its n-th query."""

    kv_pages: torch.Tensor  # [num_spans, max_tokens / page_size] int64; a pad page: the leader's first
    page_size: int
    lengths: torch.Tensor  # [num_spans] int64: each span's real tokens
    kv_bias: torch.Tensor | None  # [num_spans, 1, 1, max_tokens] float32: 0, or -inf on pads; None: no pads
    q_index: torch.Tensor  # [num_spans, max_queries] int64, pads repeat the span's first query
    valid_rows: torch.Tensor | None  # the real (span, query) rows of the flattened [S * N]; None: all are

    @property
    def owners(self) -> torch.Tensor:
        """The request of each partial result this bucket produces, in order."""
        flat = self.q_index.view(-1)
        return flat if self.valid_rows is None else flat[self.valid_rows]


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """The buckets of one forward and, per partial result in bucket order, the request it belongs to."""

    num_requests: int
    buckets: tuple[Bucket, ...]
    partial_owner: torch.Tensor  # [num_partials] int64

    @classmethod
    def build(
        cls, segments: BatchSegments, rows: torch.Tensor, kv_bytes_per_token: int = 0, page_size: int = 1
    ) -> DecodePlan:
        """Bucket spans by (power-of-two length, power-of-two query count), so padding wastes < 2x each way;
        a bucket whose K would exceed `GATHER_BYTES` is cut into several. Partials are owned in bucket order.
        The shared segments (few) and the tails (one per request) go into one array of (row, start, end,
        queries) and are bucketed there (this runs every forward). Spans are gathered by whole pages of
        `page_size` slots (SGLang's paged layout; `find_segments` cuts them on page boundaries)."""
        shared = segments.shared
        tails = np.flatnonzero(segments.seq_lens > segments.tail_starts)
        num = np.empty((len(shared) + tails.size, 4), dtype=np.int64)
        if shared:
            num[: len(shared)] = [(s.row, s.start, s.end, len(s.members)) for s in shared]
        num[len(shared) :, 0] = tails
        num[len(shared) :, 1] = segments.tail_starts[tails]
        num[len(shared) :, 2] = segments.seq_lens[tails]
        num[len(shared) :, 3] = 1
        lengths = num[:, 2] - num[:, 1]
        key = _ceil_log2(lengths) * 64 + _ceil_log2(num[:, 3])
        order = np.argsort(key, kind="stable")
        cuts = np.flatnonzero(np.diff(key[order])) + 1
        table = host_rows(rows)
        buckets: list[Bucket] = []
        for picked in np.split(order, cuts):
            max_tokens = int(lengths[picked].max())
            span_bytes = kv_bytes_per_token * max_tokens
            per_gather = max(1, GATHER_BYTES // span_bytes) if span_bytes else len(picked)
            members = [shared[i].members for i in picked.tolist() if i < len(shared)]
            full, num_queries = _bucket(members, num[picked], table, page_size, rows.device)
            for first in range(0, len(picked), per_gather):
                buckets.append(_cut(full, num_queries, first, first + per_gather))
        owners = torch.cat([bucket.owners for bucket in buckets])
        return cls(segments.num_requests, tuple(buckets), owners)


class GatherScratch:
    """Grow-only buffers the gathers write into. Fresh multi-MB tensors per gather and layer would come from
    fresh pages: glibc hands allocations that large back to the OS when freed, and on this CPU the page
    faults cost 5,500 faults and about 2x the attention time of a 64-request step."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        key = (name, like.dtype, like.device)
        size = math.prod(shape)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(size, dtype=like.dtype, device=like.device)
            self._buffers[key] = buffer
        return buffer[:size].view(shape)


class SpanAttention(Protocol):
    """One bucket's attention: queries [S, Hkv, M, D] over each span's KV in the pool buffers; returns the
    output [S, Hkv, M, Dv] and the log-sum-exp [S, Hkv, M] (float32)."""

    def __call__(
        self,
        queries: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        bucket: Bucket,
        scaling: float,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class GatherThenAttend:
    """Gathers each span's K and V once (into reused scratch), then `attend_with_lse`: any device."""

    def __init__(self) -> None:
        self.scratch = GatherScratch()

    def __call__(
        self,
        queries: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        bucket: Bucket,
        scaling: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [S, Hkv, T, D] as strided views of one gather of whole pages each (index_select copies whole rows:
        # on this CPU 5-18x faster than advanced indexing with the same 2-D index).
        pages = bucket.kv_pages.view(-1)
        keys = _gather_pages(k_buffer, pages, bucket.page_size, self.scratch, "k")
        values = _gather_pages(v_buffer, pages, bucket.page_size, self.scratch, "v")
        shape = (bucket.kv_pages.shape[0], -1, k_buffer.shape[1], k_buffer.shape[2])
        keys = keys.view(shape).to(queries.dtype).transpose(1, 2)
        values = values.view(shape).to(queries.dtype).transpose(1, 2)
        mask = None if bucket.kv_bias is None else bucket.kv_bias.to(queries.dtype)
        return attend_with_lse(queries, keys, values, mask, scaling)


class TritonSpans:
    """`triton_spans.span_attention`: reads each span's K and V through its page ids, no gather (CUDA)."""

    def __init__(self) -> None:
        from sglang_feather.sglang.grouped_attention import triton_spans

        self.span_attention = triton_spans.span_attention

    def __call__(
        self,
        queries: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        bucket: Bucket,
        scaling: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.span_attention(
            queries, k_buffer, v_buffer, bucket.kv_pages, bucket.lengths, scaling, page_size=bucket.page_size
        )


def span_attention_for(device: torch.device) -> SpanAttention:
    """The fused Triton kernel on a CUDA device with Triton; gather-then-attend elsewhere."""
    if device.type == "cuda":
        try:
            return TritonSpans()
        except ImportError:
            pass  # no Triton: the unfused path below is correct, only slower
    return GatherThenAttend()


def grouped_decode(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    plan: DecodePlan,
    scaling: float,
    attend: SpanAttention | None = None,
) -> torch.Tensor:
    """Decode attention for `q` [num_requests, q_heads, head_dim] over the KV pool buffers
    [num_slots, kv_heads, head_dim(_v)]; returns [num_requests, q_heads, v_head_dim] in q's dtype.
    `attend` does one bucket's spans (default: `GatherThenAttend`, with scratch of its own).

    How it works: a `DecodePlan` turns a batch's spans (`segments.py`) into a few padded batches ("buckets")
    of spans of similar length and query count, with the KV slot indices and query rows of each, built once
    per forward. Per layer, each bucket's spans are attended by a `SpanAttention` (their K and V read once for
    all of a span's queries, the query heads of one KV head side by side for GQA), which keeps each query's
    partial output with its log-sum-exp. A request's partials (one per span on its path, its tail included)
    merge exactly: out = sum_j exp(lse_j - LSE) o_j with LSE = logsumexp_j lse_j, done for the whole batch by
    scatter operations in float32; the output has the query's dtype."""
    attend = attend if attend is not None else GatherThenAttend()
    num_requests, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not split over {num_kv_heads} KV heads")
    group = num_q_heads // num_kv_heads
    v_dim = v_buffer.shape[2]
    outs, lses = [], []
    for bucket in plan.buckets:
        num_spans, num_queries = bucket.q_index.shape
        # [S, Hkv, N * group, D]: one KV head's query heads side by side, each span's queries together.
        queries = (
            q.index_select(0, bucket.q_index.view(-1))
            .view(num_spans, num_queries, num_kv_heads, group, head_dim)
            .transpose(1, 2)
            .reshape(num_spans, num_kv_heads, num_queries * group, head_dim)
        )
        out, lse = attend(queries, k_buffer, v_buffer, bucket, scaling)
        # Back to one row per (span, query), its query heads in order.
        out = (
            out.view(num_spans, num_kv_heads, num_queries, group, v_dim)
            .transpose(1, 2)
            .reshape(num_spans * num_queries, num_q_heads, v_dim)
        )
        lse = (
            lse.view(num_spans, num_kv_heads, num_queries, group)
            .transpose(1, 2)
            .reshape(num_spans * num_queries, num_q_heads)
        )
        if bucket.valid_rows is not None:
            out, lse = out.index_select(0, bucket.valid_rows), lse.index_select(0, bucket.valid_rows)
        outs.append(out.float())
        lses.append(lse.float())
    return merge_partials(torch.cat(outs), torch.cat(lses), plan.partial_owner, num_requests).to(q.dtype)


def attend_with_lse(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of [S, H, N, D] queries over [S, H, T, D] keys with an additive [S, 1, 1, T] mask; returns
    the output [S, H, N, Dv] and the log-sum-exp of the scores [S, H, N] (float32).

    On the CPU this is the fused flash kernel `scaled_dot_product_attention` itself dispatches to (float32
    accumulation for bf16 inputs), called directly because it also returns the log-sum-exp; elsewhere the
    same in three products until a fused kernel for that device plugs in here."""
    if queries.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            queries, keys, values, 0.0, False, attn_mask=mask, scale=scaling
        )
        return out, lse
    return attend_with_lse_unfused(queries, keys, values, mask, scaling)


def attend_with_lse_unfused(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`attend_with_lse` in plain products, softmax in float32 (any device)."""
    scores = torch.matmul(queries.float(), keys.float().transpose(-1, -2)).mul_(scaling)
    if mask is not None:
        scores.add_(mask.float())
    lse = torch.logsumexp(scores, dim=-1)
    probs = scores.sub_(lse[..., None]).exp_()
    return torch.matmul(probs, values.float()).to(queries.dtype), lse


def merge_partials(
    outs: torch.Tensor, lses: torch.Tensor, owner: torch.Tensor, num_requests: int
) -> torch.Tensor:
    """Exact log-sum-exp merge of partial attention results [P, H, Dv] (lse [P, H]) into [num_requests, H, Dv]."""
    num_heads = lses.shape[1]
    index = owner[:, None].expand(-1, num_heads)
    top = torch.full((num_requests, num_heads), float("-inf"), dtype=lses.dtype, device=lses.device)
    top.scatter_reduce_(0, index, lses, reduce="amax")
    weight = torch.exp(lses - top.index_select(0, owner))  # [P, H]
    total = torch.zeros_like(top).index_add_(0, owner, weight)
    merged = torch.zeros((num_requests, num_heads, outs.shape[2]), dtype=outs.dtype, device=outs.device)
    merged.index_add_(0, owner, outs * weight[..., None])
    return merged / total[..., None]


def _gather_pages(
    buffer: torch.Tensor, pages: torch.Tensor, page_size: int, scratch: GatherScratch, name: str
) -> torch.Tensor:
    """The pool buffer's `pages` [n], whole, into scratch: [n * page_size, Hkv, D]."""
    num_pages = buffer.shape[0] // page_size
    paged = buffer[: num_pages * page_size].view(num_pages, page_size * buffer.shape[1], buffer.shape[2])
    out = scratch.take(name, (pages.numel(), *paged.shape[1:]), buffer)
    torch.index_select(paged, 0, pages, out=out)
    return out.view(-1, *buffer.shape[1:])


def _bucket(
    members: list[tuple[int, ...]], num: np.ndarray, table: np.ndarray, page_size: int, device: torch.device
) -> tuple[Bucket, np.ndarray]:
    """All of a shape's spans (`num`: their rows of (row, start, end, queries); `members`: the shared spans'
    queries, which come first in a bucket with any) in one padded bucket (`_cut` takes its gathers out of it)
    and each span's query count; indices are built on the host, moved once."""
    leaders, starts, ends, num_members = num.T
    lengths = ends - starts
    max_pages, max_queries = -(-int(lengths.max()) // page_size), int(num_members.max())
    max_tokens = max_pages * page_size
    positions = starts[:, None] + np.arange(0, max_tokens, page_size)[None, :]  # each page's first token
    kv_bias = None
    if int(lengths.min()) < max_tokens:
        pad = np.arange(max_tokens)[None, :] >= lengths[:, None]
        bias = np.where(pad, np.float32(-np.inf), np.float32(0))[:, None, None, :]
        kv_bias = torch.from_numpy(bias).to(device)
        positions[positions >= ends[:, None]] = 0  # whole pad pages read the leader's first page, masked
    kv_pages = torch.from_numpy(table[leaders[:, None], positions].astype(np.int64) // page_size).to(device)
    if max_queries == 1:  # private spans: the leader is the only query
        queries = leaders[:, None].copy()
    else:
        queries = np.repeat(leaders[:, None], max_queries, axis=1)  # pads repeat the first query
        for s, span_members in enumerate(members):
            queries[s, : len(span_members)] = span_members
    q_index = torch.from_numpy(queries).to(device)
    lengths_t = torch.from_numpy(lengths.copy()).to(device)
    bucket = Bucket(kv_pages, page_size, lengths_t, kv_bias, q_index, None)
    return bucket, num_members


def _cut(bucket: Bucket, num_queries: np.ndarray, first: int, end: int) -> Bucket:
    """Spans [first, end) of a bucket (views), with the rows of their real queries where some are pads."""
    max_queries = bucket.q_index.shape[1]
    valid_rows = None
    counts = num_queries[first:end]
    if int(counts.min()) < max_queries:
        real = np.arange(max_queries)[None, :] < counts[:, None]
        valid_rows = torch.from_numpy(np.flatnonzero(real)).to(bucket.q_index.device)
    bias = None if bucket.kv_bias is None else bucket.kv_bias[first:end]
    return Bucket(
        bucket.kv_pages[first:end],
        bucket.page_size,
        bucket.lengths[first:end],
        bias,
        bucket.q_index[first:end],
        valid_rows,
    )


def _ceil_log2(values: np.ndarray) -> np.ndarray:
    """ceil(log2(v)) of positive integers, exactly (frexp's exponent of v - 1 is its bit length)."""
    return np.frexp((values - 1).astype(np.float64))[1].astype(np.int64)
