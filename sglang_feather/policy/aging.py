"""Starvation guard: a candidate that has waited past a bound is admitted whatever the stopper says."""

from __future__ import annotations

import math

DEFAULT_MAX_WAIT_S = 300.0
"""Five minutes; see docs/policy.md ("Aging guard") for why this leaves the paper's workloads unchanged."""


class AgingGuard:
    """`is_starved(wait_s)` is true from `max_wait_s` on (inclusive); `max_wait_s=None` turns the guard off.

    The admission component asks the guard about the oldest waiting request before it consults the
    stopper, so the bound applies to every policy alike and no policy can starve a request forever.
    """

    def __init__(self, max_wait_s: float | None = DEFAULT_MAX_WAIT_S) -> None:
        if max_wait_s is not None and not (
            isinstance(max_wait_s, int | float) and math.isfinite(max_wait_s) and max_wait_s > 0
        ):
            raise ValueError(f"AgingGuard max_wait_s must be a finite number > 0 or None, got {max_wait_s!r}")
        self.max_wait_s = None if max_wait_s is None else float(max_wait_s)

    @property
    def enabled(self) -> bool:
        return self.max_wait_s is not None

    def is_starved(self, wait_s: float) -> bool:
        if math.isnan(wait_s):
            raise ValueError("AgingGuard.is_starved: wait_s is NaN")
        return self.max_wait_s is not None and wait_s >= self.max_wait_s

    def __repr__(self) -> str:
        return f"AgingGuard(max_wait_s={self.max_wait_s!r})"
