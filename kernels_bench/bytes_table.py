"""Byte counts of a decode batch and the simulator profile's DRAM/L2 split, per batch order, without a GPU."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from kernels_bench.simmodel import head_shape, layer_traffic
from kernels_bench.workload import WorkloadSpec, build_workload
from sglang_feather.sim.profile import ProfileError, load_profile
from sglang_feather.workload import ORDERS


def table(spec: WorkloadSpec, gpu: str, model: str, overrides: tuple[str, ...] = ()) -> list[dict]:
    """One row per layout: the spec in each order, and the same batch with every request its own group."""
    profile = load_profile(gpu, model, overrides)
    shape = head_shape(profile)
    dram_bw = profile.value("gpu.memory.hbm_bandwidth") * profile.value("gpu.memory.hbm_efficiency")
    l2_bw = profile.value("gpu.decode_attention.l2_bandwidth")
    layouts = {order: replace(spec, order=order) for order in ORDERS}
    layouts["all distinct"] = replace(spec, num_groups=spec.batch_size, order="contiguous")
    rows = []
    for name, layout in layouts.items():
        workload = build_workload(layout)
        counts = workload.byte_counts(shape)
        traffic = layer_traffic(profile, workload)
        rows.append(
            {
                "layout": name,
                "total_kv": counts.total_kv,
                "unique_kv": counts.unique_kv,
                "dram": traffic.dram_bytes,
                "l2": traffic.l2_bytes,
                "layer_s": traffic.dram_bytes / dram_bw + traffic.l2_bytes / l2_bw,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernels_bench.bytes_table",
        description="Per-layer K/V bytes of a prefix-sharing decode batch (all vs unique) and the DRAM/L2 split "
        "and attention time the simulator's cost model predicts for each batch order.",
    )
    parser.add_argument("--batch-size", type=int, default=800)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--prefix-lens", default="1000,4000,10000")
    parser.add_argument("--suffix-len", type=int, default=20)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument(
        "--override", action="append", default=[], help="profile override file(s), e.g. a fit"
    )
    args = parser.parse_args(argv)
    print(
        f"{'prefix':>6} {'layout':<13} {'all GB':>8} {'unique GB':>9} {'DRAM GB':>8} {'L2 GB':>8} {'layer ms':>9}"
    )
    try:
        for prefix_len in (int(p) for p in args.prefix_lens.split(",")):
            spec = WorkloadSpec(args.batch_size, args.groups, prefix_len, args.suffix_len, args.page_size)
            for row in table(spec, args.gpu, args.model, tuple(args.override)):
                print(
                    f"{prefix_len:>6} {row['layout']:<13} {row['total_kv'] / 1e9:8.3f} {row['unique_kv'] / 1e9:9.3f} "
                    f"{row['dram'] / 1e9:8.3f} {row['l2'] / 1e9:8.3f} {row['layer_s'] * 1e3:9.3f}"
                )
    except (ValueError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
