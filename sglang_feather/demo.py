"""`make demo`: serve fcfs, lpm, dfs-weight and feather on one shared-prefix workload, repeat, and compare."""

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sglang_feather.policy import policy_names
from sglang_feather.serving import BenchConfig, ServerSpec, Workload, format_table, run_policies
from sglang_feather.serving.compare import PolicyRun, bench_servers, started_servers
from sglang_feather.serving.process import exit_on_sigterm, run_cli
from sglang_feather.serving.repeats import (
    DECODE_METRICS,
    KV_PRESSURE_METRICS,
    METRICS,
    Metric,
    format_summary,
    summarize,
)
from sglang_feather.workload import SHAPE_FIELDS, SharedPrefixSpec, WorkloadFlags

DEFAULT_MODEL = "models/tiny-llama"
FEATHER = "feather"
BASELINE = "fcfs"
DEFAULT_POLICIES = (BASELINE, "lpm", "dfs-weight", FEATHER)
FEATHER_COUNTERS = (
    "sglang:feather_admissions_total",
    "sglang:feather_consults_total",
    "sglang:feather_stops_total",
    "sglang:feather_concentrated_total",
    "sglang:feather_reward_windows_total",
    "sglang:feather_reward_total",
)
"""Printed after each run: admissions, the stopper's consults (both kinds) and STOPs, the concentration rule's
holds, and the stopper's reward windows
and their reward sum (the mean reward is the ratio)."""
WORKLOAD_FLAGS = WorkloadFlags(
    SharedPrefixSpec.per_group(8, 16, prefix_len=512, question_len=32, output_len=32),
    names=SHAPE_FIELDS,
    per_group=True,
)
"""The spec fields bench_serving's generated-shared-prefix dataset takes (it draws its own text, so no seed)."""


@dataclass(frozen=True)
class Preset:
    """A named demo configuration: the workload, server flags, client settings and summary columns."""

    name: str
    spec: SharedPrefixSpec
    max_concurrency: int
    out: Path
    server_args: tuple[str, ...] = ()
    """Given to every server before `--server-args` (so the user's flags win)."""
    flush_cache: bool = False
    output_details: bool = False
    metrics: tuple[Metric, ...] = METRICS
    legend: str = ""
    bench_args: tuple[str, ...] = ()
    """Extra bench_serving flags (e.g. `--gsp-range-ratio`)."""


DEMO = Preset("demo", WORKLOAD_FLAGS.base, max_concurrency=64, out=Path("results/demo"))
KV_PRESSURE = Preset(
    "kv-pressure",
    SharedPrefixSpec.per_group(16, 16, prefix_len=2048, question_len=32, output_len=32),
    max_concurrency=64,
    out=Path("results/demo-kv-pressure"),
    server_args=("--max-total-tokens", "8192"),
    flush_cache=True,
    output_details=True,
    metrics=KV_PRESSURE_METRICS,
    legend=(
        "prefilled tok = sum of #new-token over the server's 'Prefill batch' log lines after bench_serving's "
        "post-warmup cache flush; retracted = requests decode sent back to the queue for lack of KV (their "
        "prompts are prefilled again); req/s = completed requests per second; E2E in s (max: the slowest "
        "request's time to its last token)"
    ),
)
"""A KV pool (8192 tokens) that holds the prefixes of 3 of the 16 groups at most; bench_serving shuffles the
requests (seeded), so groups arrive interleaved. The cache is flushed after the warmup request."""
DECODE_HEAVY = Preset(
    "decode-heavy",
    SharedPrefixSpec.per_group(16, 16, prefix_len=2048, question_len=32, output_len=64),
    max_concurrency=256,
    out=Path("results/demo-decode-heavy"),
    server_args=("--max-running-requests", "64"),
    flush_cache=True,
    output_details=True,
    metrics=DECODE_METRICS,
    legend=(
        "segments/step = shared prefix segments in a decode step (every nesting level; feather_grouped reads "
        "each once), reads/step = the segment reads a request-by-request kernel makes, group ms/step = the "
        "segment search per decode step (on torch_native: counted only, with --feather-segment-metrics); "
        "consults/stops = Feather's stopper"
    ),
)
"""Decode-bound: every request arrives at once (bench_serving shuffles them, so groups interleave) and a batch
of 64 cannot hold all 16 groups' requests, so which groups run together decides what a step reads."""

CONCENTRATION = Preset(
    "concentration",
    SharedPrefixSpec.per_group(
        24, 4, prefix_len=1536, question_len=800, output_len=128, popularity="zipf", zipf_alpha=1.1
    ),
    max_concurrency=64,
    out=Path("results/demo-concentration"),
    server_args=("--max-total-tokens", "10240"),
    flush_cache=True,
    output_details=True,
    metrics=KV_PRESSURE_METRICS,
    legend=KV_PRESSURE.legend
    + "; concentrated = candidates Feather's concentration rule held back for a pass",
    bench_args=("--gsp-range-ratio", "0.5"),
)
"""Issue 49's live set: 24 Zipf(1.1) groups (96 requests), bench_serving's `--gsp-range-ratio 0.5` drawing
each group's system prompt from 768-1536 tokens, each question from 400-800 and each output from 64-128, a KV
pool of 10,240 tokens (about four prefixes with their requests), 64 requests in flight (a queue builds at the
server), cache flushed after the warmup request."""

PRESETS = {preset.name: preset for preset in (DEMO, KV_PRESSURE, DECODE_HEAVY, CONCENTRATION)}

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
        help=(
            "comma-separated (default: %(default)s); feather:STOPPER runs feather with that stopper "
            f"({', '.join(policy_names())}); throughput ratios are to fcfs, else the first"
        ),
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
    presets = parser.add_mutually_exclusive_group()
    presets.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default=DEMO.name,
        help="the workload, server flags and summary columns to run (default: %(default)s); workload flags "
        "still override",
    )
    presets.add_argument(
        "--kv-pressure",
        dest="preset",
        action="store_const",
        const=KV_PRESSURE.name,
        help=(
            f"the KV-pressure preset: {KV_PRESSURE.spec.num_groups} groups x "
            f"{KV_PRESSURE.spec.num_requests // KV_PRESSURE.spec.num_groups} prompts, "
            f"{KV_PRESSURE.spec.prefix_len}-token prefixes, servers with {' '.join(KV_PRESSURE.server_args)}, "
            "cache flushed after warmup, prefilled tokens from the server log (workload flags still override)"
        ),
    )
    presets.add_argument(
        "--decode-heavy",
        dest="preset",
        action="store_const",
        const=DECODE_HEAVY.name,
        help=(
            f"the decode-heavy preset: {DECODE_HEAVY.spec.num_groups} groups x "
            f"{DECODE_HEAVY.spec.num_requests // DECODE_HEAVY.spec.num_groups} prompts, "
            f"{DECODE_HEAVY.spec.prefix_len}-token prefixes, {DECODE_HEAVY.spec.output_len}-token outputs, all "
            f"sent at once to servers with {' '.join(DECODE_HEAVY.server_args)}; reports what each decode step reads"
        ),
    )
    parser.add_argument(
        "--attention-backends",
        default="",
        help=(
            "comma-separated: run every policy on each (e.g. torch_native,feather_grouped), labelled "
            "POLICY@BACKEND, with --feather-segment-metrics (default: the device's backend only)"
        ),
    )
    parser.add_argument(
        "--reuse-servers",
        action="store_true",
        help="start each server once and flush its cache before every run, instead of a fresh server per run",
    )
    parser.add_argument(
        "--max-concurrency", type=positive_int, default=None, help="default: the preset's (64)"
    )
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
    parser.add_argument(
        "--out", type=Path, default=None, help="default: results/demo (results/demo-kv-pressure)"
    )
    args = parser.parse_args(join_flag_strings(sys.argv[1:] if argv is None else argv))
    args.preset = PRESETS[args.preset]
    args.max_concurrency = args.max_concurrency or args.preset.max_concurrency
    args.out = args.out or args.preset.out
    try:
        spec = replace(WORKLOAD_FLAGS, base=args.preset.spec).spec(args)
        args.workload = Workload(
            f"gsp-{spec.num_groups}x{spec.num_requests // spec.num_groups}-{spec.prefix_len}", spec
        )
    except ValueError as exc:
        parser.error(str(exc))
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    args.attention_backends = [b.strip() for b in args.attention_backends.split(",") if b.strip()]
    if not args.policies:
        parser.error("--policies names no policy")
    if len(set(args.policies)) != len(args.policies):
        parser.error(f"--policies names a policy twice: {args.policies}")
    for entry in args.policies:
        stopper = entry.partition(":")[2]
        if stopper and stopper not in policy_names():
            parser.error(
                f"--policies: {entry}: no stopper {stopper!r}; choose from {', '.join(policy_names())}"
            )
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


def _flag_values(argv: Sequence[str]) -> list[tuple[str, ...]]:
    """`--a 1 --b --c 2 3` -> [(--a, 1), (--b,), (--c, 2, 3)]: each flag with the values that follow it."""
    groups: list[tuple[str, ...]] = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append((token,))
        else:
            groups[-1] += (token,)
    return groups


def merged_server_args(preset: Sequence[str], given: Sequence[str]) -> tuple[str, ...]:
    """The preset's server flags that `given` does not set, then `given` (a flag given replaces the preset's)."""
    names = {group[0].partition("=")[0] for group in _flag_values(given)}
    kept = [group for group in _flag_values(preset) if group[0].partition("=")[0] not in names]
    return tuple(token for group in kept for token in group) + tuple(given)


def server_specs(args: argparse.Namespace, device: str) -> dict[str, ServerSpec]:
    """Label -> its server: the preset's flags and `--server-args` for all (those given replace the preset's),
    `--feather-args` for feather, a `feather:STOPPER` entry's stopper, and each attention backend asked for."""
    common = merged_server_args(args.preset.server_args, args.server_args)
    specs = {}
    for entry in args.policies:
        policy, _, stopper = entry.partition(":")
        own = args.feather_args if policy == FEATHER else ()
        own += ("--feather-stopper", stopper) if stopper else ()
        for backend in args.attention_backends or [None]:
            label = entry if backend is None else f"{entry}@{backend}"
            chosen = () if backend is None else ("--attention-backend", backend, "--feather-segment-metrics")
            specs[label] = ServerSpec(
                args.model, policy, device=device, extra_args=common + own + chosen, label=label
            )
    return specs


def load_average() -> str:
    return "/".join(f"{load:.2f}" for load in os.getloadavg())


def print_run_details(runs: Sequence[PolicyRun]) -> None:
    """After a repeat's table: Feather's stopper counters and each server's own prefill totals."""
    for run in runs:
        counters = run.runs[0].feather
        if FEATHER_COUNTERS[0] in counters:
            print(f"{run.policy}: " + ", ".join(f"{n} {counters.get(n, 0):.0f}" for n in FEATHER_COUNTERS))
        prefill = run.runs[0].prefill
        if prefill is not None:
            print(
                f"{run.policy}: server log: {prefill.new_tokens} prompt tokens prefilled, "
                f"{prefill.cached_tokens} cached, in {prefill.batches} prefill batches; "
                f"{prefill.retracted_reqs} requests retracted"
            )


def bench_config(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        max_concurrency=args.max_concurrency,
        flush_cache=args.preset.flush_cache,
        output_details=args.preset.output_details,
        extra_args=args.preset.bench_args,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    check_model(args.model)
    device = pick_device(args.device)
    workload, preset = args.workload, args.preset
    specs = server_specs(args, device)
    labels = list(specs)
    baseline = next((label for label in labels if label.partition("@")[0] == BASELINE), labels[0])
    server_args = list(merged_server_args(preset.server_args, args.server_args))
    start_load = load_average()
    print(
        f"demo ({preset.name}): model {args.model} on {device}; {workload.num_requests} requests "
        f"({workload.name}), max concurrency {args.max_concurrency}; {labels} x {args.repeat}; "
        f"server args {server_args}; load average {start_load}"
    )
    repeats, all_runs, num_failures = [], [], 0
    with ExitStack() as stack:
        servers = None
        if args.reuse_servers:
            print("starting every server once (their caches are flushed before each run)", flush=True)
            started = stack.enter_context(started_servers(list(specs.values()), args.out / "servers"))
            servers = {server.spec.name: server for server in started}
        for index in range(args.repeat):
            order = repeat_order(labels, index)
            print(
                f"\n== run {index + 1}/{args.repeat}: {', '.join(order)} (load average {load_average()})",
                flush=True,
            )
            progress = lambda line: print(line, flush=True)  # noqa: E731
            out = args.out / f"run{index + 1}"
            if servers is None:
                runs, failures = run_policies(
                    [specs[label] for label in order], [workload], bench_config(args), out,
                    tokenizer=args.tokenizer, progress=progress,
                )  # fmt: skip
            else:
                runs, failures = bench_servers(
                    [servers[label] for label in order], workload, bench_config(args), out,
                    tokenizer=args.tokenizer, progress=progress,
                )  # fmt: skip
            num_failures += len(failures)
            if runs:
                print(format_table(runs))
                print_run_details(runs)
            repeats.append({r.policy: r.runs[0] for r in runs})
            all_runs.append([asdict(r) for r in runs])
    summaries = summarize(repeats, baseline, preset.metrics)
    if summaries:
        end_load = load_average()
        print(
            f"\n== {preset.name}: {workload.name}, {args.repeat} run(s) per policy, "
            f"{'one server each, cache flushed' if args.reuse_servers else 'a fresh server'} (cold cache) "
            f"per run; load average (1/5/15 min) {start_load} at start, {end_load} at end"
        )
        print(format_summary(summaries, baseline, preset.metrics, preset.legend))
        summary = args.out / "summary.json"
        record = {
            "argv": list(sys.argv[1:] if argv is None else argv),
            "preset": preset.name,
            "server_args": server_args,
            "feather_args": list(args.feather_args),
            "max_concurrency": args.max_concurrency,
            "load_average": {"start": start_load, "end": end_load},
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
