"""Per-context two-arm tables (ADD, STOP) and their JSON form."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sglang_feather.policy.base import Decision
from sglang_feather.policy.context import AUTHORS_FIELDS, NUM_FIELDS, Context, parse_context

ARMS = (Decision.ADD, Decision.STOP)
ARM_INDEX = {Decision.ADD: 0, Decision.STOP: 1}


def greedy_arm(counts: dict[Context, list[Any]], sums: dict[Context, list[float]], ctx: Context) -> Decision:
    """The arm with the best mean reward in `ctx` (ADD when either arm is untried there, or on a tie)."""
    arm_counts = counts.get(ctx)
    if arm_counts is None or arm_counts[0] == 0 or arm_counts[1] == 0:
        return Decision.ADD
    arm_sums = sums[ctx]
    return Decision.STOP if arm_sums[1] / arm_counts[1] > arm_sums[0] / arm_counts[0] else Decision.ADD


def dump_table(table: Mapping[Context, Sequence[float]]) -> list[list[Any]]:
    """[[*context (seven buckets), value_add, value_stop], ...] sorted by context."""
    return [[*ctx, *values] for ctx, values in sorted(table.items())]


def load_counts(rows: object) -> dict[Context, list[int]]:
    """Inverse of `dump_table` for a table of visit counts (integers >= 0); ValueError on anything malformed
    (never a partial table)."""
    table: dict[Context, list[int]] = {}
    for ctx, row in _rows(rows, table):
        counts = [v for v in row[-2:] if type(v) is int and v >= 0]
        if len(counts) != 2:
            raise ValueError(f"bad table value in row {row!r}: counts are integers >= 0")
        table[ctx] = counts
    return table


def load_values(rows: object) -> dict[Context, list[float]]:
    """Inverse of `dump_table` for a table of reward sums or values (finite numbers); ValueError on anything
    malformed (never a partial table)."""
    table: dict[Context, list[float]] = {}
    for ctx, row in _rows(rows, table):
        values = [float(v) for v in row[-2:] if isinstance(v, int | float) and math.isfinite(v)]
        if len(values) != 2:
            raise ValueError(f"bad table value in row {row!r}: values are finite numbers")
        table[ctx] = values
    return table


def _rows(rows: object, table: Mapping[Context, object]) -> Iterator[tuple[Context, list[object]]]:
    """Each row of a dumped table with its context, checked for shape and against the contexts `table`
    holds so far."""
    if not isinstance(rows, list):
        raise ValueError(f"a table must be a list of rows, got {type(rows).__name__}")
    for row in rows:
        if not (isinstance(row, list) and len(row) in (AUTHORS_FIELDS + 2, NUM_FIELDS + 2)):
            raise ValueError(f"a table row must be [*context (3 or 7 ints), add, stop], got {row!r}")
        ctx = parse_context(row[:-2])
        if ctx in table:
            raise ValueError(f"duplicate context {list(ctx)} in table")
        yield ctx, row
