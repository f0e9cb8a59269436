"""Decode batches laid out as SGLang's radix cache lays them out: shared prefixes on the same KV pages."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

NUM_SLOTS = 1 << 15
"""KV slots per test pool: room for every family and tail the strategies draw."""


@dataclass(frozen=True)
class Family:
    """A prefix of `num_tokens` shared by `num_requests` requests directly and by the families under it."""

    num_tokens: int
    num_requests: int
    children: tuple[Family, ...] = ()


@dataclass(frozen=True)
class HeadShape:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass
class Batch:
    """A decode batch on real SGLang pools: request i is `req_to_token[req_pool_indices[i], :seq_lens[i]]`."""

    req_to_token_pool: ReqToTokenPool
    kv_pool: MHATokenToKVPool
    req_pool_indices: torch.Tensor
    seq_lens: list[int]
    page_size: int

    @property
    def rows(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token[self.req_pool_indices, : max(self.seq_lens)]


class PageAllocator:
    """Hands out whole pages from a shuffled free list, as SGLang's paged allocator does after some churn."""

    def __init__(self, num_pages: int, page_size: int, rng: random.Random) -> None:
        self.page_size = page_size
        self.free = list(range(1, num_pages))  # page 0 holds SGLang's padding slot
        rng.shuffle(self.free)

    def take(self, num_tokens: int) -> list[int]:
        pages = [self.free.pop() for _ in range(-(-num_tokens // self.page_size))]
        return [page * self.page_size + k for page in pages for k in range(self.page_size)][:num_tokens]


def families(max_depth: int = 2, max_requests: int = 8) -> st.SearchStrategy[Family]:
    """Nested prefix families: a system prompt, documents under it, requests under each."""
    leaf = st.builds(Family, st.integers(1, 300), st.integers(1, max_requests))
    return st.recursive(
        leaf,
        lambda inner: st.builds(
            Family,
            st.integers(1, 300),
            st.integers(0, max_requests),
            st.lists(inner, min_size=1, max_size=3).map(tuple),
        ),
        max_leaves=max_depth * 3,
    )


def build_batch(
    roots: list[Family],
    page_size: int,
    shape: HeadShape,
    seed: int,
    max_tail: int = 64,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """Lay the families out as the radix cache does: a family's requests share the whole pages of their
    prefix (a prefix that ends mid-page shares only its whole pages; the rest is each request's own), each
    request's own tokens on fresh pages from a page boundary, so every page's slots are contiguous in position
    order; requests interleaved in batch order, at shuffled `req_to_token` rows whose entries past `seq_len`
    are stale copies of other rows."""
    rng = random.Random(seed)
    prefixes: list[tuple[list[int], int]] = []  # (shared slots, whole pages; own tokens before the tail)
    allocator = PageAllocator(NUM_SLOTS // page_size, page_size, rng)

    def walk(family: Family, above: list[int], num_above: int) -> None:
        num_tokens = num_above + family.num_tokens
        shared = above + allocator.take(max(0, num_tokens // page_size * page_size - len(above)))
        for _ in range(family.num_requests):
            prefixes.append((shared, num_tokens - len(shared)))
        for child in family.children:
            walk(child, shared, num_tokens)

    for root in roots:
        walk(root, [], 0)
    rng.shuffle(prefixes)
    rows = [shared + allocator.take(own + rng.randint(1, max_tail)) for shared, own in prefixes]
    num_requests = len(rows)
    max_len = max(len(r) for r in rows) + 64
    req_to_token_pool = ReqToTokenPool(num_requests + 8, max_len, "cpu", False)
    pool_rows = rng.sample(range(1, num_requests + 8), num_requests)
    table = req_to_token_pool.req_to_token
    for pool_row, row in zip(pool_rows, rows, strict=True):
        stale = rows[rng.randrange(num_requests)]
        table[pool_row, : len(stale)] = torch.tensor(stale, dtype=table.dtype)
        table[pool_row, : len(row)] = torch.tensor(row, dtype=table.dtype)
    kv_pool = MHATokenToKVPool(
        NUM_SLOTS, page_size, dtype, shape.num_kv_heads, shape.head_dim, 1, "cpu", False
    )
    generator = torch.Generator().manual_seed(seed)
    for buffer in (kv_pool.get_key_buffer(0), kv_pool.get_value_buffer(0)):
        buffer.copy_(torch.randn(buffer.shape, generator=generator).to(dtype))
    indices = torch.tensor(pool_rows, dtype=torch.int64)
    return Batch(req_to_token_pool, kv_pool, indices, [len(r) for r in rows], page_size)


def torch_native_decode(batch: Batch, q: torch.Tensor, scaling: float) -> torch.Tensor:
    """SGLang's own torch_native decode over the batch (its per-request loop)."""
    out = torch.empty(q.shape[0], q.shape[1], batch.kv_pool.get_value_buffer(0).shape[-1], dtype=q.dtype)
    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    return backend._run_sdpa_forward_decode(
        q,
        out,
        batch.kv_pool.get_key_buffer(0),
        batch.kv_pool.get_value_buffer(0),
        batch.req_to_token_pool.req_to_token,
        batch.req_pool_indices,
        torch.tensor(batch.seq_lens),
        scaling=scaling,
        enable_gqa=q.shape[1] != batch.kv_pool.head_num,
    )
