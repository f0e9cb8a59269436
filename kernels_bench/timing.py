"""Kernel timing: warm-up, then many repeats over rotating input sets, each after an L2 flush; median.

How it works: the launchers in `fns` each hold a different input set (own cache, queries, page tables) and
are called round-robin so no repeat finds the previous repeat's data in L2. On CUDA each repeat first
overwrites a flush buffer larger than L2 (as a real decode step does, streaming the other layers' weights
between two calls of this layer's attention), then records a start event, launches, records an end event;
the flush is outside the events. Times are read once at the end. On CPU a wall clock stands in.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = 5
    repeats: int = 30
    flush_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1 or self.flush_bytes < 0:
            raise ValueError(f"need warmup >= 0, repeats >= 1, flush_bytes >= 0: {self}")


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int


def _summarise(times_ms: list[float]) -> Timing:
    ordered = sorted(times_ms)
    last = len(ordered) - 1
    return Timing(
        median_ms=statistics.median(ordered),
        p10_ms=ordered[round(0.1 * last)],
        p90_ms=ordered[round(0.9 * last)],
        repeats=len(ordered),
    )


def time_cuda(fns: Sequence[Callable[[], object]], config: TimingConfig) -> Timing:
    flush = torch.empty(max(config.flush_bytes, 1), dtype=torch.uint8, device="cuda")
    for i in range(config.warmup):
        fns[i % len(fns)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(config.repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(config.repeats)]
    torch.cuda.synchronize()
    for i in range(config.repeats):
        flush.zero_()
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    return _summarise([start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)])


def time_wall(fns: Sequence[Callable[[], object]], config: TimingConfig) -> Timing:
    for i in range(config.warmup):
        fns[i % len(fns)]()
    times_ms = []
    for i in range(config.repeats):
        start = time.perf_counter()
        fns[i % len(fns)]()
        times_ms.append(1e3 * (time.perf_counter() - start))
    return _summarise(times_ms)


TIMERS: dict[str, Callable[[Sequence[Callable[[], object]], TimingConfig], Timing]] = {
    "cuda": time_cuda,
    "cpu": time_wall,
}
"""Device type -> timer."""
