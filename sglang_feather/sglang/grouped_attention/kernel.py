"""Grouped decode attention in torch operations: each span's KV gathered once for all of its queries.

How it works: a `DecodePlan` turns a batch's spans (`segments.py`) into a few padded batches ("buckets") of
spans of similar length and query count, with the KV slot indices and query rows of each, built once per
forward. Per layer, each bucket gathers its spans' K and V once, multiplies all of a span's queries (GQA:
the query heads of one KV head side by side) against them in one batched product, and keeps each query's
partial output with its log-sum-exp. A request's partials (one per span on its path, its tail included)
merge exactly: out = sum_j exp(lse_j - LSE) o_j with LSE = logsumexp_j lse_j, done for the whole batch by
scatter operations in float32; the output has the query's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_feather.sglang.grouped_attention.segments import BatchSegments, Span

GATHER_BYTES = 4 << 20
"""Most bytes of K one gather may hold (V as much again). A bucket of long private tails would otherwise
gather a whole batch's KV per layer at once and stream it through memory twice; in gathers of a few MB, as
per-request attention makes, it stays in cache between the gather and the product (on this CPU, 64 tails of
2K tokens x 4 KV heads x 64: one 138 MB gather 183 ms, 16 gathers of 4 spans 117 ms including the products)."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """Spans padded to one shape: `kv_index[s, t]` is span s's t-th KV slot, `q_index[s, n]` its n-th query."""

    kv_index: torch.Tensor  # [num_spans, max_tokens] int64, pads point at slot 0
    kv_bias: torch.Tensor | None  # [num_spans, 1, 1, max_tokens] float32: 0, or -inf on pads; None: no pads
    q_index: torch.Tensor  # [num_spans, max_queries] int64, pads repeat query 0
    q_valid: torch.Tensor  # [num_spans, max_queries] bool

    def cut(self, first: int, end: int) -> Bucket:
        """Spans [first, end) of this bucket (views)."""
        bias = None if self.kv_bias is None else self.kv_bias[first:end]
        return Bucket(self.kv_index[first:end], bias, self.q_index[first:end], self.q_valid[first:end])


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """The buckets of one forward and, per partial result in bucket order, the request it belongs to."""

    num_requests: int
    buckets: tuple[Bucket, ...]
    partial_owner: torch.Tensor  # [num_partials] int64

    @classmethod
    def build(cls, segments: BatchSegments, rows: torch.Tensor, kv_bytes_per_token: int = 0) -> DecodePlan:
        """Bucket spans by (power-of-two length, power-of-two query count), so padding wastes < 2x each way;
        a bucket whose K would exceed `GATHER_BYTES` is cut into several. Partials are owned in bucket order."""
        by_shape: dict[tuple[int, int], list[Span]] = {}
        for span in segments.spans:
            key = (_ceil_pow2(span.num_tokens), _ceil_pow2(len(span.members)))
            by_shape.setdefault(key, []).append(span)
        buckets: list[Bucket] = []
        owners: list[torch.Tensor] = []
        for spans in by_shape.values():
            bucket = _bucket(spans, rows)
            owners.append(bucket.q_index[bucket.q_valid])
            span_bytes = kv_bytes_per_token * bucket.kv_index.shape[1]
            per_gather = max(1, GATHER_BYTES // span_bytes) if span_bytes else len(spans)
            buckets.extend(
                bucket.cut(first, first + per_gather) for first in range(0, len(spans), per_gather)
            )
        return cls(segments.num_requests, tuple(buckets), torch.cat(owners))


def grouped_decode(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, plan: DecodePlan, scaling: float
) -> torch.Tensor:
    """Decode attention for `q` [num_requests, q_heads, head_dim] over the KV pool buffers
    [num_slots, kv_heads, head_dim(_v)]; returns [num_requests, q_heads, v_head_dim] in q's dtype."""
    num_requests, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not split over {num_kv_heads} KV heads")
    group = num_q_heads // num_kv_heads
    v_dim = v_buffer.shape[2]
    outs, lses = [], []
    for bucket in plan.buckets:
        num_spans, num_queries = bucket.q_index.shape
        # [S, Hkv, T, D] as strided views of one gather each (index_select copies whole rows: on this CPU
        # 5-18x faster than advanced indexing with the same 2-D index).
        flat = bucket.kv_index.view(-1)
        shape = (*bucket.kv_index.shape, num_kv_heads, -1)
        keys = k_buffer.index_select(0, flat).view(shape).to(q.dtype).transpose(1, 2)
        values = v_buffer.index_select(0, flat).view(shape).to(q.dtype).transpose(1, 2)
        # [S, Hkv, N * group, D]: one KV head's query heads side by side, each span's queries together.
        queries = (
            q[bucket.q_index]
            .view(num_spans, num_queries, num_kv_heads, group, head_dim)
            .transpose(1, 2)
            .reshape(num_spans, num_kv_heads, num_queries * group, head_dim)
        )
        mask = None if bucket.kv_bias is None else bucket.kv_bias.to(q.dtype)
        out, lse = attend_with_lse(queries, keys, values, mask, scaling)
        out = (
            out.view(num_spans, num_kv_heads, num_queries, group, v_dim)
            .transpose(1, 2)
            .reshape(num_spans, num_queries, num_q_heads, v_dim)
        )
        lse = lse.view(num_spans, num_kv_heads, num_queries, group).transpose(1, 2)
        outs.append(out[bucket.q_valid].float())
        lses.append(lse.reshape(num_spans, num_queries, num_q_heads)[bucket.q_valid].float())
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
    weight = torch.exp(lses - top[owner])  # [P, H]
    total = torch.zeros_like(top).index_add_(0, owner, weight)
    merged = torch.zeros((num_requests, num_heads, outs.shape[2]), dtype=outs.dtype, device=outs.device)
    merged.index_add_(0, owner, outs * weight[..., None])
    return merged / total[..., None]


def _bucket(spans: list[Span], rows: torch.Tensor) -> Bucket:
    device = rows.device
    max_tokens = max(span.num_tokens for span in spans)
    max_queries = max(len(span.members) for span in spans)
    starts = torch.tensor([span.start for span in spans], dtype=torch.int64, device=device)
    lengths = torch.tensor([span.num_tokens for span in spans], dtype=torch.int64, device=device)
    leaders = torch.tensor([span.row for span in spans], dtype=torch.int64, device=device)
    offsets = torch.arange(max_tokens, dtype=torch.int64, device=device)
    kv_valid = offsets[None, :] < lengths[:, None]
    positions = torch.where(kv_valid, starts[:, None] + offsets[None, :], starts[:, None])
    kv_index = torch.where(kv_valid, rows[leaders[:, None], positions].to(torch.int64), 0)
    members = [span.members + (span.members[0],) * (max_queries - len(span.members)) for span in spans]
    q_index = torch.tensor(members, dtype=torch.int64, device=device)
    counts = torch.tensor([len(span.members) for span in spans], dtype=torch.int64, device=device)
    q_valid = torch.arange(max_queries, device=device)[None, :] < counts[:, None]
    kv_bias = None
    if not bool(kv_valid.all()):
        kv_bias = torch.zeros(kv_valid.shape, dtype=torch.float32, device=device)
        kv_bias = kv_bias.masked_fill_(~kv_valid, float("-inf"))[:, None, None, :]
    return Bucket(kv_index, kv_bias, q_index, q_valid)


def _ceil_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
