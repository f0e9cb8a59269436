"""Command line: `python -m sglang_feather.bench SUBCOMMAND [options]`, one per `SUBCOMMANDS` entry."""

from __future__ import annotations

import argparse
import sys

from sglang_feather.bench import (
    adapter,
    chunk_size,
    events,
    grouped_attention,
    overhead,
    soak,
    step_model,
    vllm_admission,
)

SUBCOMMANDS = {
    "overhead": overhead,
    "chunk-size": chunk_size,
    "adapter": adapter,
    "events": events,
    "soak": soak,
    "grouped-attention": grouped_attention,
    "step-model": step_model,
    "vllm-admission": vllm_admission,
}
"""Subcommand -> module providing `add_arguments(parser)` and `main(args) -> int` (its docstring is the help)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_feather.bench", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=module.__doc__, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.main(args)


if __name__ == "__main__":
    sys.exit(main())
