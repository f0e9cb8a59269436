"""Registry of decode-attention kernels under test; each builds a zero-argument launcher for fixed inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels_bench.paged import DecodeInputs
from kernels_bench.reference import sdpa_decode
from kernels_bench.splitk import SplitPlan, plan_splits, splitk_decode


class KernelUnavailable(RuntimeError):
    """The kernel cannot run here (package not installed, or it needs a device this run does not have)."""


@dataclass(frozen=True)
class Launch:
    run: Callable[[], torch.Tensor]
    plan: SplitPlan | None
    """The split plan the kernel runs with, where the project chose it."""


@dataclass(frozen=True)
class KernelContext:
    num_sms: int
    block_n: int = 64
    """Tokens per tile of the split-K kernels."""
    num_warps: int = 4
    num_stages: int = 2


KernelFactory = Callable[[DecodeInputs, KernelContext], Launch]


def _plan(inputs: DecodeInputs, ctx: KernelContext) -> SplitPlan:
    return plan_splits(
        inputs.q.shape[0],
        int(inputs.seq_lens.max()),
        inputs.k_cache.shape[2],
        ctx.num_sms,
        block_n=ctx.block_n,
    )


def _triton(inputs: DecodeInputs, ctx: KernelContext) -> Launch:
    if inputs.q.device.type != "cuda":
        raise KernelUnavailable(
            f"the Triton kernel needs a CUDA device, inputs are on {inputs.q.device.type}"
        )
    try:
        from kernels_bench.triton_decode import TritonDecode
    except ImportError as exc:
        raise KernelUnavailable(f"triton not importable: {exc}") from exc
    plan = _plan(inputs, ctx)
    return Launch(
        run=TritonDecode(inputs, plan, num_warps=ctx.num_warps, num_stages=ctx.num_stages), plan=plan
    )


def _sdpa(inputs: DecodeInputs, ctx: KernelContext) -> Launch:
    return Launch(run=lambda: sdpa_decode(inputs), plan=None)


def _splitk_torch(inputs: DecodeInputs, ctx: KernelContext) -> Launch:
    plan = _plan(inputs, ctx)
    return Launch(run=lambda: splitk_decode(inputs, plan), plan=plan)


def _flashinfer(inputs: DecodeInputs, ctx: KernelContext) -> Launch:
    try:
        import flashinfer
    except ImportError as exc:
        raise KernelUnavailable(
            f"flashinfer not installed ({exc}); `pip install flashinfer-python` adds it"
        ) from exc
    if inputs.q.device.type != "cuda":
        raise KernelUnavailable("flashinfer needs a CUDA device")
    batch, num_q_heads, head_dim = inputs.q.shape
    page_size = inputs.page_size
    num_kv_heads = inputs.k_cache.shape[2]
    num_pages = (inputs.seq_lens + page_size - 1) // page_size
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=inputs.q.device)
    indptr[1:] = torch.cumsum(num_pages, 0)
    columns = torch.arange(inputs.page_table.shape[1], device=inputs.q.device)
    indices = inputs.page_table[columns[None, :] < num_pages[:, None]].to(torch.int32)
    last_page_len = (inputs.seq_lens - (num_pages - 1) * page_size).to(torch.int32)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=inputs.q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    if not hasattr(wrapper, "plan"):
        raise KernelUnavailable(
            f"flashinfer {getattr(flashinfer, '__version__', '?')} predates the plan/run API"
        )
    wrapper.plan(
        indptr,
        indices,
        last_page_len,
        num_q_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        q_data_type=inputs.q.dtype,
        kv_data_type=inputs.k_cache.dtype,
        sm_scale=inputs.scale,
    )
    cache = (inputs.k_cache, inputs.v_cache)
    return Launch(run=lambda: wrapper.run(inputs.q, cache), plan=None)


KERNELS: dict[str, KernelFactory] = {
    "triton": _triton,
    "flashinfer": _flashinfer,
    "sdpa": _sdpa,
    "splitk_torch": _splitk_torch,
}
"""Kernel name -> factory. `sdpa` gathers every request's K/V and runs PyTorch SDPA (the reference);
`splitk_torch` is the Triton kernel's algorithm in PyTorch (CPU smoke runs)."""
