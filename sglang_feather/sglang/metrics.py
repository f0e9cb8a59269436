"""Feather's Prometheus series, created in the scheduler process next to SGLang's own when --enable-metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_feather.cht import backend_name

STEP_TIME_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)


class FeatherMetrics:
    """Counters and histograms named `sglang:feather_*`, labelled like SGLang's scheduler series.

    SGLang's scheduler collector imports `prometheus_client` only after `PROMETHEUS_MULTIPROC_DIR` is set,
    and the HTTP server's `/metrics` aggregates every process's files; creating these in the scheduler
    process after SGLang's collector therefore puts them on the same endpoint. Each series is bound to this
    scheduler's labels once, here, and a planned pass books its admissions in one call: with a `labels(...)`
    lookup per event, a pass of 42 admissions cost 4.4x Feather's share without the series (docs/overhead.md).
    """

    def __init__(self, labels: Mapping[str, Any], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        self.labels = {key: str(value) for key, value in labels.items()}
        names = list(self.labels)
        registry = registry if registry is not None else REGISTRY
        self.registry = registry
        """Where the series are registered (the process's default registry unless one was given)."""

        def series(kind: type, name: str, doc: str, **extra: Any) -> Any:
            """The series bound to this scheduler's labels (exported as zeros from the start)."""
            return kind(name, doc, labelnames=names, registry=registry, **extra).labels(**self.labels)

        self._admissions = series(
            Counter, "sglang:feather_admissions", "Requests Feather admitted into the running batch."
        )
        self._stops = series(
            Counter,
            "sglang:feather_stops",
            "STOPs of the stopping policy (each ended its pass, or closed it to new prefix groups).",
        )
        self._concentrated = series(
            Counter,
            "sglang:feather_concentrated",
            "Candidates the concentration rule held back for a pass (they would lock a new prefix while the KV "
            "pool binds).",
        )
        consults = Counter(
            "sglang:feather_consults",
            "Candidates the stopping policy decided on (not aged, deferred or forced); kind: adds a prefix group "
            "to the running batch (new_group) or cuts the batch's shared prefix (cut).",
            labelnames=[*names, "kind"],
            registry=registry,
        )
        self._new_group_consults = consults.labels(**self.labels, kind="new_group")
        self._cut_consults = consults.labels(**self.labels, kind="cut")
        self._windows = series(
            Counter,
            "sglang:feather_reward_windows",
            "Reward windows closed: each rewarded the stopper's decisions of one pass with its decode throughput.",
        )
        self._reward = series(
            Counter,
            "sglang:feather_reward",
            "Sum of the normalised rewards (in [0, 1]) of those windows: over reward_windows, the mean reward.",
        )
        self._num_windows = 0
        self._sum_reward = 0.0
        self._delta = series(
            Histogram,
            "sglang:feather_delta_chunks",
            "Shared-prefix depth lost by each admission (Delta, in CHT chunks).",
            buckets=DEPTH_BUCKETS,
        )
        self._groups = series(
            Histogram,
            "sglang:feather_prefix_groups",
            "Distinct prefix groups (first CHT chunk) in the running batch and the prefill batch, at each prefill.",
            buckets=GROUP_BUCKETS,
        )
        self._step_time = series(
            Histogram,
            "sglang:feather_step_seconds",
            "Time Feather spent in one scheduler step: queue events, the prefill pass and the step end.",
            buckets=STEP_TIME_BUCKETS,
        )
        self._drift = series(
            Counter,
            "sglang:feather_drift",
            "Requests the periodic self-check found out of step with SGLang's queues (a missed event).",
        )
        self._errors = series(
            Counter,
            "sglang:feather_errors",
            "Exceptions inside Feather; each turned the rest of its pass into FCFS.",
        )
        self._order_time = series(
            Histogram,
            "sglang:feather_batch_order_seconds",
            "Time to put the running batch in prefix order after a merge (--feather-batch-order prefix).",
            buckets=STEP_TIME_BUCKETS,
        )
        self._reorders = series(
            Counter,
            "sglang:feather_batch_reorders",
            "Merges after which the running batch was permuted into prefix order (its order changed).",
        )
        info = Gauge(
            "sglang:feather_info",
            "1, labelled with the Chunked Hash Tree backend in use (cht_backend: native, or python, ~26x slower).",
            labelnames=[*names, "cht_backend"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        info.labels(**self.labels, cht_backend=backend_name()).set(1)
        tracked = Gauge(
            "sglang:feather_tracked_requests",
            "Requests in Feather's Chunked Hash Tree after the last scheduler step, by state (waiting/active).",
            labelnames=[*names, "state"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self._tracked_waiting = tracked.labels(**self.labels, state="waiting")
        self._tracked_active = tracked.labels(**self.labels, state="active")

    def admitted(self, delta: int) -> None:
        self._admissions.inc()
        self._delta.observe(delta)

    def admitted_all(self, deltas: Sequence[int]) -> None:
        """`admitted` for each of a planned pass's admissions."""
        if deltas:
            self._admissions.inc(len(deltas))
            observe = self._delta.observe
            for delta in deltas:
                observe(delta)

    def consulted(self, adds_group: bool) -> None:
        (self._new_group_consults if adds_group else self._cut_consults).inc()

    def consulted_all(self, num_new_group: int, num_cut: int) -> None:
        """`consulted` for that many decisions of each kind."""
        if num_new_group:
            self._new_group_consults.inc(num_new_group)
        if num_cut:
            self._cut_consults.inc(num_cut)

    def rewards(self, num_windows: int, sum_reward: float) -> None:
        """Bring the reward counters up to the admission's running totals."""
        if num_windows > self._num_windows:
            self._windows.inc(num_windows - self._num_windows)
            self._reward.inc(max(0.0, sum_reward - self._sum_reward))
        self._num_windows, self._sum_reward = num_windows, sum_reward

    def stopped(self) -> None:
        self._stops.inc()

    def concentrated(self) -> None:
        self._concentrated.inc()

    def prefix_groups(self, num_groups: int) -> None:
        """Distinct prefix groups in what runs once a prefill batch launched (the running batch and it)."""
        self._groups.observe(num_groups)

    def scheduler_step(self, seconds: float) -> None:
        self._step_time.observe(seconds)

    def drift(self, num_requests: int) -> None:
        self._drift.inc(num_requests)

    def error(self) -> None:
        self._errors.inc()

    def batch_ordered(self, seconds: float, moved: bool) -> None:
        self._order_time.observe(seconds)
        if moved:
            self._reorders.inc()

    def tracked(self, num_waiting: int, num_active: int) -> None:
        self._tracked_waiting.set(num_waiting)
        self._tracked_active.set(num_active)
