"""Prometheus text parsing, label-filtered sums and before/after differences."""

import pytest

from sglang_feather.serving.compare import FEATHER_PASS_SECONDS, WorkloadRun, feather_counters
from sglang_feather.serving.metrics import MetricsError, parse_metrics

TEXT = """\
# HELP sglang:num_running_reqs Running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{tp_rank="0"} 3.0
sglang:num_running_reqs{tp_rank="1"} 4.0
# HELP sglang:feather_admissions Requests Feather admitted.
# TYPE sglang:feather_admissions counter
sglang:feather_admissions_total{tp_rank="0"} 10.0
# HELP sglang:feather_step_seconds Pass time.
# TYPE sglang:feather_step_seconds histogram
sglang:feather_step_seconds_bucket{le="0.001",tp_rank="0"} 2.0
sglang:feather_step_seconds_bucket{le="+Inf",tp_rank="0"} 5.0
sglang:feather_step_seconds_count{tp_rank="0"} 5.0
sglang:feather_step_seconds_sum{tp_rank="0"} 0.25
"""


def test_total_sums_over_labels_and_filters_by_them():
    snapshot = parse_metrics(TEXT)
    assert snapshot.total("sglang:num_running_reqs") == 7.0
    assert snapshot.total("sglang:num_running_reqs", tp_rank="1") == 4.0
    assert snapshot.total("sglang:num_running_reqs", tp_rank="9") is None
    assert snapshot.total("sglang:absent") is None


def test_minus_gives_counter_deltas_and_counts_new_samples_from_zero():
    before = parse_metrics(TEXT)
    after = parse_metrics(
        TEXT.replace('_total{tp_rank="0"} 10.0', '_total{tp_rank="0"} 25.0')
        + 'sglang:feather_stops_total{tp_rank="0"} 2.0\n'
    )
    delta = after.minus(before)
    assert delta.total("sglang:feather_admissions_total") == 15.0
    assert delta.total("sglang:feather_stops_total") == 2.0
    assert delta.total("sglang:num_running_reqs") == 0.0


def test_feather_counters_drop_buckets_and_feed_the_pass_time():
    counters = feather_counters(parse_metrics(TEXT))
    assert set(counters) == {
        "sglang:feather_admissions_total",
        "sglang:feather_step_seconds_count",
        FEATHER_PASS_SECONDS,
    }
    run = WorkloadRun(policy="feather", bench=None, feather=counters)  # type: ignore[arg-type]
    assert run.feather_pass_s == 0.25
    assert WorkloadRun(policy="fcfs", bench=None).feather_pass_s is None  # type: ignore[arg-type]


def test_garbage_is_a_metrics_error():
    with pytest.raises(MetricsError):
        parse_metrics("sglang:x{unterminated 1\n")
