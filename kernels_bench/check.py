"""Correctness stage: every kernel against a float32/float64 SDPA reference on fresh random data."""

from __future__ import annotations

from dataclasses import asdict, replace

import torch

from kernels_bench.config import TOLERANCE, RunConfig, generator
from kernels_bench.kernels import KERNELS, KernelContext, KernelUnavailable
from kernels_bench.paged import DecodeInputs, make_inputs
from kernels_bench.reference import sdpa_decode
from kernels_bench.workload import WorkloadSpec, build_workload

CHECK_CASES = (
    WorkloadSpec(batch_size=3, num_groups=2, prefix_len=37, suffix_len=5, page_size=4, order="interleaved"),
    WorkloadSpec(batch_size=5, num_groups=5, prefix_len=100, suffix_len=28, page_size=1),
    WorkloadSpec(batch_size=8, num_groups=2, prefix_len=1000, suffix_len=20, page_size=16, order="random"),
    WorkloadSpec(batch_size=2, num_groups=1, prefix_len=1000, suffix_len=128, page_size=16),
)
"""Small odd shapes; the last case also runs with uneven lengths that leave split-K partitions empty."""


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(ref.abs().max().clamp_min(1e-30))
    return float((out.to(ref.dtype) - ref).abs().max()) / scale


def reference(inputs: DecodeInputs, device: str) -> torch.Tensor:
    return sdpa_decode(inputs, compute_dtype=torch.float64 if device == "cpu" else torch.float32)


def _uneven(inputs: DecodeInputs) -> DecodeInputs:
    batch = inputs.seq_lens.shape[0]
    shorter = (
        inputs.seq_lens
        - torch.arange(batch, device=inputs.seq_lens.device, dtype=inputs.seq_lens.dtype) * 200
    )
    return replace(inputs, seq_lens=shorter.clamp_min(1).to(torch.int32))


def check_kernels(config: RunConfig, ctx: KernelContext, kernels: list[str]) -> list[dict]:
    """Every kernel on every check case, fresh random data each time; rows with the relative error."""
    results = []
    tolerance = TOLERANCE[config.dtype]
    for index, spec in enumerate(CHECK_CASES):
        workload = build_workload(replace(spec, seed=config.seed + index))
        gen = generator(config.device, config.seed + 1000 + index)
        base = make_inputs(
            workload, device=config.device, dtype=config.dtype, generator=gen, shape=config.shape
        )
        variants = (
            {"even": base, "uneven": _uneven(base)} if index == len(CHECK_CASES) - 1 else {"even": base}
        )
        for lengths, inputs in variants.items():
            ref = reference(inputs, config.device)
            for name in kernels:
                error = relative_error(KERNELS[name](inputs, ctx).run(), ref)
                results.append(
                    {
                        "kernel": name,
                        "case": asdict(spec),
                        "lengths": lengths,
                        "rel_err": error,
                        "ok": error <= tolerance,
                    }
                )
    return results


def available_kernels(config: RunConfig, ctx: KernelContext) -> tuple[list[str], dict[str, str]]:
    """Kernels that can run here, and a status line for each requested one."""
    probe = make_inputs(
        build_workload(CHECK_CASES[0]),
        device=config.device,
        dtype=config.dtype,
        generator=generator(config.device, config.seed),
        shape=config.shape,
    )
    usable, status = [], {}
    for name in config.kernels:
        try:
            KERNELS[name](probe, ctx)
        except KernelUnavailable as exc:
            status[name] = f"not available: {exc}"
            continue
        usable.append(name)
        status[name] = "ok"
    return usable, status
