"""The comparison table: one row per (workload, policy), throughput relative to the first policy."""

from sglang_feather.serving.bench import BenchResult
from sglang_feather.serving.compare import FEATHER_PASS_SECONDS, PolicyRun, WorkloadRun
from sglang_feather.serving.metrics import parse_metrics
from sglang_feather.serving.table import COLUMNS, format_table


def bench(workload: str, throughput: float) -> BenchResult:
    return BenchResult(workload, 10, 10, 1.0, 10.0, throughput, 2 * throughput, 5.0, 9.0, 1.0, 2.0, 0.5)


def test_rows_grouped_by_workload_with_ratio_to_first_policy():
    fcfs = PolicyRun(
        "fcfs", 1.0, (WorkloadRun("fcfs", bench("a", 100.0)), WorkloadRun("fcfs", bench("b", 50.0)))
    )
    feather = PolicyRun(
        "feather",
        1.0,
        (
            WorkloadRun("feather", bench("a", 150.0), {FEATHER_PASS_SECONDS: 0.125}),
            WorkloadRun("feather", bench("b", 25.0), {FEATHER_PASS_SECONDS: 0.5}),
        ),
    )
    lines = format_table([fcfs, feather]).splitlines()
    header = lines[0].split()
    assert header[:2] == ["workload", "policy"]
    rows = [line.split() for line in lines[2:6]]
    assert [(r[0], r[1]) for r in rows] == [("a", "fcfs"), ("a", "feather"), ("b", "fcfs"), ("b", "feather")]
    assert [r[COLUMNS.index("x first")] for r in rows] == ["1.00", "1.50", "1.00", "0.50"]
    assert rows[0][-1] == "-" and rows[1][-1] == "0.125"
    assert rows[0][COLUMNS.index("hit %")] == "50.0"


def test_feather_seconds_column_reads_a_series_the_plugin_exports():
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang_feather.sglang.metrics import FeatherMetrics

    registry = CollectorRegistry()
    metrics = FeatherMetrics({"model_name": "tiny"}, registry)
    metrics.scheduler_step(0.25)
    metrics.scheduler_step(0.5)
    exported = parse_metrics(generate_latest(registry).decode())
    assert exported.total(FEATHER_PASS_SECONDS, model_name="tiny") == 0.75
