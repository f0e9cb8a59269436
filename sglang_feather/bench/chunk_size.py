"""`bench chunk-size`: CHT insert/best/activate/finish cost against chunk size (16..512), to pick the default."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TextIO

from sglang_feather.bench import cht_side, report
from sglang_feather.bench.cli_types import add_json_flag, int_list, publish, workload_list
from sglang_feather.cht import DEFAULT_CHUNK_SIZE
from sglang_feather.measure.sequence import SequencePlan
from sglang_feather.measure.timing import GC_POLICY, TimingConfig, frozen_heap, timing_from_args
from sglang_feather.measure.workloads import build_workload, shared_prefix_len

SHARED_WORKLOADS = ("shared", "shared-cold")


@dataclass(frozen=True)
class SweepConfig:
    chunk_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    workloads: tuple[str, ...] = ("shared", "unique", "shared-cold")
    queue_sizes: tuple[int, ...] = (500,)
    prompt_lens: tuple[int, ...] = (10240,)
    plan: SequencePlan = field(default_factory=SequencePlan)
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0


QUICK = SweepConfig(
    chunk_sizes=(16, 64, 256),
    workloads=("shared",),
    queue_sizes=(64,),
    prompt_lens=(1024,),
    plan=SequencePlan(num_per_pass=8),
    timing=TimingConfig(repeat=3, min_time_s=0.02, max_samples=10),
)


def prefix_seen(workload: str, prompt_len: int, chunk_size: int) -> float | None:
    """Fraction of a group's shared prefix the CHT can see: whole chunks only (None when nothing is shared)."""
    if workload not in SHARED_WORKLOADS:
        return None
    prefix_len = shared_prefix_len(prompt_len)
    return (prefix_len // chunk_size) * chunk_size / prefix_len


def run(cfg: SweepConfig, progress: TextIO | None = None) -> dict:
    rows = []
    started = time.time()
    for name in cfg.workloads:
        for num_waiting in cfg.queue_sizes:
            for prompt_len in cfg.prompt_lens:
                workload = build_workload(name, num_waiting, prompt_len, cfg.seed)
                for chunk_size in cfg.chunk_sizes:
                    with frozen_heap():
                        cell = cht_side.measure_cell(
                            workload, chunk_size, (cfg.plan.num_per_pass,), cfg.timing
                        )
                        seq = cht_side.run_sequence(workload, chunk_size, cfg.plan)
                    rows.append(
                        {
                            "workload": name,
                            "num_waiting": num_waiting,
                            "prompt_len": prompt_len,
                            "chunk_size": chunk_size,
                            "cht": report.cht_json(cell),
                            "sequence": asdict(seq),
                            "prefix_seen": prefix_seen(name, prompt_len, chunk_size),
                        }
                    )
                    print(
                        f"[chunk-size] {name} W={num_waiting} L={prompt_len} c={chunk_size}",
                        file=progress or sys.stderr,
                    )
    meta = {
        "config": asdict(cfg),
        "default_chunk_size": DEFAULT_CHUNK_SIZE,
        "gc": GC_POLICY,
        "cpu_count": os.cpu_count(),
        "loadavg_after": os.getloadavg(),
        "wall_s": time.time() - started,
    }
    return {"meta": meta, "rows": rows}


def markdown(result: dict) -> str:
    meta = result["meta"]
    columns = [
        "workload",
        "W",
        "prompt",
        "chunk",
        "nodes",
        "insert µs",
        "hash µs",
        "best µs",
        "activate µs",
        "finish µs",
        "pass µs",
        "sequence ms",
        "shared prefix seen",
    ]
    lines = [
        f"Default chunk size {meta['default_chunk_size']}; {meta['cpu_count']} CPUs, load average "
        f"{meta['loadavg_after'][0]:.2f}; medians (per operation: mean within a sample); GC: {meta['gc']}.",
        "",
        "| " + " | ".join(columns) + " |",
        "|---|" + "---:|" * (len(columns) - 1),
    ]
    for r in result["rows"]:
        cht, seq = r["cht"], r["sequence"]
        seen = "n/a" if r["prefix_seen"] is None else f"{r['prefix_seen']:.0%}"
        values = [r["workload"], r["num_waiting"], r["prompt_len"], r["chunk_size"], cht["num_nodes"]]
        values += [f"{cht[k]['median_s'] * 1e6:.1f}" for k in ("insert_s", "hash_s", "best_s", "activate_s")]
        values += [f"{cht['finish_s']['median_s'] * 1e6:.1f}", f"{cht['pass_s']['median_s'] * 1e6:.1f}"]
        values += [f"{seq['total_s'] * 1e3:.1f}", seen]
        lines.append("| " + " | ".join(map(str, values)) + " |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny subset for CI smoke runs (seconds)")
    parser.add_argument("--chunk-sizes", type=int_list, help="comma list (default 16,32,64,128,256,512)")
    parser.add_argument(
        "--workloads", type=workload_list, help="comma list (default shared,unique,shared-cold)"
    )
    parser.add_argument("--queue-sizes", type=int_list, help="comma list of W (default 500)")
    parser.add_argument("--prompt-lens", type=int_list, help="comma list of prompt tokens (default 10240)")
    parser.add_argument("--per-pass", type=int, help="requests a pass admits, k (default 32)")
    parser.add_argument("--repeat", type=int, help="fewest samples per measurement (default 5)")
    parser.add_argument(
        "--min-time", type=float, help="seconds measured per measurement at least (default 0.3)"
    )
    add_json_flag(parser)


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    cfg = QUICK if args.quick else SweepConfig()
    timing = timing_from_args(cfg.timing, args)
    return replace(
        cfg,
        chunk_sizes=args.chunk_sizes or cfg.chunk_sizes,
        workloads=args.workloads or cfg.workloads,
        queue_sizes=args.queue_sizes or cfg.queue_sizes,
        prompt_lens=args.prompt_lens or cfg.prompt_lens,
        plan=replace(cfg.plan, num_per_pass=args.per_pass or cfg.plan.num_per_pass),
        timing=timing,
    )


def main(args: argparse.Namespace) -> int:
    result = run(config_from_args(args))
    return publish(markdown(result), result, args.json)
