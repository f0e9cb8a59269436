"""`python -m kernels_bench.serving`: run every policy on the paper's workloads, write JSON, a table and a plot."""

import argparse
import datetime
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from kernels_bench.serving.plot import plot
from kernels_bench.serving.profiles import PROFILES
from kernels_bench.serving.workloads import DRY_SMALL, WorkloadPlan, build_workloads
from sglang_feather.options import given_flags
from sglang_feather.serving import BenchConfig, ServerSpec, format_table, run_policies
from sglang_feather.serving.process import exit_on_sigterm, run_cli
from sglang_feather.workload import SHAPE_FIELDS, WorkloadFlags

FEATHER = "feather"
POLICIES = ("fcfs", "lpm", "dfs-weight", FEATHER)
TINY_MODEL = "models/tiny-llama"
WORKLOAD_FLAGS = WorkloadFlags(
    WorkloadPlan().spec, names=tuple(n for n in SHAPE_FIELDS if n != "prefix_len"), per_group=True
)
"""The spec's flags but `--prefix-len`: `--prefix-lens` lists the prefix lengths to serve."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    plan = WorkloadPlan()
    parser = argparse.ArgumentParser(prog="python -m kernels_bench.serving", description=__doc__)
    parser.add_argument("--model", help="model folder or hub id (required unless --dry-small)")
    parser.add_argument("--profile", choices=sorted(PROFILES), help="machine settings (see README)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--prefix-lens", type=_ints, default=plan.prefix_lens, help="shared prefix tokens")
    WORKLOAD_FLAGS.add_to(parser, aliases={"num_groups": ("--groups",)})
    parser.add_argument("--no-sharing-len", type=int, default=plan.no_sharing_len, help="0 skips it")
    parser.add_argument("--max-concurrency", type=int, default=None, help="default: every request at once")
    parser.add_argument("--request-rate", type=float, default=None, help="default: inf")
    parser.add_argument("--server-args", default="", help="extra flags for every server (quoted)")
    parser.add_argument("--feather-args", default="", help="extra flags for the feather server only (quoted)")
    parser.add_argument("--out", type=Path, default=None, help="default results/serving/<profile>-<date>")
    parser.add_argument(
        "--dry-small",
        action="store_true",
        help=f"CPU smoke run: {TINY_MODEL}, profile cpu-tiny, tiny workloads, policies overlapped",
    )
    args = parser.parse_args(argv)
    if args.dry_small:
        args.model = args.model or TINY_MODEL
        args.profile = args.profile or "cpu-tiny"
    elif not (args.model and args.profile):
        parser.error("--model and --profile are required (or use --dry-small)")
    if args.dry_small and given_flags(args, WORKLOAD_FLAGS.options()):
        parser.error("--dry-small serves its own tiny workloads: drop the workload flags")
    try:
        plan = WorkloadPlan(WORKLOAD_FLAGS.spec(args), args.prefix_lens, args.no_sharing_len or None)
        args.workloads = build_workloads(DRY_SMALL if args.dry_small else plan)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def policy_args(policy: str, args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(shlex.split(args.feather_args)) if policy == FEATHER else ()


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
    return result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    profile = PROFILES[args.profile]
    now = datetime.datetime.now(datetime.UTC)
    out = args.out or Path("results/serving") / f"{args.profile}-{now:%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    workloads = args.workloads
    config = BenchConfig(max_concurrency=args.max_concurrency, request_rate=args.request_rate)
    extra = profile.server_args + tuple(shlex.split(args.server_args))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    specs = [
        ServerSpec(args.model, policy, device=profile.device, extra_args=extra + policy_args(policy, args))
        for policy in policies
    ]
    print(f"serving bench: {args.model} on {args.profile}; policies {policies}; out {out}", flush=True)
    for workload in workloads:
        print(f"  {workload.name}: {workload.num_requests} requests", flush=True)

    runs, failures = run_policies(
        specs, workloads, config, out, parallel=args.dry_small, progress=lambda line: print(line, flush=True)
    )
    results = {
        "meta": {
            "model": args.model,
            "profile": args.profile,
            "profile_description": profile.description,
            "server_args": list(extra),
            "feather_args": shlex.split(args.feather_args),
            "gpu": gpu_name(),
            "sglang": importlib.metadata.version("sglang"),
            "date": now.isoformat(timespec="seconds"),
            "dry_small": args.dry_small,
            "bench": asdict(replace(config)),
            "workloads": [asdict(w) for w in workloads],
        },
        "runs": [asdict(run) for run in runs],
        "failures": [asdict(f) for f in failures],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = format_table(runs)
    (out / "table.txt").write_text(table + "\n")
    print(table)
    if runs:
        print(f"plot: {plot(out / 'results.json', out / 'results.png')}")
    incomplete = [f"{r.policy}/{w.bench.workload}" for r in runs for w in r.runs if w.bench.num_failed]
    if incomplete:
        print(f"requests failed in: {', '.join(incomplete)}", file=sys.stderr)
    return 1 if failures or incomplete else 0


if __name__ == "__main__":
    run_cli(main)
