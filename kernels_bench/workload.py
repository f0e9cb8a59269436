"""Paged-KV decode workloads: prefix groups sharing physical pages, per-request suffix pages, batch order.

How it works: a batch of `batch_size` requests is split into `num_groups` groups of near-equal size. Each
group owns one copy of its shared prefix, `prefix_len // page_size` full physical pages, as RadixAttention
keeps it; a prefix that does not end on a page boundary leaves its tail tokens in each request's own pages
(page-granular sharing, as SGLang's paged radix cache does). Each request then owns the pages holding that
tail plus its `suffix_len` suffix tokens. Its page table lists the group's shared pages followed by its own.
The order of requests in the batch comes from a registry: groups contiguous, groups interleaved round-robin
(what FCFS admission of mixed arrivals produces) or a seeded random arrival order. Byte counts are per layer
and count K and V: *total* bytes are what the kernel reads logically (every request its whole context),
*unique* bytes are the distinct bytes in the cache (each shared page once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class WorkloadError(ValueError):
    """A workload parameter is out of range."""


@dataclass(frozen=True)
class HeadShape:
    """Attention geometry of one layer (Llama-3-8B by default: GQA, 4 query heads per KV head)."""

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if min(self.num_q_heads, self.num_kv_heads, self.head_dim, self.dtype_bytes) < 1:
            raise WorkloadError(f"head shape values must be positive: {self}")
        if self.num_q_heads % self.num_kv_heads:
            raise WorkloadError(f"num_q_heads {self.num_q_heads} not a multiple of {self.num_kv_heads}")

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K plus V bytes of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def q_bytes_per_request(self) -> int:
        """Bytes of one request's query row (the output row has the same size)."""
        return self.num_q_heads * self.head_dim * self.dtype_bytes


LLAMA3_8B = HeadShape()


def group_sizes(batch_size: int, num_groups: int) -> np.ndarray:
    """Near-equal group sizes summing to `batch_size` (the first `batch_size % num_groups` get one more)."""
    sizes = np.full(num_groups, batch_size // num_groups, dtype=np.int64)
    sizes[: batch_size % num_groups] += 1
    return sizes


def _contiguous(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


def _interleaved(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    groups = _contiguous(sizes, rng)
    rank_in_group = np.concatenate([np.arange(n) for n in sizes])
    return groups[np.lexsort((groups, rank_in_group))]


def _random(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(_contiguous(sizes, rng))


ORDERS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "contiguous": _contiguous,
    "interleaved": _interleaved,
    "random": _random,
}
"""Batch order name -> function(group sizes, rng) -> group id of each batch slot."""


@dataclass(frozen=True)
class WorkloadSpec:
    batch_size: int
    num_groups: int
    prefix_len: int
    suffix_len: int
    page_size: int = 16
    order: str = "contiguous"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise WorkloadError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 1 <= self.num_groups <= self.batch_size:
            raise WorkloadError(
                f"num_groups must be in [1, batch_size={self.batch_size}], got {self.num_groups}"
            )
        if self.prefix_len < 0 or self.suffix_len < 0 or self.prefix_len + self.suffix_len < 1:
            raise WorkloadError(f"need prefix_len, suffix_len >= 0 and a non-empty context: {self}")
        if self.page_size < 1:
            raise WorkloadError(f"page_size must be >= 1, got {self.page_size}")
        if self.order not in ORDERS:
            raise WorkloadError(f"unknown order {self.order!r}; known: {sorted(ORDERS)}")

    @property
    def seq_len(self) -> int:
        return self.prefix_len + self.suffix_len

    @property
    def num_shared_pages(self) -> int:
        """Physical pages of one group's shared prefix (full pages only)."""
        return self.prefix_len // self.page_size

    @property
    def num_own_tokens(self) -> int:
        """Tokens each request keeps in its own pages: the prefix's partial-page tail plus its suffix."""
        return self.seq_len - self.num_shared_pages * self.page_size

    @property
    def num_own_pages(self) -> int:
        return -(-self.num_own_tokens // self.page_size)


@dataclass(frozen=True)
class ByteCounts:
    """Bytes one decode-attention call moves for one layer."""

    total_kv: int
    """K+V bytes every request reads for its whole context (what a sharing-blind kernel fetches)."""
    unique_kv: int
    """K+V bytes of the distinct tokens in the cache (shared prefix pages counted once per group)."""
    io: int
    """Query rows read plus output rows written."""

    @property
    def repeated_kv(self) -> int:
        """Bytes read again from pages another request of the batch also reads."""
        return self.total_kv - self.unique_kv


@dataclass(frozen=True)
class PagedWorkload:
    spec: WorkloadSpec
    group_ids: np.ndarray
    """(batch,) group of each batch slot, in batch order."""
    page_table: np.ndarray
    """(batch, pages per request) int32 physical page ids: the group's shared pages, then the request's own."""
    seq_lens: np.ndarray
    """(batch,) int32 context length of each request."""
    num_pages: int
    """Physical pages the cache needs."""

    def byte_counts(self, shape: HeadShape = LLAMA3_8B) -> ByteCounts:
        spec = self.spec
        per_token = shape.kv_bytes_per_token
        shared_tokens = spec.num_shared_pages * spec.page_size
        unique_tokens = spec.num_groups * shared_tokens + spec.batch_size * spec.num_own_tokens
        return ByteCounts(
            total_kv=int(self.seq_lens.sum()) * per_token,
            unique_kv=unique_tokens * per_token,
            io=2 * spec.batch_size * shape.q_bytes_per_request,
        )


def build_workload(spec: WorkloadSpec) -> PagedWorkload:
    """Lay out physical pages: every group's shared prefix first, then each request's own pages in batch order."""
    rng = np.random.default_rng(spec.seed)
    group_ids = ORDERS[spec.order](group_sizes(spec.batch_size, spec.num_groups), rng)
    num_shared, num_own = spec.num_shared_pages, spec.num_own_pages
    shared = group_ids[:, None] * num_shared + np.arange(num_shared)[None, :]
    first_own = spec.num_groups * num_shared
    own = first_own + np.arange(spec.batch_size)[:, None] * num_own + np.arange(num_own)[None, :]
    page_table = np.concatenate([shared, own], axis=1).astype(np.int32)
    return PagedWorkload(
        spec=spec,
        group_ids=group_ids,
        page_table=page_table,
        seq_lens=np.full(spec.batch_size, spec.seq_len, dtype=np.int32),
        num_pages=first_own + spec.batch_size * num_own,
    )
