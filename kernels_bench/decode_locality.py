"""Paged decode-attention benchmark: time vs number of prefix groups, prefix length and batch order.

How it works: for every sweep point (see `sweep.py`) it lays out a RadixAttention-style paged cache
(`workload.py`), fills several independent input sets with fresh random data, spot-checks each kernel's
output rows against a float32 (float64 on CPU) SDPA reference, and only then times it (`timing.py`): warm-up,
then many repeats rotating over the sets with an L2 flush before each. Before the sweep a correctness stage
runs every kernel on small odd shapes (page size 1, partial pages, uneven lengths) against the same
reference, and a failure stops the run. Rows report median ms and effective bandwidth counting unique bytes
and all bytes; ratios compare homogeneous (1 group) with heterogeneous (all distinct) batches, and
interleaved with contiguous order, at equal batch size. Output is JSON for `fit.py` plus a console table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from kernels_bench.check import available_kernels, check_kernels
from kernels_bench.config import DTYPES, TOLERANCE, RunConfig, device_info
from kernels_bench.kernels import KERNELS, KernelContext
from kernels_bench.measure import measure_point
from kernels_bench.report import format_ratios, format_rows, ratio_rows
from kernels_bench.sweep import PRESETS, Sweep
from kernels_bench.timing import TIMERS, TimingConfig

DEFAULT_KERNELS = {"cuda": ("triton", "flashinfer", "sdpa"), "cpu": ("sdpa", "splitk_torch")}


def _sweep_from_args(args: argparse.Namespace) -> Sweep:
    sweep = PRESETS[args.preset]
    overrides = {
        "batch_sizes": args.batch_sizes,
        "group_counts": args.groups,
        "prefix_lens": args.prefix_lens,
        "suffix_lens": args.suffix_lens,
        "orders": args.orders,
        "page_sizes": args.page_sizes,
    }
    return replace(sweep, **{key: tuple(value) for key, value in overrides.items() if value is not None})


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _str_list(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kernels_bench.decode_locality",
        description=(
            "Time paged decode attention (Llama-3-8B heads: 32 query, 8 KV, dim 128) over batches whose "
            "requests share prefix pages in 1..B groups, in contiguous or interleaved order. Checks every "
            "kernel against a float32/float64 SDPA reference first. Writes JSON for kernels_bench.fit."
        ),
    )
    parser.add_argument(
        "--device",
        choices=sorted(TIMERS),
        default="cuda",
        help="cuda (timed with CUDA events) or cpu (smoke runs)",
    )
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="full", help="sweep preset (default full)"
    )
    parser.add_argument(
        "--reduced", dest="preset", action="store_const", const="reduced", help="= --preset reduced"
    )
    parser.add_argument("--tiny", dest="preset", action="store_const", const="tiny", help="= --preset tiny")
    parser.add_argument("--kernels", type=_str_list, help=f"comma list from {sorted(KERNELS)}")
    parser.add_argument("--batch-sizes", type=_int_list, help="override the preset, e.g. 1,8,64")
    parser.add_argument("--groups", type=_int_list, help="group counts (the batch size is always added)")
    parser.add_argument("--prefix-lens", type=_int_list, help="shared prefix tokens, e.g. 1000,4000,10000")
    parser.add_argument("--suffix-lens", type=_int_list, help="per-request suffix tokens, e.g. 20,128")
    parser.add_argument("--orders", type=_str_list, help="contiguous,interleaved,random")
    parser.add_argument("--page-sizes", type=_int_list, help="KV page sizes in tokens (default 16)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="q and K/V dtype")
    parser.add_argument("--warmup", type=int, default=5, help="untimed launches per kernel and point")
    parser.add_argument("--repeats", type=int, default=30, help="timed launches; the median is reported")
    parser.add_argument(
        "--sets", type=int, default=2, help="rotating input sets per point (fewer if memory is short)"
    )
    parser.add_argument(
        "--flush-mb", type=int, default=256, help="L2 flush buffer written before each repeat"
    )
    parser.add_argument(
        "--sdpa-max-gb", type=float, default=4.0, help="skip SDPA where gathered K/V exceed this"
    )
    parser.add_argument(
        "--block-n", type=int, default=64, help="Triton kernel: tokens per tile (power of 2 >= 16)"
    )
    parser.add_argument("--num-warps", type=int, default=4, help="Triton kernel: warps per program")
    parser.add_argument("--num-stages", type=int, default=2, help="Triton kernel: software pipelining stages")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, random order and page layout")
    parser.add_argument("--check-only", action="store_true", help="run the correctness stage only")
    parser.add_argument(
        "--out", type=Path, help="JSON output (default results/decode_locality_<preset>.json)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device (use --device cpu --tiny)", file=sys.stderr)
        return 2
    unknown = set(args.kernels or ()) - set(KERNELS)
    if unknown:
        print(f"error: unknown kernels {sorted(unknown)}; known: {sorted(KERNELS)}", file=sys.stderr)
        return 2
    config = RunConfig(
        device=args.device,
        kernels=tuple(args.kernels or DEFAULT_KERNELS[args.device]),
        dtype=DTYPES[args.dtype],
        timing=TimingConfig(warmup=args.warmup, repeats=args.repeats, flush_bytes=args.flush_mb << 20),
        num_sets=args.sets,
        sdpa_max_bytes=int(args.sdpa_max_gb * 1e9),
        seed=args.seed,
    )
    sweep = _sweep_from_args(args)
    info = device_info(args.device)
    ctx = KernelContext(
        num_sms=info["num_sms"], block_n=args.block_n, num_warps=args.num_warps, num_stages=args.num_stages
    )
    kernels, kernel_status = available_kernels(config, ctx)
    for name, status in kernel_status.items():
        print(f"kernel {name}: {status}")
    checks = check_kernels(config, ctx, kernels)
    failed = [check for check in checks if not check["ok"]]
    print(f"correctness: {len(checks) - len(failed)}/{len(checks)} checks within {TOLERANCE[config.dtype]:g}")
    for check in failed:
        print(
            f"  FAILED {check['kernel']} {check['case']} {check['lengths']}: rel_err {check['rel_err']:.3g}"
        )
    rows: list[dict] = []
    if not failed and not args.check_only:
        specs = list(sweep.specs(seed=args.seed))
        for index, spec in enumerate(specs, 1):
            point = measure_point(spec, config, ctx, kernels)
            rows.extend(point)
            print(f"[{index}/{len(specs)}] " + format_rows(point, header=index == 1), flush=True)
    ratios = ratio_rows(rows)
    if ratios:
        print(format_ratios(ratios))
    document = {
        "meta": info
        | {
            "command": shlex.join(["python", "-m", "kernels_bench.decode_locality", *(argv or sys.argv[1:])]),
            "preset": args.preset,
            "sweep": asdict(sweep),
            "dtype": args.dtype,
            "head_shape": asdict(config.shape),
            "timing": asdict(config.timing),
            "kernels": kernel_status,
            "grid_order": "request-major (request, kv_head, split) for the triton kernel",
            "kernel_config": asdict(ctx),
        },
        "correctness": checks,
        "measurements": rows,
        "ratios": ratios,
    }
    out = args.out or Path("results") / f"decode_locality_{args.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1))
    print(f"wrote {out}")
    return 1 if failed or any(row["status"].startswith("failed") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
