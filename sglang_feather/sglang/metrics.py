"""Feather's Prometheus series, created in the scheduler process next to SGLang's own when --enable-metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_feather.cht import backend_name

STEP_TIME_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)


class FeatherMetrics:
    """Counters and histograms named `sglang:feather_*`, labelled like SGLang's scheduler series.

    SGLang's scheduler collector imports `prometheus_client` only after `PROMETHEUS_MULTIPROC_DIR` is set,
    and the HTTP server's `/metrics` aggregates every process's files; creating these in the scheduler
    process after SGLang's collector therefore puts them on the same endpoint.
    """

    def __init__(self, labels: Mapping[str, Any], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        self.labels = {key: str(value) for key, value in labels.items()}
        names = list(self.labels)
        common = {"labelnames": names, "registry": registry if registry is not None else REGISTRY}
        self._admissions = Counter(
            "sglang:feather_admissions", "Requests Feather admitted into the running batch.", **common
        )
        self._stops = Counter(
            "sglang:feather_stops",
            "STOPs of the stopping policy (each ended its pass, or closed it to new prefix groups).",
            **common,
        )
        self._consults = Counter(
            "sglang:feather_consults",
            "Candidates the stopping policy decided on (not aged, deferred or forced); kind: adds a prefix group "
            "to the running batch (new_group) or cuts the batch's shared prefix (cut).",
            labelnames=[*names, "kind"],
            registry=common["registry"],
        )
        self._windows = Counter(
            "sglang:feather_reward_windows",
            "Reward windows closed: each rewarded the stopper's decisions of one pass with its decode throughput.",
            **common,
        )
        self._reward = Counter(
            "sglang:feather_reward",
            "Sum of the normalised rewards (in [0, 1]) of those windows: over reward_windows, the mean reward.",
            **common,
        )
        self._num_windows = 0
        self._sum_reward = 0.0
        self._delta = Histogram(
            "sglang:feather_delta_chunks",
            "Shared-prefix depth lost by each admission (Delta, in CHT chunks).",
            buckets=DEPTH_BUCKETS,
            **common,
        )
        self._groups = Histogram(
            "sglang:feather_prefix_groups",
            "Distinct prefix groups (first CHT chunk) in the running batch and the prefill batch, at each prefill.",
            buckets=GROUP_BUCKETS,
            **common,
        )
        self._step_time = Histogram(
            "sglang:feather_step_seconds",
            "Time Feather spent in one scheduler step: queue events, the prefill pass and the step end.",
            buckets=STEP_TIME_BUCKETS,
            **common,
        )
        self._drift = Counter(
            "sglang:feather_drift",
            "Requests the periodic self-check found out of step with SGLang's queues (a missed event).",
            **common,
        )
        self._errors = Counter(
            "sglang:feather_errors",
            "Exceptions inside Feather; each turned the rest of its pass into FCFS.",
            **common,
        )

        self._order_time = Histogram(
            "sglang:feather_batch_order_seconds",
            "Time to put the running batch in prefix order after a merge (--feather-batch-order prefix).",
            buckets=STEP_TIME_BUCKETS,
            **common,
        )
        self._reorders = Counter(
            "sglang:feather_batch_reorders",
            "Merges after which the running batch was permuted into prefix order (its order changed).",
            **common,
        )

        self._info = Gauge(
            "sglang:feather_info",
            "1, labelled with the Chunked Hash Tree core in use (core: native, or python, ~26x slower).",
            labelnames=[*names, "core"],
            registry=common["registry"],
            multiprocess_mode="mostrecent",
        )
        self._info.labels(**self.labels, core=backend_name()).set(1)
        self._tracked = Gauge(
            "sglang:feather_tracked_requests",
            "Requests in Feather's Chunked Hash Tree after the last scheduler step, by state (waiting/active).",
            labelnames=[*names, "state"],
            registry=common["registry"],
            multiprocess_mode="mostrecent",
        )
        series_list = (self._admissions, self._stops, self._delta, self._groups, self._step_time)
        learning = (self._windows, self._reward)
        for series in (*series_list, *learning, self._drift, self._errors, self._order_time, self._reorders):
            series.labels(**self.labels)  # export zeros from the start, not only after the first event
        for kind in ("new_group", "cut"):
            self._consults.labels(**self.labels, kind=kind)

    def admitted(self, delta: int) -> None:
        self._admissions.labels(**self.labels).inc()
        self._delta.labels(**self.labels).observe(delta)

    def consulted(self, adds_group: bool) -> None:
        self._consults.labels(**self.labels, kind="new_group" if adds_group else "cut").inc()

    def rewards(self, num_windows: int, sum_reward: float) -> None:
        """Bring the reward counters up to the admission's running totals."""
        if num_windows > self._num_windows:
            self._windows.labels(**self.labels).inc(num_windows - self._num_windows)
            self._reward.labels(**self.labels).inc(max(0.0, sum_reward - self._sum_reward))
        self._num_windows, self._sum_reward = num_windows, sum_reward

    def stopped(self) -> None:
        self._stops.labels(**self.labels).inc()

    def prefix_groups(self, num_groups: int) -> None:
        """Distinct prefix groups in what runs once a prefill batch launched (the running batch and it)."""
        self._groups.labels(**self.labels).observe(num_groups)

    def scheduler_step(self, seconds: float) -> None:
        self._step_time.labels(**self.labels).observe(seconds)

    def drift(self, num_requests: int) -> None:
        self._drift.labels(**self.labels).inc(num_requests)

    def error(self) -> None:
        self._errors.labels(**self.labels).inc()

    def batch_ordered(self, seconds: float, moved: bool) -> None:
        self._order_time.labels(**self.labels).observe(seconds)
        if moved:
            self._reorders.labels(**self.labels).inc()

    def tracked(self, num_waiting: int, num_active: int) -> None:
        self._tracked.labels(**self.labels, state="waiting").set(num_waiting)
        self._tracked.labels(**self.labels, state="active").set(num_active)
