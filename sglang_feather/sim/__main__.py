"""`python -m sglang_feather.sim`: run policies over a workload on a GPU x model profile and report."""

from __future__ import annotations

import sys
from dataclasses import asdict

from sglang_feather.sim.cli import (
    admission_config,
    build_parser,
    engine_config,
    sweep_values,
    workload_config,
)
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu, MeasuredCpu
from sglang_feather.sim.plots import plot_sweep
from sglang_feather.sim.policies import POLICIES, PolicyError
from sglang_feather.sim.profile import ProfileError, load_profile
from sglang_feather.sim.report import (
    summarize,
    summary_dict,
    table,
    tree_cache_lines,
    wait_by_length,
    wait_table,
    write_json,
)
from sglang_feather.sim.run import RunSpec, simulate
from sglang_feather.sim.trace import TraceError, read_jsonl, write_jsonl
from sglang_feather.sim.workloads import make_workload


def _progress(total: int, label: str, enabled: bool):
    if not enabled:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=label, unit="req", leave=False, file=sys.stderr)
    return bar, bar.update


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {sorted(POLICIES)}")
    try:
        prof = load_profile(args.gpu, args.model, tuple(args.profile_override))
    except ProfileError as e:
        raise SystemExit(f"profile error: {e}") from None
    cost = PhysicsCostModel(prof)
    config = engine_config(args)
    admission = admission_config(args)
    cpu = MeasuredCpu() if args.fixed_cpu_ms is None else FixedCpu(args.fixed_cpu_ms / 1e3)
    key, values = sweep_values(args.sweep)
    provenance = prof.provenance()
    print(f"profile: {cost.name}; estimates: {', '.join(provenance['by_source']['estimate']) or 'none'}")
    if provenance["overrides"]:
        print(f"overrides: {', '.join(provenance['overrides'])}")
    runs, points = [], []
    for value in values:
        wcfg = workload_config(args) if key is None else workload_config(args, **{key: value})
        try:
            requests = read_jsonl(args.trace) if args.trace else make_workload(args.workload, wcfg)
        except (TraceError, OSError, ValueError) as e:
            raise SystemExit(f"workload error: {e}") from None
        if args.export_trace:
            write_jsonl(requests, args.export_trace)
        summaries, waits = [], []
        for policy in policies:
            spec = RunSpec(policy, admission)
            bar, update = _progress(len(requests), policy, not args.no_progress)
            try:
                log = simulate(requests, cost, spec, config, cpu, update)
            except PolicyError as e:
                raise SystemExit(str(e)) from None
            finally:
                if bar is not None:
                    bar.close()
            s = summarize(policy, log)
            summaries.append(s)
            bins = wait_by_length(log, max(1, args.wait_bins), args.long_wait_s)
            waits.append((policy, bins))
            runs.append(
                {
                    "sweep": {key: value} if key else {},
                    "spec": spec.to_dict(),
                    "workload": asdict(wcfg),
                    **summary_dict(s),
                    "wait_by_length": [asdict(b) for b in bins],
                }
            )
            points.append({"value": value, "policy": policy, "output_tok_s": s.output_tok_s})
        label = args.trace or args.workload
        print(f"\n## {label}" + (f" {key}={value}" if key else "") + f" on {cost.name}")
        print(table(summaries))
        for line in tree_cache_lines(summaries):
            print(line)
        if args.wait_bins:
            print(f"\nqueue wait by prompt length ({args.wait_bins} bins of equal request count)")
            print(wait_table(waits, args.long_wait_s))
    meta = {
        "profile": provenance,
        "constants": prof.constants,
        "engine": asdict(config),
        "argv": sys.argv[1:],
    }
    if args.json:
        write_json(args.json, meta, runs)
    if args.plot_dir and key is not None:
        path = plot_sweep(key, points, args.plot_dir, f"{args.trace or args.workload} on {cost.name}")
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
