"""`bench adapter`: a whole scheduling pass and a decode step through Feather's SGLang plugin, next to dfs-weight."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict

from sglang_feather.bench.cli_types import add_json_flag, int_list, publish
from sglang_feather.bench.events import PAGE_SIZES, table
from sglang_feather.bench.report import machine_line, run_meta
from sglang_feather.cht import backend_name

PASS_DEFINITION = (
    "pass = calc_priority(waiting_queue, running_batch), then the real PrefillAdder (Feather's subclass for "
    "feather) walking the waiting list until it stops, the waiting list rebuilt without the admitted "
    "requests, and (feather) the plugin's get_next_batch_to_run hook; from the queue in arrival order, "
    "restored untimed after every sample. Feather adapter = Feather's own seconds inside that pass "
    "(FeatherRuntime.last_step_s = the feather_step_seconds metric), planned ahead where the stopper allows; "
    "step path = the same on a third harness with plans_ahead off; plan gain = step path / adapter. "
    "Decode step = the plugin's "
    "get_next_batch_to_run hook on a decode plan of the running batch (mean of a block of calls per sample)"
)


def run(
    queue_sizes,
    prompt_lens,
    running_sizes,
    repeat: int,
    decode_block: int,
    seed: int,
    stopper: str | None = None,
    progress=None,
    metrics: bool = False,
) -> dict:
    from sglang_feather.offline import bench_adapter as engine

    stopper = stopper or engine.STOPPER
    started = time.time()
    load_before = os.getloadavg()
    cells = []
    for num_waiting in queue_sizes:
        for prompt_len in prompt_lens:
            for num_running in running_sizes:
                t0 = time.perf_counter()
                cell = engine.measure_cell(
                    num_waiting,
                    prompt_len,
                    num_running,
                    repeat=repeat,
                    decode_block=decode_block,
                    seed=seed,
                    stopper=stopper,
                    metrics=metrics,
                )
                cells.append(
                    {
                        **asdict(cell),
                        "calc_priority_ratio": cell.calc_priority_ratio,
                        "pass_ratio": cell.pass_ratio,
                        "plan_gain": cell.plan_gain,
                    }
                )
                print(
                    f"[adapter] W={num_waiting} L={prompt_len} R={num_running}: "
                    f"{time.perf_counter() - t0:.1f} s",
                    file=progress or sys.stderr,
                    flush=True,
                )
    events = [
        asdict(engine.measure_events(page_size, prompt_len))
        for page_size in PAGE_SIZES
        for prompt_len in prompt_lens
    ]
    meta = {
        **run_meta(started, load_before),
        "baseline": engine.BASELINE,
        "workload": f"{engine.NUM_GROUPS} groups, Zipf({engine.ZIPF_ALPHA}) popularity, 5L/8-token shared "
        "prefixes; the running prompts are in the tree cache",
        "tree_cache": engine.tree_cache(),
        "pass": PASS_DEFINITION,
        "repeat": repeat,
        "decode_block": decode_block,
        "seed": seed,
        "stopper": stopper,
        "metrics": metrics,
        "cht_backend": backend_name(),
    }
    return {"meta": meta, "cells": cells, "events": events}


def _spread(value: dict, scale: float, digits: int) -> str:
    return (
        f"{value['median'] * scale:.{digits}f} "
        f"[{value['min'] * scale:.{digits}f}–{value['max'] * scale:.{digits}f}]"
    )


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"{machine_line(meta)}, CHT backend {meta['cht_backend']}, stopper {meta['stopper']}, "
        f"Feather's Prometheus series {'on (--enable-metrics)' if meta.get('metrics') else 'off'}, "
        f"{meta['repeat']} samples per side, run took {meta['wall_s']:.0f} s.",
        f"Workload: {meta['workload']}.",
        f"SGLang tree cache: {meta['tree_cache']}.",
        f"Pass: {meta['pass']}.",
        "",
        "| W | prompt | running | dfs-weight calc_priority ms | dfs-weight pass ms | Feather pass ms "
        "| Feather adapter µs | calc_priority / adapter | step path µs | plan gain | pass / pass "
        "| admitted dfs / Feather | decode step µs | self-check ms | arrival µs |",
        "|---:|---:|---:|---|---|---|---|---:|---|---:|---:|---:|---|---|---:|",
    ]
    for c in result["cells"]:
        lines.append(
            f"| {c['num_waiting']} | {c['prompt_len']} | {c['num_running']} "
            f"| {_spread(c['baseline_calc_priority_s'], 1e3, 2)} | {_spread(c['baseline_pass_s'], 1e3, 2)} "
            f"| {_spread(c['feather_pass_s'], 1e3, 2)} | {_spread(c['feather_adapter_s'], 1e6, 1)} "
            f"| {c['calc_priority_ratio']:,.0f}× | {_spread(c['feather_step_adapter_s'], 1e6, 1)} "
            f"| {c['plan_gain']:.2f}× | {c['pass_ratio']:,.1f}× "
            f"| {c['baseline_admitted']} / {c['feather_admitted']} "
            f"| {_spread(c['decode_step_s'], 1e6, 1)} | {_spread(c['self_check_s'], 1e3, 2)} "
            f"| {c['arrive_s'] * 1e6:.0f} |"
        )
    lines += ["", *table(result.get("events", ()))]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue-sizes", type=int_list, default=(100, 2000, 5000), help="comma list of W")
    parser.add_argument(
        "--prompt-lens", type=int_list, default=(1024, 10240), help="comma list of prompt tokens"
    )
    parser.add_argument(
        "--running", type=int_list, default=(256, 512), help="comma list of running batch sizes"
    )
    parser.add_argument("--repeat", type=int, default=7, help="pass samples per side and cell (default 7)")
    parser.add_argument("--decode-block", type=int, default=200, help="decode-step hook calls per sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--stopper", help="Feather's stopper (default: Feather's own, always; see bench_adapter.STOPPER)"
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="Feather's Prometheus series on, as SGLang's --enable-metrics turns them on (default: off, "
        "SGLang's default)",
    )
    add_json_flag(parser)


def main(args: argparse.Namespace) -> int:
    result = run(
        args.queue_sizes,
        args.prompt_lens,
        args.running,
        args.repeat,
        args.decode_block,
        args.seed,
        args.stopper,
        metrics=args.metrics,
    )
    return publish(markdown(result), result, args.json)
