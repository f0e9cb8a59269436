"""`bench events`: what feeding SGLang's KV events into Feather's cache tier costs per chunk, beside SGLang's own."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict

from sglang_feather.bench.cli_types import add_json_flag, int_list, publish
from sglang_feather.bench.report import machine_line, run_meta
from sglang_feather.cht import backend_name

PAGE_SIZES = (1, 16)
"""SGLang's default page size (and this CPU server's), and a paged one."""


def run(page_sizes, prompt_lens, num_prompts: int, rounds: int, seed: int = 0) -> dict:
    from sglang_feather.offline.bench_adapter import measure_events

    started = time.time()
    load_before = os.getloadavg()
    events = [
        asdict(measure_events(page_size, prompt_len, num_prompts, rounds, seed))
        for page_size in page_sizes
        for prompt_len in prompt_lens
    ]
    meta = {
        **run_meta(started, load_before),
        "cht_backend": backend_name(),
        "rounds": rounds,
    }
    return {"meta": meta, "events": events}


def _spread(value: dict) -> str:
    return f"{value['median']:.2f} [{value['min']:.2f}–{value['max']:.2f}]"


def table(events) -> list[str]:
    """The per-chunk cost table (also `bench adapter`'s last section)."""
    lines = [
        "Cache tier feed: SGLang's own KV events of a server-built cache (`UnifiedRadixCache`, SGLang's Rust radix tree), "
        "translated and stored by Feather, round after round in one cache; median [range] over the rounds. "
        "SGLang records = what SGLang itself spends recording the same store events (insert with events on and "
        "`take_events`, less the insert with events off).",
        "",
        "| page | prompt | prompts a round | chunks a round | store µs/chunk | first round's store "
        "| evict µs/chunk | SGLang records µs/chunk |",
        "|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for e in events:
        lines.append(
            f"| {e['page_size']} | {e['prompt_len']} | {e['num_prompts']} | {e['num_chunks']} "
            f"| {_spread(e['store_us_per_chunk'])} | {e['first_store_us_per_chunk']:.2f} "
            f"| {_spread(e['evict_us_per_chunk'])} | {_spread(e['record_us_per_chunk'])} |"
        )
    return lines


def markdown(result: dict) -> str:
    meta = result["meta"]
    head = [f"{machine_line(meta)}, CHT backend {meta['cht_backend']}, {meta['rounds']} rounds a cell.", ""]
    return "\n".join(head + table(result["events"]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--page-sizes", type=int_list, default=PAGE_SIZES, help="comma list of SGLang page sizes"
    )
    parser.add_argument(
        "--prompt-lens", type=int_list, default=(1024, 10240), help="comma list of prompt tokens"
    )
    parser.add_argument("--prompts", type=int, default=20, help="prompts cached and evicted a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    add_json_flag(parser)


def main(args: argparse.Namespace) -> int:
    result = run(args.page_sizes, args.prompt_lens, args.prompts, args.rounds, args.seed)
    return publish(markdown(result), result, args.json)
