"""Per-step counts of a decode batch's prefix segments, for any attention backend, as metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_feather.sglang.grouped_attention.segments import BatchSegments, SegmentCounts, find_segments

SEGMENT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
SECONDS_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1)


def decode_seq_lens(forward_batch: Any) -> list[int] | None:
    """A non-empty decode batch's sequence lengths (from the host copy when SGLang keeps one); None for any
    other batch (extend, mixed, idle), which no backend groups."""
    if not forward_batch.forward_mode.is_decode() or not forward_batch.batch_size:
        return None
    seq_lens = forward_batch.seq_lens_cpu
    return (seq_lens if seq_lens is not None else forward_batch.seq_lens).tolist()


@dataclass(slots=True)
class SegmentTotals:
    """Sums over decode steps; what a run reports per step is each sum over `num_steps`."""

    num_steps: int = 0
    num_shared_segments: int = 0
    num_shared_reads_per_request: int = 0
    num_tokens_read: int = 0
    num_tokens_logical: int = 0
    detection_s: float = 0.0

    def add(self, counts: SegmentCounts, detection_s: float) -> None:
        self.num_steps += 1
        self.num_shared_segments += counts.num_shared_segments
        self.num_shared_reads_per_request += counts.num_shared_reads_per_request
        self.num_tokens_read += counts.num_tokens_read
        self.num_tokens_logical += counts.num_tokens_logical
        self.detection_s += detection_s


@dataclass(slots=True)
class SegmentObserver:
    """Finds a decode batch's segments and books them; the grouped backend plans from what it returns, other
    backends only count (`--feather-segment-metrics`)."""

    backend: str
    page_size: int
    metrics: Any = None
    totals: SegmentTotals = field(default_factory=SegmentTotals)

    def observe(
        self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: list[int]
    ) -> tuple[BatchSegments, torch.Tensor]:
        """The batch's segments and its KV index rows; the detection time is booked with the counts."""
        start = time.perf_counter()
        rows = req_to_token.index_select(0, req_pool_indices)[:, : max(seq_lens)]
        segments = find_segments(rows, seq_lens, self.page_size)
        elapsed = time.perf_counter() - start
        self.book(segments, elapsed)
        return segments, rows

    def book(self, segments: BatchSegments, elapsed_s: float) -> None:
        counts = segments.counts()  # once: the totals and the metrics read the same numbers
        self.totals.add(counts, elapsed_s)
        if self.metrics is not None:
            self.metrics.record(counts, elapsed_s)


COUNTERS = {
    "num_shared_reads_per_request": (
        "sglang:feather_decode_shared_segment_reads",
        "Shared segments a per-request kernel reads (each member reads each of its segments)",
    ),
    "num_tokens_read": (
        "sglang:feather_decode_kv_tokens_grouped",
        "KV tokens a decode step reads with each shared segment read once",
    ),
    "num_tokens_logical": (
        "sglang:feather_decode_kv_tokens_logical",
        "KV tokens a decode step reads request by request (the sum of sequence lengths)",
    ),
}
"""`SegmentCounts` field -> its counter (name, help)."""


class SegmentMetrics:
    """`sglang:feather_decode_*` series in the scheduler process, labelled with the attention backend."""

    def __init__(self, backend: str, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        registry = registry if registry is not None else REGISTRY
        labels = ["attention_backend"]
        self.segments = Histogram(
            "sglang:feather_decode_shared_segments",
            "Shared prefix segments in a decode step (every nesting level), each read once by a grouped kernel",
            labels,
            buckets=SEGMENT_BUCKETS,
            registry=registry,
        ).labels(backend)
        self.detection = Histogram(
            "sglang:feather_decode_grouping_seconds",
            "Time to find a decode step's prefix segments (once per forward)",
            labels,
            buckets=SECONDS_BUCKETS,
            registry=registry,
        ).labels(backend)
        self.counters = {
            count: Counter(name, help_text, labels, registry=registry).labels(backend)
            for count, (name, help_text) in COUNTERS.items()
        }

    def record(self, counts: SegmentCounts, detection_s: float) -> None:
        self.segments.observe(counts.num_shared_segments)
        self.detection.observe(detection_s)
        for count, counter in self.counters.items():
            counter.inc(getattr(counts, count))
