"""Paged-KV decode workloads: prefix groups sharing physical pages, per-request suffix pages, batch order.

How it works: a batch of `batch_size` requests is split into `num_groups` groups of near-equal size, in the
arrival order of the project's shared-prefix workload (`sglang_feather.workload.SharedPrefixSpec`). Each
group owns one copy of its shared prefix, `prefix_len // page_size` full physical pages, as RadixAttention
keeps it; a prefix that does not end on a page boundary leaves its tail tokens in each request's own pages
(page-granular sharing, as SGLang's paged radix cache does). Each request then owns the pages holding that
tail plus its `suffix_len` suffix tokens. Its page table lists the group's shared pages followed by its own.
The order of requests in the batch comes from that workload's order registry: groups contiguous, groups
interleaved round-robin (what FCFS admission of mixed arrivals produces) or a seeded random arrival order. Byte counts are per layer
and count K and V: *total* bytes are what the kernel reads logically (every request its whole context),
*unique* bytes are the distinct bytes in the cache (each shared page once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_feather.workload import SharedPrefixSpec, WorkloadError


@dataclass(frozen=True)
class HeadShape:
    """Attention geometry of one layer (Llama-3-8B by default: GQA, 4 query heads per KV head)."""

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if min(self.num_q_heads, self.num_kv_heads, self.head_dim, self.dtype_bytes) < 1:
            raise WorkloadError("head shape", f"values must be positive: {self}")
        if self.num_q_heads % self.num_kv_heads:
            raise WorkloadError("num_q_heads", f"{self.num_q_heads} not a multiple of {self.num_kv_heads}")

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
        if self.page_size < 1:
            raise WorkloadError("page_size", f"must be >= 1, got {self.page_size}")
        self.shared_prefix()

    def shared_prefix(self) -> SharedPrefixSpec:
        """The batch as the shared-prefix workload: one request per batch slot, suffixes as questions."""
        return SharedPrefixSpec(
            num_groups=self.num_groups,
            num_requests=self.batch_size,
            prefix_len=self.prefix_len,
            question_len=self.suffix_len,
            output_len=1,
            order=self.order,
            seed=self.seed,
        )

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
    group_ids = spec.shared_prefix().arrival_groups()
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
