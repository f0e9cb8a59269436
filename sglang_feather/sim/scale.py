"""`python -m sglang_feather.sim.scale`: N instances behind the SMG cache_aware model, per policy: throughput, hit
rate, prefix groups split across instances (what-if planning for 8-64 GPUs)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from sglang_feather.sim.cli import admission_config, build_parser, engine_config, workload_config
from sglang_feather.sim.cluster import ClusterConfig, ClusterLog, simulate_cluster
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu, MeasuredCpu
from sglang_feather.sim.profile import load_profile
from sglang_feather.sim.router import RouterConfig
from sglang_feather.sim.run import RunSpec
from sglang_feather.sim.workloads import make_workload


@dataclass(frozen=True)
class ScaleSummary:
    policy: str
    num_instances: int
    num_requests: int
    duration_s: float
    output_tok_s: float
    req_s: float
    cache_hit_rate: float
    split_groups: int
    num_groups: int
    spills: int
    ttft_p50_s: float
    ttft_p99_s: float
    busiest_share: float
    """Requests on the busiest instance over the mean per instance (1.0: even)."""


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))] if values else 0.0


def summarize(policy: str, log: ClusterLog) -> ScaleSummary:
    reqs = [r for run in log.instances for r in run.requests]
    hits = sum(run.cache_hit_tokens for run in log.instances)
    filled = hits + sum(run.cache_miss_tokens for run in log.instances)
    per_instance = [len(run.requests) for run in log.instances]
    mean = sum(per_instance) / len(per_instance)
    ttft = [r.first_token_s - r.arrival_s for r in reqs]
    out = sum(r.output_len for r in reqs)
    return ScaleSummary(
        policy=policy,
        num_instances=len(log.instances),
        num_requests=len(reqs),
        duration_s=log.end_s,
        output_tok_s=out / log.end_s if log.end_s else 0.0,
        req_s=len(reqs) / log.end_s if log.end_s else 0.0,
        cache_hit_rate=hits / filled if filled else 0.0,
        split_groups=log.split_groups,
        num_groups=log.num_groups,
        spills=log.branches.get("spill", 0),
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        busiest_share=max(per_instance) / mean if mean else 0.0,
    )


def table(summaries: list[ScaleSummary]) -> str:
    headers = ("instances", "policy", "out tok/s", "req/s", "hit %", "split groups", "spills", "TTFT p50 s",
               "TTFT p99 s", "busiest/mean")  # fmt: skip
    rows = [
        (
            str(s.num_instances),
            s.policy,
            f"{s.output_tok_s:.0f}",
            f"{s.req_s:.2f}",
            f"{100 * s.cache_hit_rate:.1f}",
            f"{s.split_groups}/{s.num_groups}",
            str(s.spills),
            f"{s.ttft_p50_s:.2f}",
            f"{s.ttft_p99_s:.2f}",
            f"{s.busiest_share:.2f}",
        )  # fmt: skip
        for s in summaries
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "python -m sglang_feather.sim.scale"
    p.description = __doc__
    d = RouterConfig()
    r = p.add_argument_group("cluster (SMG 1.13.0 cache_aware model, sglang_feather/sim/router.py)")
    r.add_argument("--instances", default="8", help="comma-separated instance counts, e.g. 8,16,64")
    r.add_argument("--cache-threshold", type=float, default=d.cache_threshold)
    r.add_argument("--balance-abs-threshold", type=int, default=d.balance_abs_threshold)
    r.add_argument("--balance-rel-threshold", type=float, default=d.balance_rel_threshold)
    r.add_argument(
        "--worker-overload-waiting-requests",
        type=int,
        default=d.overload_waiting_requests,
        help="0 turns worker overload protection off",
    )
    r.add_argument("--load-poll-s", type=float, default=d.load_poll_s, help="seconds between load reports")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cost = PhysicsCostModel(load_profile(args.gpu, args.model, tuple(args.profile_override)))
    config = engine_config(args)
    cpu = MeasuredCpu() if args.fixed_cpu_ms is None else FixedCpu(args.fixed_cpu_ms / 1e3)
    router = RouterConfig(
        cache_threshold=args.cache_threshold,
        balance_abs_threshold=args.balance_abs_threshold,
        balance_rel_threshold=args.balance_rel_threshold,
        overload_waiting_requests=args.worker_overload_waiting_requests or None,
        load_poll_s=args.load_poll_s,
    )
    requests = make_workload(args.workload, workload_config(args))
    admission = admission_config(args)
    summaries = []
    for count in (int(n) for n in args.instances.split(",")):
        for policy in (p for p in args.policies.split(",") if p):
            log = simulate_cluster(
                requests, cost, RunSpec(policy, admission), ClusterConfig(count, router), config, cpu
            )
            summaries.append(summarize(policy, log))
            print(f"{count} x {cost.name}, {policy}: done", file=sys.stderr, flush=True)
    print(f"## {args.workload}, {len(requests)} requests, on {cost.name}; router {asdict(router)}")
    print(table(summaries))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"argv": sys.argv[1:], "router": asdict(router), "runs": [asdict(s) for s in summaries]},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
