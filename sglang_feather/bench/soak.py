"""`bench soak`: many requests through Feather's SGLang plugin hooks; memory after warm-up and every index drained."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, replace

from sglang_feather.bench.cli_types import add_json_flag, publish
from sglang_feather.policy import policy_names


def markdown(result: dict) -> str:
    cfg = result["config"]
    lines = [
        f"{result['num_finished'] + result['num_aborted']} requests ({result['num_finished']} finished, "
        f"{result['num_aborted']} aborted, {result['num_retracted']} retractions) in {result['num_steps']} "
        f"steps / {result['num_passes']} prefill passes, {result['wall_s']:.0f} s (tracemalloc "
        f"{'on' if cfg['trace'] else 'off'}, CHT backend {result['cht_backend']}, stopper {cfg['stopper']}); "
        f"Feather errors {result['num_errors']}, drift {result['num_drift']}.",
        "",
        "| after | requests done | RSS MB | traced MB | traced from sglang_feather MB | waiting | active "
        "| tree nodes | index entries |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [("warm-up (drained)", result["after_warmup"])]
    rows += [("checkpoint", c) for c in result["checkpoints"]]
    rows.append(("end (drained)", result["at_end"]))
    for name, c in rows:
        t = c["tracked"]
        lines.append(
            f"| {name} | {c['num_done']} | {c['rss_mb']:.1f} | {c['traced_mb']:.3f} | "
            f"{c['feather_traced_mb']:.3f} | {t['tree_waiting']} | {t['tree_active']} | {t['tree_nodes']} "
            f"| {t['tree_index_entries']} |"
        )
    lines += [
        "",
        f"Growth from the drained warm-up to the drained end: RSS {result['rss_growth_mb']:+.2f} MB, traced "
        f"{result['traced_growth_mb']:+.3f} MB, traced from sglang_feather {result['feather_traced_growth_mb']:+.3f} MB.",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=100_000, help="requests to finish or abort")
    parser.add_argument("--warmup", type=int, default=5_000, help="requests before the first measurement")
    parser.add_argument("--waiting", type=int, default=256, help="waiting requests kept queued")
    parser.add_argument("--max-prompt-len", type=int, default=10_240)
    parser.add_argument(
        "--stopper", default="static", choices=policy_names(), help="stopping policy (default: %(default)s)"
    )
    parser.add_argument("--no-trace", action="store_true", help="without tracemalloc (RSS and counters only)")
    parser.add_argument("--seed", type=int, default=0)
    add_json_flag(parser)


def main(args: argparse.Namespace) -> int:
    from sglang_feather.cht import backend_name
    from sglang_feather.offline import soak as engine

    cfg = replace(
        engine.SoakConfig(),
        num_requests=args.requests,
        warmup_requests=min(args.warmup, args.requests // 2),
        num_waiting=args.waiting,
        max_prompt_len=args.max_prompt_len,
        stopper=args.stopper,
        trace=not args.no_trace,
        seed=args.seed,
    )
    soak = engine.run_soak(cfg)
    result = {
        **asdict(soak),
        "rss_growth_mb": soak.rss_growth_mb,
        "traced_growth_mb": soak.traced_growth_mb,
        "feather_traced_growth_mb": soak.feather_traced_growth_mb,
        "cht_backend": backend_name(),
        "loadavg": os.getloadavg(),
    }
    return publish(markdown(result), result, args.json)
