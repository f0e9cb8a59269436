"""`make demo`: serve fcfs, lpm and feather in turn on one shared-prefix workload and print one comparison table."""

import argparse
import json
import shlex
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from sglang_feather.serving import BenchConfig, ServerSpec, Workload, format_table, run_policies
from sglang_feather.serving.process import exit_on_sigterm
from sglang_feather.workload import SharedPrefixSpec

DEFAULT_MODEL = "models/tiny-llama"
FEATHER = "feather"
DEFAULT_POLICIES = ("fcfs", "lpm", FEATHER)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang_feather.demo", description=__doc__)
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="local folder or hub id (default: %(default)s)"
    )
    parser.add_argument("--tokenizer", default=None, help="defaults to --model")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if nvidia-smi exists"
    )
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--prompts-per-group", type=int, default=16)
    parser.add_argument("--system-prompt-len", type=int, default=512)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--server-args", default="", help="extra flags for every server (quoted)")
    parser.add_argument(
        "--feather-args",
        default="",
        help="extra flags for the feather server only, e.g. '--feather-stopper static'",
    )
    parser.add_argument("--out", type=Path, default=Path("results/demo"))
    return parser.parse_args(argv)


def pick_device(choice: str) -> str:
    if choice != "auto":
        return choice
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def check_model(model: str) -> None:
    if model == DEFAULT_MODEL and not Path(model).is_dir():
        raise SystemExit(f"{model} does not exist: run `make model` (or `make setup`) first")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    check_model(args.model)
    device = pick_device(args.device)
    spec = SharedPrefixSpec.per_group(
        args.groups,
        args.prompts_per_group,
        prefix_len=args.system_prompt_len,
        question_len=args.question_len,
        output_len=args.output_len,
    )
    workload = Workload(f"gsp-{args.groups}x{args.prompts_per_group}-{args.system_prompt_len}", spec)
    config = BenchConfig(max_concurrency=args.max_concurrency)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    print(
        f"demo: model {args.model} on {device}; {workload.num_requests} requests ({workload.name}); {policies}"
    )
    common = tuple(shlex.split(args.server_args))
    feather_only = tuple(shlex.split(args.feather_args))
    specs = [
        ServerSpec(args.model, p, device=device, extra_args=common + (feather_only if p == FEATHER else ()))
        for p in policies
    ]
    runs, failures = run_policies(
        specs,
        [workload],
        config,
        args.out,
        tokenizer=args.tokenizer,
        progress=lambda line: print(line, flush=True),
    )
    if runs:
        print()
        print(format_table(runs))
        summary = args.out / "summary.json"
        summary.write_text(json.dumps([asdict(r) for r in runs], indent=2, default=str) + "\n")
        print(f"\nper-policy logs and bench JSON under {args.out}/; summary in {summary}")
    if device == "cpu":
        print("note: on CPU these numbers show integration and scheduler overhead, not GPU locality gains.")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        sys.exit(130)
