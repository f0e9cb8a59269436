"""A decode step as the admission reports it to a stopper: its tokens, its time and what it read."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepSample:
    """One decode-only step of the engine, with the running batch's footprint as the admission counts it
    (`admission/costs.py`); chunks are the CHT's. Invalid numbers raise ValueError."""

    num_tokens: int
    """Tokens the step produced: one per running request that decoded."""
    elapsed_s: float
    """The step's wall time, from the previous step report (or the reward window's opening) to this one."""
    num_groups: int
    """Distinct prefix groups (first chunks) among the running requests."""
    num_running_chunks: int
    """Distinct chunks the running requests hold: what the step reads when each shared prefix is read once."""
    num_read_chunks: int
    """The running requests' chunks, each request's counted: what the step reads when nothing is shared."""

    def __post_init__(self) -> None:
        counts = ("num_tokens", "num_groups", "num_running_chunks", "num_read_chunks")
        bad = [f"{name}={getattr(self, name)!r}" for name in counts if getattr(self, name) < 0]
        if bad:
            raise ValueError(f"StepSample counts must be >= 0, got {', '.join(bad)}")
        if not (math.isfinite(self.elapsed_s) and self.elapsed_s > 0):
            raise ValueError(f"StepSample elapsed_s must be finite and > 0, got {self.elapsed_s!r}")
