"""Repeated policy runs: median and [min-max] of each metric, and each policy's throughput ratio to a baseline."""

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sglang_feather.serving.bench import BenchResult


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        if not values:
            raise ValueError("Spread.of needs at least one value")
        return cls(statistics.median(values), min(values), max(values))

    def format(self, spec: str) -> str:
        return f"{self.median:{spec}} [{self.low:{spec}}-{self.high:{spec}}]"


@dataclass(frozen=True)
class Metric:
    header: str
    value: Callable[[BenchResult], float | None]
    spec: str


METRICS = (
    Metric("hit %", lambda b: None if b.cache_hit_rate is None else 100 * b.cache_hit_rate, ".1f"),
    Metric("out tok/s", lambda b: b.output_throughput, ".1f"),
    Metric("TTFT p50", lambda b: b.ttft_p50_ms, ".0f"),
    Metric("TTFT p99", lambda b: b.ttft_p99_ms, ".0f"),
    Metric("TPOT p50", lambda b: b.tpot_p50_ms, ".1f"),
)
"""What the summary reports per policy, in column order (ms for TTFT/TPOT, as in the serving table)."""

RATIO_SPEC = ".2f"


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    num_runs: int
    num_completed: int
    num_requests: int
    spreads: Mapping[str, Spread | None]
    """Metric header -> spread over the runs that report it (None: no run does)."""
    throughput_ratio: Spread | None
    """Output throughput over the baseline's in the same repeat (None: never side by side with it)."""


def summarize(repeats: Sequence[Mapping[str, BenchResult]], baseline: str) -> list[PolicySummary]:
    """One summary per policy, in first-seen order; `repeats[i]` maps policy -> its result in repeat i.

    A policy missing from a repeat (its run failed) only narrows its own spreads; ratios use only the repeats
    in which both it and the baseline finished, so drift between repeats never enters a ratio.
    """
    policies = list(dict.fromkeys(p for repeat in repeats for p in repeat))
    summaries = []
    for policy in policies:
        results = [repeat[policy] for repeat in repeats if policy in repeat]
        spreads = {}
        for metric in METRICS:
            values = [v for v in map(metric.value, results) if v is not None]
            spreads[metric.header] = Spread.of(values) if values else None
        ratios = [
            repeat[policy].output_throughput / repeat[baseline].output_throughput
            for repeat in repeats
            if policy in repeat and baseline in repeat and repeat[baseline].output_throughput > 0
        ]
        summaries.append(
            PolicySummary(
                policy=policy,
                num_runs=len(results),
                num_completed=sum(b.completed for b in results),
                num_requests=sum(b.num_requests for b in results),
                spreads=spreads,
                throughput_ratio=Spread.of(ratios) if ratios else None,
            )
        )
    return summaries


def format_summary(summaries: Sequence[PolicySummary], baseline: str) -> str:
    """Plain-text table: `median [min-max]` per cell; `x <baseline>` is the per-repeat throughput ratio."""
    ratio_header = f"x {baseline}"
    headers = ["policy", "runs", "done", "hit %", "out tok/s", ratio_header, *(m.header for m in METRICS[2:])]
    rows = []
    for s in summaries:
        cells = {m.header: _cell(s.spreads[m.header], m.spec) for m in METRICS}
        cells[ratio_header] = _cell(s.throughput_ratio, RATIO_SPEC)
        rows.append(
            [
                s.policy,
                str(s.num_runs),
                f"{s.num_completed}/{s.num_requests}",
                *(cells[h] for h in headers[3:]),
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
        *("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows),
    ]
    legend = (
        "median [min-max] over runs; TTFT/TPOT in ms; hit % = prompt tokens served from the prefix cache; "
        f"x {baseline} = output throughput over {baseline}'s in the same repeat"
    )
    return "\n".join([*lines, legend])


def _cell(spread: Spread | None, spec: str) -> str:
    return "-" if spread is None else spread.format(spec)
