"""Side by side: vLLM's default scheduler vs FeatherScheduler on one shared-prefix workload, one server each."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_feather.serving.completions import RunResult, prefix_cache_counters, run
from sglang_feather.serving.process import exit_on_sigterm
from sglang_feather.serving.server import Server, ServerSpec, vllm_feather_args
from sglang_feather.workload import SHAPE_FIELDS, SharedPrefixSpec, WorkloadFlags


@dataclass(frozen=True)
class Measurement:
    scheduler: str
    result: RunResult
    num_cache_queries: float
    num_cache_hits: float

    @property
    def cache_hit_rate(self) -> float:
        return self.num_cache_hits / self.num_cache_queries if self.num_cache_queries else 0.0

    def row(self) -> str:
        r = self.result
        return (
            f"| {self.scheduler:<8} | {r.wall_s:7.2f} | {r.output_tokens_per_s:9.0f} | {r.mean_latency_s:8.3f} | "
            f"{r.latency_quantile(0.99):8.3f} | {self.cache_hit_rate:9.1%} | {r.num_failed:6d} |"
        )


HEADER = (
    "| sched    |  wall s | out tok/s | mean lat | p99 lat  | cache hit | failed |\n"
    "|----------|---------|-----------|----------|----------|-----------|--------|"
)


WARMUP = SharedPrefixSpec.per_group(
    8, 1, prefix_len=64, question_len=8, output_len=4, order="interleaved", seed=99
)
"""A few unrelated requests first, so that one-time costs (first forward pass, tokenizer) are not measured."""


WORKLOAD_FLAGS = WorkloadFlags(
    SharedPrefixSpec.per_group(8, 25, prefix_len=128, question_len=16, output_len=16, order="interleaved"),
    names=SHAPE_FIELDS,
    per_group=True,
)
"""The client sends first turns at once (`serving.completions.run`): no rate, one turn."""


def vllm_spec(model: str, policy: str, extra_args: tuple[str, ...] = ()) -> ServerSpec:
    """A vLLM server on CPU (`serving.server.VLLM_DEVICES["cpu"]`), `policy` fcfs (vLLM's own) or feather."""
    return ServerSpec(model=model, policy=policy, engine="vllm", device="cpu", extra_args=extra_args)


def measure(server: Server, scheduler: str, workload: SharedPrefixSpec, concurrency: int) -> Measurement:
    """Warm up, then run the workload once; the prefix-cache counters are differences over that run only."""
    run(server.base_url, server.spec.model, WARMUP, concurrency=WARMUP.num_requests)
    queries_before, hits_before = prefix_cache_counters(server.base_url)
    result = run(server.base_url, server.spec.model, workload, concurrency=concurrency)
    queries_after, hits_after = prefix_cache_counters(server.base_url)
    return Measurement(scheduler, result, queries_after - queries_before, hits_after - hits_before)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="models/tiny-llama")
    WORKLOAD_FLAGS.add_to(parser.add_argument_group("workload (fresh prefixes each round: seed = round)"))
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="rounds, alternating the two servers")
    parser.add_argument("--feather", type=json.loads, default={}, help='JSON, e.g. \'{"stopper": "static"}\'')
    parser.add_argument("--log-dir", type=Path, default=Path("results/vllm"))
    args = parser.parse_args(argv)
    try:
        spec = WORKLOAD_FLAGS.spec(args)
    except ValueError as exc:
        parser.error(str(exc))
    exit_on_sigterm()
    sizes = ("--block-size", str(args.block_size), "--max-num-seqs", str(args.max_num_seqs))
    specs = {
        "default": vllm_spec(args.model, "fcfs", sizes),
        "feather": vllm_spec(args.model, "feather", sizes + vllm_feather_args(args.feather)),
    }
    servers = {name: Server(spec, log_path=args.log_dir / f"vllm-{name}.log") for name, spec in specs.items()}
    runs: dict[str, list[Measurement]] = {name: [] for name in specs}
    num_same = num_total = 0
    try:
        for server in servers.values():
            server.start()
        for seed in range(args.repeat):
            workload = replace(spec, seed=seed)
            for name, server in servers.items():
                runs[name].append(measure(server, name, workload, args.concurrency))
            pair = [runs[name][-1].result.texts for name in specs]
            num_same += sum(a == b for a, b in zip(*pair, strict=True))
            num_total += workload.num_requests
    finally:
        for server in servers.values():
            server.stop()
    print(
        f"{args.repeat} rounds (fresh prefixes each), {workload.num_requests} requests, {args.concurrency} concurrent"
    )
    print(HEADER)
    for name in specs:
        for m in runs[name]:
            print(m.row())
    for name in specs:
        wall = statistics.median(m.result.wall_s for m in runs[name])
        tps = statistics.median(m.result.output_tokens_per_s for m in runs[name])
        print(f"median {name}: wall {wall:.2f} s, {tps:.0f} output tok/s")
    print(f"greedy outputs identical: {num_same}/{num_total}")
    failed = sum(m.result.num_failed for ms in runs.values() for m in ms)
    return 0 if num_same == num_total and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
