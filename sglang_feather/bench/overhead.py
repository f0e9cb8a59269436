"""`bench overhead`: SGLang's calc_priority (lpm, dfs-weight) against the CHT on identical waiting queues."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from types import ModuleType
from typing import TextIO

from sglang_feather.bench import cht_side, report
from sglang_feather.bench.cli_types import add_json_flag, int_list, publish, workload_list
from sglang_feather.cht import DEFAULT_CHUNK_SIZE, backend_name
from sglang_feather.measure.sequence import SequencePlan
from sglang_feather.measure.timing import GC_POLICY, TimingConfig, frozen_heap, median_run, timing_from_args
from sglang_feather.measure.workloads import WORKLOADS, build_workload

BASELINES = ("sglang",)
"""Engine sides, imported by `load_baseline` on first use. A baseline module provides `prepare()`, `POLICIES`,
`prefix_match_cap()`, `prefill_token_budget()`, `tree_cache()` (the engine's prefix cache, named),
`build_queue(workload)`, `time_calc_priority(queue, policy, timing)` and `run_sequence(workload, policy, plan)`."""

PASS_DEFINITION = (
    "CHT pass = k x (best() + activate()) on a tree holding the W waiting prompts, with the cached "
    "sequences running; SGLang pass = one calc_priority() call on the same W requests (its admission "
    "loop, which then takes the first k, is not timed). Budget k = what SGLang's default prefill token "
    "budget admits per pass: max(1, max_prefill_tokens // new tokens per prompt), capped at W"
)


@dataclass(frozen=True)
class OverheadConfig:
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    queue_sizes: tuple[int, ...] = (100, 500, 2000)
    prompt_lens: tuple[int, ...] = (1024, 4096, 10240)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    plan: SequencePlan = field(default_factory=SequencePlan)
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0
    baseline: str = "sglang"
    budget_sequence: bool = False
    """Sequences admit the budget k per pass instead of `plan.num_per_pass` (many more SGLang calls)."""


QUICK = OverheadConfig(
    queue_sizes=(16, 200),
    prompt_lens=(1024,),
    plan=SequencePlan(num_per_pass=8),
    timing=TimingConfig(repeat=3, min_time_s=0.02, max_samples=10),
)


def load_baseline(name: str) -> ModuleType:
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {sorted(BASELINES)}")
    from sglang_feather.offline import bench_baseline

    return bench_baseline


def run_cell(
    baseline: ModuleType, cfg: OverheadConfig, workload_name: str, num_waiting: int, prompt_len: int
):
    workload = build_workload(workload_name, num_waiting, prompt_len, cfg.seed)
    budget_k = budget_pass_size(baseline.prefill_token_budget(), workload)
    queue = baseline.build_queue(workload)
    with frozen_heap():
        policies = {p: baseline.time_calc_priority(queue, p, cfg.timing) for p in baseline.POLICIES}
        pass_sizes = (cfg.plan.num_per_pass, budget_k)
        cells = {
            name: cht_side.measure_cell(workload, cfg.chunk_size, pass_sizes, cfg.timing, tree_cls)
            for name, tree_cls in cht_side.backends().items()
        }
    del queue
    plan = replace(cfg.plan, num_per_pass=budget_k) if cfg.budget_sequence else cfg.plan
    with frozen_heap():
        sequences = {
            p: median_run(partial(baseline.run_sequence, workload, p, plan), _total, cfg.timing)
            for p in baseline.POLICIES
        }
        cht_sequences = {
            name: median_run(
                partial(cht_side.run_sequence, workload, cfg.chunk_size, plan, tree_cls),
                _total,
                cfg.timing,
            )
            for name, tree_cls in cht_side.backends().items()
        }
        prompt_read_s = cht_side.prompt_read_s(workload, cfg.timing)
    default = backend_name()
    return report.Cell(
        workload_name,
        num_waiting,
        prompt_len,
        budget_k,
        policies,
        cells[default],
        sequences,
        cht_sequences[default],
        plan.num_per_pass,
        {name: (cells[name], cht_sequences[name]) for name in cells},
        prompt_read_s,
    )


def budget_pass_size(token_budget: int, workload) -> int:
    """Requests one SGLang prefill pass admits under its token budget (the first one always fits)."""
    return max(1, min(workload.num_requests, token_budget // max(workload.num_new_tokens, 1)))


def _total(sequence) -> float:
    return sequence.total_s


def run(cfg: OverheadConfig, progress: TextIO | None = None) -> dict:
    """Every cell of `cfg`, both sides in one process; returns the JSON-ready result."""
    baseline = load_baseline(cfg.baseline)
    versions = baseline.prepare()
    started = time.time()
    load_before = os.getloadavg()
    cells = []
    for name in cfg.workloads:
        for num_waiting in cfg.queue_sizes:
            for prompt_len in cfg.prompt_lens:
                cell_start = time.perf_counter()
                cells.append(run_cell(baseline, cfg, name, num_waiting, prompt_len))
                print(
                    f"[overhead] {name} W={num_waiting} L={prompt_len}: {time.perf_counter() - cell_start:.1f} s",
                    file=progress or sys.stderr,
                    flush=True,
                )
    meta = {
        "versions": {**versions, "python": platform.python_version()},
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.time() - started,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "config": asdict(cfg),
        "gc": GC_POLICY,
        "pass": PASS_DEFINITION,
        "lpm_fcfs_above": baseline.prefix_match_cap(),
        "prefill_token_budget": baseline.prefill_token_budget(),
        "tree_cache": baseline.tree_cache(),
        "cht_backend": backend_name(),
        "cht_backends": list(cht_side.backends()),
    }
    return {"meta": meta, "cells": [c.to_json(cfg.plan.num_per_pass) for c in cells]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny subset for CI smoke runs (seconds)")
    parser.add_argument("--workloads", type=workload_list, help=f"comma list of {','.join(WORKLOADS)}")
    parser.add_argument("--queue-sizes", type=int_list, help="comma list of W (default 100,500,2000)")
    parser.add_argument(
        "--prompt-lens", type=int_list, help="comma list of prompt tokens (default 1024,4096,10240)"
    )
    parser.add_argument("--chunk-size", type=int, help=f"CHT chunk size (default {DEFAULT_CHUNK_SIZE})")
    parser.add_argument("--per-pass", type=int, help="requests a pass admits, k (default 32)")
    parser.add_argument(
        "--finish-after", type=int, help="passes a request runs before it finishes (default 2)"
    )
    parser.add_argument(
        "--max-passes", type=int, help="stop a sequence after this many passes (default: drain)"
    )
    parser.add_argument("--repeat", type=int, help="fewest samples per measurement (default 5)")
    parser.add_argument(
        "--min-time", type=float, help="seconds measured per measurement at least (default 0.3)"
    )
    parser.add_argument("--seed", type=int, help="workload seed (default 0)")
    parser.add_argument(
        "--budget-sequence", action="store_true", help="sequences admit the budget k per pass instead of k"
    )
    add_json_flag(parser)


def config_from_args(args: argparse.Namespace) -> OverheadConfig:
    cfg = QUICK if args.quick else OverheadConfig()
    plan = cfg.plan
    plan = replace(
        plan,
        num_per_pass=args.per_pass or plan.num_per_pass,
        finish_after_passes=args.finish_after or plan.finish_after_passes,
        max_passes=args.max_passes if args.max_passes is not None else plan.max_passes,
    )
    timing = timing_from_args(cfg.timing, args)
    return replace(
        cfg,
        workloads=args.workloads or cfg.workloads,
        queue_sizes=args.queue_sizes or cfg.queue_sizes,
        prompt_lens=args.prompt_lens or cfg.prompt_lens,
        chunk_size=args.chunk_size or cfg.chunk_size,
        seed=args.seed if args.seed is not None else cfg.seed,
        budget_sequence=args.budget_sequence,
        plan=plan,
        timing=timing,
    )


def main(args: argparse.Namespace) -> int:
    result = run(config_from_args(args))
    return publish(report.overhead_markdown(result), result, args.json)
