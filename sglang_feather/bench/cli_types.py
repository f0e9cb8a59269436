"""Argument types and output shared by the benchmark subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_feather.measure.workloads import WORKLOADS


def seed_list(text: str) -> tuple[int, ...]:
    """Comma-separated integers, any sign."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def int_list(text: str) -> tuple[int, ...]:
    values = seed_list(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return values


def workload_list(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown}; choose from {','.join(WORKLOADS)}")
    return names


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="also write every number to this JSON file")


def publish(text: str, result: dict, json_path: Path | None) -> int:
    """Print a benchmark's report and, with `--json`, write its numbers; the subcommand's exit status."""
    print(text)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
        print(f"wrote {json_path}", file=sys.stderr)
    return 0
