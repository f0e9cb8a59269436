"""Repeated policy runs: median and [min-max] of each metric, and each policy's throughput ratio to a baseline."""

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sglang_feather.serving.compare import WorkloadRun


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
    value: Callable[[WorkloadRun], float | None]
    spec: str


def hit_percent(run: WorkloadRun) -> float | None:
    rate = run.bench.cache_hit_rate
    return None if rate is None else 100 * rate


def prefilled_tokens(run: WorkloadRun) -> float | None:
    return None if run.prefill is None else run.prefill.new_tokens


def retracted_reqs(run: WorkloadRun) -> float | None:
    return None if run.prefill is None else run.prefill.retracted_reqs


def seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


THROUGHPUT = "out tok/s"
"""The column the per-repeat ratio to the baseline follows."""

METRICS = (
    Metric("hit %", hit_percent, ".1f"),
    Metric(THROUGHPUT, lambda r: r.bench.output_throughput, ".1f"),
    Metric("TTFT p50", lambda r: r.bench.ttft_p50_ms, ".0f"),
    Metric("TTFT p99", lambda r: r.bench.ttft_p99_ms, ".0f"),
    Metric("TPOT p50", lambda r: r.bench.tpot_p50_ms, ".1f"),
)
"""What the demo's summary reports per policy, in column order (ms for TTFT/TPOT, as in the serving table)."""


def per_decode_step(name: str) -> Callable[[WorkloadRun], float | None]:
    """A per-step sum of the decode segment series (`--feather-segment-metrics`) over the run's decode steps."""

    def value(run: WorkloadRun) -> float | None:
        steps = run.feather.get("sglang:feather_decode_shared_segments_count")
        return None if not steps else run.feather.get(name, 0.0) / steps

    return value


def _ms(value: float | None) -> float | None:
    return None if value is None else 1000 * value


def counter(name: str) -> Callable[[WorkloadRun], float | None]:
    return lambda run: run.feather.get(name)


DECODE_METRICS = (
    Metric("req/s", lambda r: r.bench.request_throughput, ".2f"),
    Metric(THROUGHPUT, lambda r: r.bench.output_throughput, ".1f"),
    Metric("TPOT p50", lambda r: r.bench.tpot_p50_ms, ".1f"),
    Metric("TPOT p99", lambda r: r.bench.tpot_p99_ms, ".1f"),
    Metric("hit %", hit_percent, ".1f"),
    Metric("segments/step", per_decode_step("sglang:feather_decode_shared_segments_sum"), ".2f"),
    Metric("reads/step", per_decode_step("sglang:feather_decode_shared_segment_reads_total"), ".1f"),
    Metric(
        "group ms/step",
        lambda r: _ms(per_decode_step("sglang:feather_decode_grouping_seconds_sum")(r)),
        ".3f",
    ),
    Metric("consults", counter("sglang:feather_consults_total"), ".0f"),
    Metric("stops", counter("sglang:feather_stops_total"), ".0f"),
)
"""The decode-heavy preset's columns: speed, and what a decode step reads (shared prefix segments, each read
once by feather_grouped; `reads` = segment reads a per-request kernel makes), with the stopper's counts."""

KV_PRESSURE_METRICS = (
    Metric("hit %", hit_percent, ".1f"),
    Metric("prefilled tok", prefilled_tokens, ".0f"),
    Metric("retracted", retracted_reqs, ".0f"),
    Metric("req/s", lambda r: r.bench.request_throughput, ".2f"),
    Metric(THROUGHPUT, lambda r: r.bench.output_throughput, ".1f"),
    Metric("TPOT p50", lambda r: r.bench.tpot_p50_ms, ".1f"),
    Metric("TPOT p99", lambda r: r.bench.tpot_p99_ms, ".1f"),
    Metric("E2E p50 s", lambda r: seconds(r.bench.e2e_p50_ms), ".1f"),
    Metric("E2E max s", lambda r: seconds(r.bench.e2e_max_ms), ".1f"),
    Metric("segments/step", per_decode_step("sglang:feather_decode_shared_segments_sum"), ".2f"),
    Metric("consults", counter("sglang:feather_consults_total"), ".0f"),
    Metric("stops", counter("sglang:feather_stops_total"), ".0f"),
)
"""The KV-pressure preset's columns: what prefill cost (the server's own log) next to speed and latency, what a
decode step reads (with segment metrics: `--attention-backends`) and the stopper's counts."""

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


def summarize(
    repeats: Sequence[Mapping[str, WorkloadRun]], baseline: str, metrics: Sequence[Metric] = METRICS
) -> list[PolicySummary]:
    """One summary per policy, in first-seen order; `repeats[i]` maps policy -> its run in repeat i.

    A policy missing from a repeat (its run failed) only narrows its own spreads; ratios use only the repeats
    in which both it and the baseline finished, so drift between repeats never enters a ratio.
    """
    policies = list(dict.fromkeys(p for repeat in repeats for p in repeat))
    summaries = []
    for policy in policies:
        runs = [repeat[policy] for repeat in repeats if policy in repeat]
        results = [run.bench for run in runs]
        spreads = {}
        for metric in metrics:
            values = [v for v in map(metric.value, runs) if v is not None]
            spreads[metric.header] = Spread.of(values) if values else None
        ratios = [
            repeat[policy].bench.output_throughput / repeat[baseline].bench.output_throughput
            for repeat in repeats
            if policy in repeat and baseline in repeat and repeat[baseline].bench.output_throughput > 0
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


def format_summary(
    summaries: Sequence[PolicySummary], baseline: str, metrics: Sequence[Metric] = METRICS, legend: str = ""
) -> str:
    """Plain-text table: `median [min-max]` per cell; `x <baseline>` (after the throughput column) is the
    per-repeat throughput ratio; `legend` is added to the standard one."""
    ratio_header = f"x {baseline}"
    columns = [
        h for m in metrics for h in ((m.header, ratio_header) if m.header == THROUGHPUT else (m.header,))
    ]
    headers = ["policy", "runs", "done", *columns]
    rows = []
    for s in summaries:
        cells = {m.header: _cell(s.spreads[m.header], m.spec) for m in metrics}
        cells[ratio_header] = _cell(s.throughput_ratio, RATIO_SPEC)
        rows.append(
            [s.policy, str(s.num_runs), f"{s.num_completed}/{s.num_requests}", *(cells[c] for c in columns)]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
        *("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows),
    ]
    standard = (
        "median [min-max] over runs; TTFT/TPOT in ms; hit % = prompt tokens served from the prefix cache; "
        f"x {baseline} = output throughput over {baseline}'s in the same repeat"
    )
    return "\n".join([*lines, standard + (f"; {legend}" if legend else "")])


def _cell(spread: Spread | None, spec: str) -> str:
    return "-" if spread is None else spread.format(spec)
