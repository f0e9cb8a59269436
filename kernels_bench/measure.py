"""One sweep point: lay out the cache, fill rotating input sets, spot-check each kernel, then time it."""

from __future__ import annotations

from dataclasses import asdict

import torch

from kernels_bench.check import reference, relative_error
from kernels_bench.config import TOLERANCE, RunConfig, generator
from kernels_bench.kernels import KERNELS, KernelContext
from kernels_bench.paged import make_inputs
from kernels_bench.reference import select_rows
from kernels_bench.timing import TIMERS
from kernels_bench.workload import WorkloadSpec, build_workload


def _footprint_bytes(num_pages: int, spec: WorkloadSpec, config: RunConfig) -> int:
    shape = config.shape
    element = torch.tensor([], dtype=config.dtype).element_size()
    return 2 * num_pages * spec.page_size * shape.num_kv_heads * shape.head_dim * element


def _num_sets(footprint: int, config: RunConfig) -> int:
    if config.device != "cuda":
        return config.num_sets
    free, _ = torch.cuda.mem_get_info()
    return min(config.num_sets, int(config.memory_fraction * free) // max(footprint, 1))


def measure_point(
    spec: WorkloadSpec, config: RunConfig, ctx: KernelContext, kernels: list[str]
) -> list[dict]:
    workload = build_workload(spec)
    counts = workload.byte_counts(config.shape)
    common = asdict(spec) | {
        "total_kv_bytes": counts.total_kv,
        "unique_kv_bytes": counts.unique_kv,
        "io_bytes": counts.io,
    }
    num_sets = _num_sets(_footprint_bytes(workload.num_pages, spec, config), config)
    if num_sets < 1:
        return [
            common | {"kernel": name, "status": "skipped: the cache does not fit in memory"}
            for name in kernels
        ]
    sets = [
        make_inputs(
            workload,
            device=config.device,
            dtype=config.dtype,
            generator=generator(config.device, config.seed + 7919 * i),
            shape=config.shape,
        )
        for i in range(num_sets)
    ]
    rows_to_check = torch.linspace(
        0, spec.batch_size - 1, min(spec.batch_size, 8), device=config.device
    ).long()
    ref = reference(select_rows(sets[0], rows_to_check), config.device)
    results = []
    for name in kernels:
        row = common | {"kernel": name, "num_sets": num_sets}
        if name == "sdpa" and counts.total_kv > config.sdpa_max_bytes:
            results.append(
                row | {"status": f"skipped: gathered K/V {counts.total_kv / 1e9:.1f} GB > --sdpa-max-gb"}
            )
            continue
        launches = [KERNELS[name](inputs, ctx) for inputs in sets]
        error = relative_error(launches[0].run()[rows_to_check], ref)
        plan = launches[0].plan
        row |= {"rel_err": error, "num_splits": plan.num_splits if plan else None}
        if error > TOLERANCE[config.dtype]:
            results.append(row | {"status": f"failed: relative error {error:.3g}"})
            continue
        timing = TIMERS[config.device]([launch.run for launch in launches], config.timing)
        seconds = timing.median_ms / 1e3
        row |= asdict(timing) | {
            "status": "ok",
            "unique_gbps": (counts.unique_kv + counts.io) / seconds / 1e9,
            "total_gbps": (counts.total_kv + counts.io) / seconds / 1e9,
        }
        results.append(row)
        del launches
    del sets
    if config.device == "cuda":
        torch.cuda.empty_cache()
    return results
