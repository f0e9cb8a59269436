"""Median and [min-max] over repeated runs, and throughput ratios taken within each repeat only."""

import pytest

from sglang_feather.serving.bench import BenchResult
from sglang_feather.serving.compare import WorkloadRun
from sglang_feather.serving.prefill_log import PrefillTotals
from sglang_feather.serving.repeats import KV_PRESSURE_METRICS, METRICS, Spread, format_summary, summarize


def bench(
    throughput: float, hit: float | None = 0.5, ttft_p99: float = 9.0, completed: int = 10
) -> WorkloadRun:
    result = BenchResult(
        "w", 10, completed, 1.0, 10.0, throughput, 2 * throughput, 5.0, ttft_p99, 1.0, 2.0, hit
    )
    return WorkloadRun("p", result)


def by_policy(summaries):
    return {s.policy: s for s in summaries}


def test_spread_is_median_min_max_whatever_the_order():
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0)
    assert Spread.of([4.0, 1.0]) == Spread(2.5, 1.0, 4.0)
    assert Spread.of([7.0]) == Spread(7.0, 7.0, 7.0)
    assert Spread(78.25, 77.9, 80.06).format(".1f") == "78.2 [77.9-80.1]"
    with pytest.raises(ValueError):
        Spread.of([])


def test_median_and_range_per_policy_and_metric():
    repeats = [
        {"fcfs": bench(100.0, 0.78, ttft_p99=30.0), "feather": bench(120.0, 0.88, ttft_p99=20.0)},
        {"feather": bench(90.0, 0.86, ttft_p99=25.0), "fcfs": bench(60.0, 0.80, ttft_p99=50.0)},
        {"fcfs": bench(80.0, 0.79, ttft_p99=40.0), "feather": bench(70.0, 0.885, ttft_p99=10.0)},
    ]
    s = by_policy(summarize(repeats, "fcfs"))
    assert list(s) == ["fcfs", "feather"]
    assert s["fcfs"].spreads["out tok/s"] == Spread(80.0, 60.0, 100.0)
    assert s["feather"].spreads["out tok/s"] == Spread(90.0, 70.0, 120.0)
    assert s["feather"].spreads["hit %"] == pytest.approx(Spread(88.0, 86.0, 88.5))
    assert s["fcfs"].spreads["TTFT p99"] == Spread(40.0, 30.0, 50.0)
    assert s["feather"].num_runs == 3 and (s["feather"].num_completed, s["feather"].num_requests) == (30, 30)
    assert set(s["fcfs"].spreads) == {m.header for m in METRICS}


def test_ratio_is_taken_within_each_repeat_not_between_medians():
    # Drift: repeat 2 is twice as slow for every policy. Side by side feather is always 1.2x fcfs, while
    # the ratio of the medians (120/100 vs ...) would depend on which repeat supplied each median.
    repeats = [
        {"fcfs": bench(100.0), "feather": bench(120.0)},
        {"fcfs": bench(50.0), "feather": bench(60.0)},
        {"fcfs": bench(200.0), "feather": bench(240.0)},
    ]
    s = by_policy(summarize(repeats, "fcfs"))
    assert s["feather"].throughput_ratio == pytest.approx(Spread(1.2, 1.2, 1.2))
    assert s["fcfs"].throughput_ratio == Spread(1.0, 1.0, 1.0)


def test_a_failed_run_narrows_only_its_policy_and_drops_out_of_ratios():
    repeats = [
        {"fcfs": bench(100.0), "lpm": bench(50.0)},
        {"lpm": bench(80.0)},
        {"fcfs": bench(40.0), "lpm": bench(60.0)},
    ]
    s = by_policy(summarize(repeats, "fcfs"))
    assert s["fcfs"].num_runs == 2 and s["lpm"].num_runs == 3
    assert s["lpm"].spreads["out tok/s"] == Spread(60.0, 50.0, 80.0)
    assert s["lpm"].throughput_ratio == Spread(1.0, 0.5, 1.5)


def test_missing_hit_rate_and_missing_baseline_show_as_dashes():
    repeats = [{"lpm": bench(10.0, hit=None)}]
    (lpm,) = summarize(repeats, "fcfs")
    assert lpm.spreads["hit %"] is None and lpm.throughput_ratio is None
    row = format_summary([lpm], "fcfs").splitlines()[2].split()
    assert row[:3] == ["lpm", "1", "10/10"] and row[3] == "-"


def test_table_has_one_row_per_policy_with_median_and_range_cells():
    repeats = [
        {"fcfs": bench(100.0, 0.78), "feather": bench(120.0, 0.88, completed=9)},
        {"fcfs": bench(50.0, 0.80), "feather": bench(60.0, 0.86)},
    ]
    lines = format_summary(summarize(repeats, "fcfs"), "fcfs").splitlines()
    header = lines[0].split("  ")
    assert [h.strip() for h in header if h.strip()][:6] == [
        "policy",
        "runs",
        "done",
        "hit %",
        "out tok/s",
        "x fcfs",
    ]
    assert lines[2].split()[:3] == ["fcfs", "2", "20/20"]
    feather = lines[3]
    assert feather.split()[:3] == ["feather", "2", "19/20"]
    assert "87.0 [86.0-88.0]" in feather and "90.0 [60.0-120.0]" in feather and "1.20 [1.20-1.20]" in feather
    assert "median [min-max]" in lines[-1] and "x fcfs" in lines[-1]


def kv_run(policy: str, throughput: float, prefilled: int, e2e_max_ms: float) -> WorkloadRun:
    result = BenchResult(
        "w", 10, 10, 1.0, throughput / 10, throughput, 2 * throughput, 5.0, 9.0, 1.0, 2.0, 0.25,
        e2e_p50_ms=e2e_max_ms / 2, e2e_max_ms=e2e_max_ms,
    )  # fmt: skip
    return WorkloadRun(policy, result, prefill=PrefillTotals(3, 10, prefilled, 100, retracted_reqs=1))


def test_kv_pressure_table_reports_prefill_requests_and_latency_per_policy():
    repeats = [
        {
            "fcfs": kv_run("fcfs", 100.0, 50_000, 9_000.0),
            "feather": kv_run("feather", 120.0, 20_000, 6_000.0),
        },
        {"feather": kv_run("feather", 60.0, 22_000, 8_000.0), "fcfs": kv_run("fcfs", 50.0, 60_000, 12_000.0)},
        {"fcfs": kv_run("fcfs", 80.0, 55_000, 10_000.0), "feather": kv_run("feather", 90.0, 21_000, 7_000.0)},
    ]
    summaries = summarize(repeats, "fcfs", KV_PRESSURE_METRICS)
    lines = format_summary(
        summaries, "fcfs", KV_PRESSURE_METRICS, "prefilled tok = the server log"
    ).splitlines()
    headers = [h.strip() for h in lines[0].split("  ") if h.strip()]
    assert headers == [
        "policy", "runs", "done", "hit %", "prefilled tok", "retracted", "req/s", "out tok/s", "x fcfs",
        "TPOT p50", "TPOT p99", "E2E p50 s", "E2E max s", "segments/step", "consults", "stops",
    ]  # fmt: skip
    feather = lines[3]
    assert feather.split()[:3] == ["feather", "3", "30/30"]
    assert "21000 [20000-22000]" in feather and "1 [1-1]" in feather and "9.00 [6.00-12.00]" in feather
    assert "7.0 [6.0-8.0]" in feather and "3.5 [3.0-4.0]" in feather and "1.20 [1.12-1.20]" in feather
    assert (
        "55000 [50000-60000]" in lines[2]
        and "10.0 [9.0-12.0]" in lines[2]
        and "8.00 [5.00-10.00]" in lines[2]
    )
    assert lines[-1].endswith("; prefilled tok = the server log")


def test_runs_without_server_log_totals_show_dashes():
    (fcfs,) = summarize([{"fcfs": bench(10.0)}], "fcfs", KV_PRESSURE_METRICS)
    assert fcfs.spreads["prefilled tok"] is None and fcfs.spreads["E2E max s"] is None
    assert fcfs.spreads["req/s"] == Spread(10.0, 10.0, 10.0)
