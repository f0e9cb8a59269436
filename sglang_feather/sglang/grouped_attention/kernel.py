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
    (p + 1) * page_size)` (every span starts on a page boundary). Its (span, query) pairs, span by span, are
    the step's partial-result rows `[first_row, first_row + num_spans * num_queries)`."""

    kv_pages: torch.Tensor  # [num_spans, max_tokens / page_size] int64; a pad page: the span's last real one
    page_size: int
    lengths: torch.Tensor  # [num_spans] int64: each span's real tokens
    kv_bias: torch.Tensor | None  # [num_spans, 1, 1, max_tokens] float32: 0, or -inf on pads; None: no pads
    num_queries: int  # queries per span, pads included (a pad repeats the span's first query)
    first_row: int


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """The buckets of one forward; the request whose query each partial-result row holds (bucket by bucket,
    pads included); and each request's partial rows side by side for the merge: `merge_rows[r, j]` is its
    j-th, and where it has fewer than the deepest request, `merge_pads` marks the repeats of its first."""

    num_requests: int
    buckets: tuple[Bucket, ...]
    query_rows: torch.Tensor  # [num_rows] int64
    merge_rows: torch.Tensor | None  # [num_requests, depth] int64; None: row r is request r's only partial
    merge_pads: torch.Tensor | None  # [num_requests, depth, 1] bool; None: no pads

    @classmethod
    def build(
        cls, segments: BatchSegments, rows: torch.Tensor, kv_bytes_per_token: int = 0, page_size: int = 1
    ) -> DecodePlan:
        """Bucket spans by (power-of-two length, power-of-two query count), so padding wastes < 2x each way;
        a bucket whose K would exceed `GATHER_BYTES` is cut into several. The shared segments (few) and the
        tails (one per request) go into one array of (row, start, end, queries) and are bucketed there, and
        the merge's rows are listed here, once per forward, so that a layer only indexes with them. Spans are
        gathered by whole pages of `page_size` slots (SGLang's paged layout; `find_segments` cuts them on page
        boundaries), so only each page's first slot is looked up."""
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
        pages = host_rows(rows)[:, ::page_size]  # each page's first slot
        device = rows.device
        buckets: list[Bucket] = []
        queries: list[np.ndarray] = []  # per bucket, its (span, query) rows' requests
        # (first row, which of its rows are real) of each bucket with pad queries
        pads: list[tuple[int, np.ndarray]] = []
        first_row = 0
        for picked in np.split(order, cuts):
            members = [shared[i].members for i in picked.tolist() if i < len(shared)]
            kv_pages, kv_bias, span_queries, counts = _bucket(members, num[picked], pages, page_size)
            num_spans, num_queries = span_queries.shape
            span_bytes = kv_bytes_per_token * int(lengths[picked].max())
            per_gather = max(1, GATHER_BYTES // span_bytes) if span_bytes else num_spans
            pages_t = torch.from_numpy(kv_pages).to(device)
            lengths_t = torch.from_numpy(lengths[picked]).to(device)
            bias_t = None if kv_bias is None else torch.from_numpy(kv_bias).to(device)
            for first in range(0, num_spans, per_gather):
                end = first + per_gather
                bias = None if bias_t is None else bias_t[first:end]
                row = first_row + first * num_queries
                buckets.append(
                    Bucket(pages_t[first:end], page_size, lengths_t[first:end], bias, num_queries, row)
                )
            if num_queries > 1 and int(counts.min()) < num_queries:
                pads.append((first_row, (np.arange(num_queries) < counts[:, None]).reshape(-1)))
            first_row += num_spans * num_queries
            queries.append(span_queries.reshape(-1))
        owners = np.concatenate(queries)
        real = None
        if pads:
            real = np.ones(owners.size, dtype=bool)
            for first, mask in pads:
                real[first : first + mask.size] = mask
        rows_np, pads_np = _merge_rows(owners, real, segments.num_requests)
        query_rows = torch.from_numpy(owners).to(device)
        merge_rows = None if rows_np is None else torch.from_numpy(rows_np).to(device)
        merge_pads = None if pads_np is None else torch.from_numpy(pads_np).to(device)
        return cls(segments.num_requests, tuple(buckets), query_rows, merge_rows, merge_pads)


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
    of spans of similar length and query count, with the KV pages and query rows of each, built once per
    forward. Per layer, every bucket's queries are gathered in one index, and each bucket's spans are attended
    by a `SpanAttention` (their K and V read once for all of a span's queries, the query heads of one KV head
    side by side for GQA), which keeps each query's partial output with its log-sum-exp. A request's partials
    (one per span on its path, its tail included) merge exactly: out = sum_j exp(lse_j - LSE) o_j with
    LSE = logsumexp_j lse_j, i.e. a softmax over the partials' log-sum-exps, done for the whole batch on the
    partials gathered side by side in float32 (`merge_partials`); the output has the query's dtype."""
    attend = attend if attend is not None else GatherThenAttend()
    num_requests, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not split over {num_kv_heads} KV heads")
    group = num_q_heads // num_kv_heads
    v_dim = v_buffer.shape[2]
    every_query = q.index_select(0, plan.query_rows)  # [num_rows, q_heads, D], bucket by bucket
    outs, lses = [], []
    for bucket in plan.buckets:
        num_spans, num_queries = bucket.kv_pages.shape[0], bucket.num_queries
        # [S, Hkv, N * group, D]: one KV head's query heads side by side, each span's queries together.
        queries = (
            every_query[bucket.first_row : bucket.first_row + num_spans * num_queries]
            .view(num_spans, num_queries, num_kv_heads, group, head_dim)
            .transpose(1, 2)
            .reshape(num_spans, num_kv_heads, num_queries * group, head_dim)
        )
        out, lse = attend(queries, k_buffer, v_buffer, bucket, scaling)
        # Back to one row per (span, query), its query heads in order (views where Hkv or N is 1).
        outs.append(
            out.view(num_spans, num_kv_heads, num_queries, group, v_dim)
            .transpose(1, 2)
            .reshape(num_spans * num_queries, num_q_heads, v_dim)
        )
        lses.append(
            lse.view(num_spans, num_kv_heads, num_queries, group)
            .transpose(1, 2)
            .reshape(num_spans * num_queries, num_q_heads)
        )
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    lse = lses[0] if len(lses) == 1 else torch.cat(lses)
    return merge_partials(out.float(), lse.float(), plan.merge_rows, plan.merge_pads).to(q.dtype)


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
    outs: torch.Tensor, lses: torch.Tensor, rows: torch.Tensor | None, pads: torch.Tensor | None
) -> torch.Tensor:
    """Exact log-sum-exp merge of partial results [P, H, Dv] (lse [P, H], float32) into [R, H, Dv]: request
    r's partials are rows `rows[r]` ([R, depth]; None: row r alone), those `pads` marks ([R, depth, 1])
    repeats weighed 0. Each partial's weight exp(lse_j - LSE) is the softmax of the lses over a request's."""
    if rows is None:
        return outs
    num_requests, depth = rows.shape
    flat = rows.view(-1)
    if depth == 1:
        return outs.index_select(0, flat)
    weights = lses.index_select(0, flat).view(num_requests, depth, -1)
    if pads is not None:
        weights.masked_fill_(pads, float("-inf"))
    weights = torch.softmax(weights, dim=1)
    merged = outs.index_select(0, flat).view(num_requests, depth, *outs.shape[1:])
    return merged.mul_(weights.unsqueeze(-1)).sum(1)


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
    members: list[tuple[int, ...]], num: np.ndarray, pages: np.ndarray, page_size: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """All of a shape's spans (`num`: their rows of (row, start, end, queries); `members`: the shared spans'
    queries, which come first in a bucket with any) padded to one shape, from each row's page-first slots
    `pages`: their KV pages [S, P], the additive bias [S, 1, 1, P * page_size] (None: no pads), their queries
    [S, N] (pads repeat the first) and each span's number of real queries."""
    leaders, starts, ends, num_members = num.T
    lengths = ends - starts
    max_pages, max_queries = -(-int(lengths.max()) // page_size), int(num_members.max())
    max_tokens = max_pages * page_size
    # A span's pages from its first; pad pages repeat its last real page, masked by the bias.
    columns = np.minimum(
        starts[:, None] // page_size + np.arange(max_pages), (ends[:, None] - 1) // page_size
    )
    kv_pages = pages[leaders[:, None], columns].astype(np.int64) // page_size
    kv_bias = None
    if int(lengths.min()) < max_tokens:
        pad = np.arange(max_tokens)[None, :] >= lengths[:, None]
        kv_bias = np.where(pad, np.float32(-np.inf), np.float32(0))[:, None, None, :]
    if max_queries == 1:  # private spans: the leader is the only query
        queries = leaders[:, None].copy()
    else:
        queries = np.repeat(leaders[:, None], max_queries, axis=1)  # pads repeat the first query
        for s, span_members in enumerate(members):
            queries[s, : len(span_members)] = span_members
    return kv_pages, kv_bias, queries, num_members


def _merge_rows(
    owners: np.ndarray, real: np.ndarray | None, num_requests: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """`DecodePlan.merge_rows` and `merge_pads` from the request of each partial row and which rows are real
    (None: all): each request's real rows in row order, side by side, a request with fewer padded with its
    first. Where every request has as many partials (one group, or nothing shared), it is one reshape."""
    rows = np.arange(owners.size) if real is None else np.flatnonzero(real)
    owners = owners[rows]
    by_owner = np.argsort(owners, kind="stable")
    rows = rows[by_owner]
    counts = np.bincount(owners, minlength=num_requests)
    depth = int(counts.max(initial=1))
    if int(counts.min(initial=depth)) == depth:
        if depth == 1 and bool((rows == np.arange(num_requests)).all()):
            return None, None  # the rows are the requests, in order
        return rows.reshape(num_requests, depth), None
    firsts = np.cumsum(counts) - counts
    merge_rows = np.repeat(rows[firsts][:, None], depth, axis=1)
    merge_rows[owners[by_owner], np.arange(rows.size) - np.repeat(firsts, counts)] = rows
    return merge_rows, (np.arange(depth) >= counts[:, None])[:, :, None]


def _ceil_log2(values: np.ndarray) -> np.ndarray:
    """ceil(log2(v)) of positive integers, exactly (frexp's exponent of v - 1 is its bit length)."""
    return np.frexp((values - 1).astype(np.float64))[1].astype(np.int64)
