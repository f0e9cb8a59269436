"""`make demo`: serve fcfs, lpm, dfs-weight and feather on one shared-prefix workload, repeat, and compare."""

import argparse
import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from sglang_feather.serving import BenchConfig, ServerSpec, Workload, format_table, run_policies
from sglang_feather.serving.process import exit_on_sigterm, run_cli
from sglang_feather.serving.repeats import format_summary, summarize
from sglang_feather.workload import SHAPE_FIELDS, SharedPrefixSpec, WorkloadFlags

DEFAULT_MODEL = "models/tiny-llama"
FEATHER = "feather"
BASELINE = "fcfs"
DEFAULT_POLICIES = (BASELINE, "lpm", "dfs-weight", FEATHER)
FEATHER_COUNTERS = ("sglang:feather_admissions_total", "sglang:feather_stops_total")
"""Printed after each run: how often the stopper ended a pass with requests waiting, against admissions."""
WORKLOAD_FLAGS = WorkloadFlags(
    SharedPrefixSpec.per_group(8, 16, prefix_len=512, question_len=32, output_len=32),
    names=SHAPE_FIELDS,
    per_group=True,
)
"""The spec fields bench_serving's generated-shared-prefix dataset takes (it draws its own text, so no seed)."""
FLAG_STRING_OPTIONS = ("--server-args", "--feather-args")
"""Options whose value is itself a command line: the next token is always their value."""


def join_flag_strings(argv: Sequence[str]) -> list[str]:
    """`--server-args --x` -> `--server-args=--x`.

    argparse takes a lone token that starts with `-` (and has no space) for an option, so it refuses
    `--server-args --disable-overlap-schedule`; the equals form and a quoted string with a space pass through.
    """
    joined: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        value = next(tokens, None) if token in FLAG_STRING_OPTIONS else None
        joined.append(token if value is None else f"{token}={value}")
    return joined


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_feather.demo", description=__doc__, allow_abbrev=False
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="local folder or hub id (default: %(default)s)"
    )
    parser.add_argument("--tokenizer", default=None, help="defaults to --model")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated (default: %(default)s); throughput ratios are to fcfs, else the first",
    )
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=3,
        help="runs per policy, each on a fresh server (cold cache); policies interleave (default: %(default)s)",
    )
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if nvidia-smi exists"
    )
    WORKLOAD_FLAGS.add_to(
        parser.add_argument_group("workload (bench_serving's generated-shared-prefix)"),
        aliases={"num_groups": ("--groups",), "prefix_len": ("--system-prompt-len",)},
    )
    parser.add_argument("--max-concurrency", type=positive_int, default=64)
    parser.add_argument(
        "--server-args",
        default="",
        help="extra flags for every server: --server-args=--disable-overlap-schedule, or one quoted string",
    )
    parser.add_argument(
        "--feather-args",
        default="",
        help="extra flags for the feather server only, e.g. '--feather-stopper static'",
    )
    parser.add_argument("--out", type=Path, default=Path("results/demo"))
    args = parser.parse_args(join_flag_strings(sys.argv[1:] if argv is None else argv))
    try:
        spec = WORKLOAD_FLAGS.spec(args)
        args.workload = Workload(
            f"gsp-{spec.num_groups}x{spec.num_requests // spec.num_groups}-{spec.prefix_len}", spec
        )
    except ValueError as exc:
        parser.error(str(exc))
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not args.policies:
        parser.error("--policies names no policy")
    if len(set(args.policies)) != len(args.policies):
        parser.error(f"--policies names a policy twice: {args.policies}")
    for option in ("server_args", "feather_args"):
        try:
            setattr(args, option, tuple(shlex.split(getattr(args, option))))
        except ValueError as exc:
            parser.error(f"--{option.replace('_', '-')}: {exc}")
    return args


def pick_device(choice: str) -> str:
    if choice != "auto":
        return choice
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def check_model(model: str) -> None:
    if model == DEFAULT_MODEL and not Path(model).is_dir():
        raise SystemExit(f"{model} does not exist: run `make model` (or `make setup`) first")


def repeat_order(policies: Sequence[str], repeat: int) -> list[str]:
    """Round-robin: repeat r starts at policy r, so no policy always runs first or last in a repeat."""
    shift = repeat % len(policies)
    return [*policies[shift:], *policies[:shift]]


def server_specs(args: argparse.Namespace, device: str) -> dict[str, ServerSpec]:
    """Policy -> its server: `--server-args` for all, `--feather-args` added for feather only."""
    return {
        p: ServerSpec(
            args.model,
            p,
            device=device,
            extra_args=args.server_args + (args.feather_args if p == FEATHER else ()),
        )
        for p in args.policies
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    check_model(args.model)
    device = pick_device(args.device)
    workload = args.workload
    config = BenchConfig(max_concurrency=args.max_concurrency)
    baseline = BASELINE if BASELINE in args.policies else args.policies[0]
    print(
        f"demo: model {args.model} on {device}; {workload.num_requests} requests ({workload.name}), "
        f"max concurrency {args.max_concurrency}; {args.policies} x {args.repeat}; "
        f"server args {list(args.server_args)}"
    )
    specs = server_specs(args, device)
    repeats, all_runs, num_failures = [], [], 0
    for index in range(args.repeat):
        order = repeat_order(args.policies, index)
        print(f"\n== run {index + 1}/{args.repeat}: {', '.join(order)}", flush=True)
        runs, failures = run_policies(
            [specs[p] for p in order],
            [workload],
            config,
            args.out / f"run{index + 1}",
            tokenizer=args.tokenizer,
            progress=lambda line: print(line, flush=True),
        )
        num_failures += len(failures)
        if runs:
            print(format_table(runs))
            for run in runs:
                counters = run.runs[0].feather
                if FEATHER_COUNTERS[0] in counters:
                    print(
                        f"{run.policy}: "
                        + ", ".join(f"{n} {counters.get(n, 0):.0f}" for n in FEATHER_COUNTERS)
                    )
        repeats.append({r.policy: r.runs[0].bench for r in runs})
        all_runs.append([asdict(r) for r in runs])
    summaries = summarize(repeats, baseline)
    if summaries:
        print(f"\n== {workload.name}, {args.repeat} run(s) per policy, a fresh server (cold cache) per run")
        print(format_summary(summaries, baseline))
        summary = args.out / "summary.json"
        record = {
            "argv": list(sys.argv[1:] if argv is None else argv),
            "server_args": list(args.server_args),
            "feather_args": list(args.feather_args),
            "max_concurrency": args.max_concurrency,
            "workload": asdict(workload),
            "runs": all_runs,
            "summary": [asdict(s) for s in summaries],
        }
        summary.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"\nper-run logs and bench JSON under {args.out}/run*/; summary in {summary}")
    if device == "cpu":
        print("note: on CPU these numbers show integration and scheduler overhead, not GPU locality gains.")
    return 1 if num_failures else 0


if __name__ == "__main__":
    run_cli(main)
