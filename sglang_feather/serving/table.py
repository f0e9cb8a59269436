"""Plain-text comparison table of policy runs, one row per (workload, policy)."""

from collections.abc import Sequence

from sglang_feather.serving.compare import PolicyRun, WorkloadRun

COLUMNS = (
    "workload",
    "policy",
    "done",
    "req/s",
    "out tok/s",
    "x first",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "hit %",
    "feather s",
)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _row(run: WorkloadRun, baseline: WorkloadRun) -> list[str]:
    b = run.bench
    ratio = (
        b.output_throughput / baseline.bench.output_throughput if baseline.bench.output_throughput else None
    )
    return [
        b.workload,
        run.policy,
        f"{b.completed}/{b.num_requests}",
        f"{b.request_throughput:.2f}",
        f"{b.output_throughput:.1f}",
        _fmt(ratio, ".2f"),
        f"{b.ttft_p50_ms:.0f}",
        f"{b.ttft_p99_ms:.0f}",
        f"{b.tpot_p50_ms:.1f}",
        f"{b.tpot_p99_ms:.1f}",
        _fmt(None if b.cache_hit_rate is None else 100 * b.cache_hit_rate, ".1f"),
        _fmt(run.feather_pass_s, ".3f"),
    ]


def format_table(policy_runs: Sequence[PolicyRun]) -> str:
    """Rows grouped by workload; `x first` is output throughput relative to the first policy's."""
    rows = []
    workloads = list(dict.fromkeys(r.bench.workload for p in policy_runs for r in p.runs))
    for workload in workloads:
        runs = [r for p in policy_runs for r in p.runs if r.bench.workload == workload]
        rows += [_row(run, runs[0]) for run in runs]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    legend = (
        "TTFT/TPOT in ms; hit % = prompt tokens served from the prefix cache; "
        "feather s = seconds Feather spent in scheduler steps (its /metrics histogram)"
    )
    return "\n".join([*lines, legend])
