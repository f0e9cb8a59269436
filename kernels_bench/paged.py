"""Device tensors of a paged decode step: queries, a paged K/V cache, page table and lengths."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels_bench.workload import LLAMA3_8B, HeadShape, PagedWorkload


@dataclass(frozen=True)
class DecodeInputs:
    q: torch.Tensor
    """(batch, num_q_heads, head_dim)"""
    k_cache: torch.Tensor
    """(num_pages, page_size, num_kv_heads, head_dim), FlashInfer's NHD layout."""
    v_cache: torch.Tensor
    page_table: torch.Tensor
    """(batch, pages per request) int32"""
    seq_lens: torch.Tensor
    """(batch,) int32"""
    scale: float

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    def to(self, dtype: torch.dtype) -> DecodeInputs:
        return DecodeInputs(
            q=self.q.to(dtype),
            k_cache=self.k_cache.to(dtype),
            v_cache=self.v_cache.to(dtype),
            page_table=self.page_table,
            seq_lens=self.seq_lens,
            scale=self.scale,
        )


def make_inputs(
    workload: PagedWorkload,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    generator: torch.Generator,
    shape: HeadShape = LLAMA3_8B,
) -> DecodeInputs:
    """Fresh standard-normal queries and cache for `workload` (one layer)."""
    spec = workload.spec
    cache_shape = (workload.num_pages, spec.page_size, shape.num_kv_heads, shape.head_dim)

    def randn(*size: int) -> torch.Tensor:
        return torch.empty(size, device=device, dtype=dtype).normal_(generator=generator)

    return DecodeInputs(
        q=randn(spec.batch_size, shape.num_q_heads, shape.head_dim),
        k_cache=randn(*cache_shape),
        v_cache=randn(*cache_shape),
        page_table=torch.from_numpy(workload.page_table).to(device),
        seq_lens=torch.from_numpy(workload.seq_lens).to(device),
        scale=1.0 / math.sqrt(shape.head_dim),
    )
