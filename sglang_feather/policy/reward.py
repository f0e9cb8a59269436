"""Window throughput -> reward in [0, 1], comparable across models and GPUs."""

from __future__ import annotations

import math
from typing import Any

DEFAULT_DECAY = 0.999
"""Per-window decay of the running peak: half-life ~693 windows, seconds to minutes of serving."""


class RewardNormalizer:
    """Divides each window's decode throughput by a slowly decaying running peak of the throughputs seen.

    The peak is updated before dividing (`peak = max(x, decay * peak)`), so every reward lies in [0, 1] and
    the best recent window scores 1. Dividing by the machine's own peak removes the model/GPU scale (a
    7B model on an H100 and a 70B model on an A10 both reach ~1 in their best windows), so one exploration
    constant fits all. The decay lets the scale follow a change of model or GPU after a state reload
    instead of staying pinned to an old, faster machine's peak.
    """

    def __init__(self, decay: float = DEFAULT_DECAY) -> None:
        if not (0.0 < decay <= 1.0):
            raise ValueError(f"RewardNormalizer decay must be in (0, 1], got {decay!r}")
        self.decay = decay
        self.peak: float | None = None
        self.num_windows = 0

    def update(self, throughput: float) -> float:
        """Fold one window's throughput (tokens/s) into the peak and return its reward in [0, 1]."""
        if not (isinstance(throughput, int | float) and math.isfinite(throughput) and throughput >= 0):
            raise ValueError(f"window throughput must be a finite number >= 0 tokens/s, got {throughput!r}")
        decayed = 0.0 if self.peak is None else self.peak * self.decay
        self.peak = max(float(throughput), decayed)
        self.num_windows += 1
        return throughput / self.peak if self.peak > 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"peak": self.peak, "num_windows": self.num_windows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        peak, num_windows = state["peak"], state["num_windows"]
        if peak is not None and not (isinstance(peak, int | float) and math.isfinite(peak) and peak >= 0):
            raise ValueError(f"normalizer peak must be a finite number >= 0 or null, got {peak!r}")
        if not (isinstance(num_windows, int) and num_windows >= 0):
            raise ValueError(f"normalizer num_windows must be an int >= 0, got {num_windows!r}")
        self.peak = None if peak is None else float(peak)
        self.num_windows = num_windows
