"""Scheduler CPU-time accounting: measured wall time of the policy's real code, or a fixed charge (tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class CpuTimer(Protocol):
    def run(self, fn: Callable[[], object], excluded_s: Callable[[], float] = lambda: 0.0) -> float:
        """Run `fn` and return the scheduler CPU seconds to charge, less `excluded_s()` spent in engine code."""
        ...


@dataclass(frozen=True)
class MeasuredCpu:
    def run(self, fn: Callable[[], object], excluded_s: Callable[[], float] = lambda: 0.0) -> float:
        t0 = time.perf_counter()
        fn()
        return max(0.0, time.perf_counter() - t0 - excluded_s())


@dataclass(frozen=True)
class FixedCpu:
    """Charges `seconds` per call whatever the code took, so runs are deterministic."""

    seconds: float = 0.0

    def run(self, fn: Callable[[], object], excluded_s: Callable[[], float] = lambda: 0.0) -> float:
        fn()
        return self.seconds
