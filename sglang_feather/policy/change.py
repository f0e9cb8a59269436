"""Page-Hinkley change detection on a stream of rewards in [0, 1], for stoppers that follow workload shifts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# How it works.
#
# The Page-Hinkley test (Page 1954; Hinkley 1971) watches the cumulative deviation of a stream from its own
# running mean. For an upward shift it keeps m_up = Σ (x_t − x̄_t − δ) and its running minimum; while the
# mean is stable every term is negative on average (−δ), so m_up drifts down and m_up − min(m_up) stays
# small. Once the mean rises by more than δ, the terms turn positive and m_up − min(m_up) grows linearly;
# it alarms when that exceeds the threshold λ. A mirrored sum m_down = Σ (x̄_t − x_t − δ) catches a fall.
# Alarms are held back for the first `min_samples` values (the running mean is still noise). After an
# alarm the caller decides what to forget; the detector restarts from scratch, so it then measures the
# new regime's mean. Detection takes about λ / (shift − δ) samples; a false alarm on a stationary stream
# needs a run of deviations worth λ against a drift of δ per sample, so its rate falls roughly as
# exp(−2δλ / σ²) for noise σ (Siegmund 1985, for the CUSUM of which Page-Hinkley is the running-mean form).

DEFAULT_DELTA = 0.05
"""δ: mean shifts under 5 % of the reward range are tolerated (smaller than the UCB's exploration bonus
after a few samples, so a shift that small cannot change the arm UCB picks by much)."""
DEFAULT_THRESHOLD = 1.5
"""λ: at reward noise σ = 0.1 (the median spread of one (context, arm)'s rewards measured under `ucb` on the
synthetic stopping environments, docs/policy.md) no false alarm in 5 x 20,000 stationary samples; a shift of
0.3 (about the synthetic environments' arm flips) is caught within 6-9 samples (tests/policy/test_change.py
checks both, the delay as at most 12)."""
DEFAULT_MIN_SAMPLES = 8
"""No alarm before 8 samples: the running mean of fewer is too noisy to deviate from."""


@dataclass(frozen=True)
class PageHinkleyConfig:
    delta: float = DEFAULT_DELTA
    threshold: float = DEFAULT_THRESHOLD
    min_samples: int = DEFAULT_MIN_SAMPLES

    def __post_init__(self) -> None:
        for name in ("delta", "threshold"):
            value = getattr(self, name)
            if not (type(value) in (int, float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Page-Hinkley {name} must be a finite number >= 0, got {value!r}")
        if self.threshold == 0:
            raise ValueError("Page-Hinkley threshold must be > 0 (0 alarms on every sample)")
        if not (type(self.min_samples) is int and self.min_samples >= 1):
            raise ValueError(f"Page-Hinkley min_samples must be an int >= 1, got {self.min_samples!r}")


STATE_KEYS = ("num_samples", "mean", "sum_up", "min_up", "sum_down", "min_down")


class PageHinkley:
    """Two-sided Page-Hinkley test; `update(x)` returns True when the stream's mean has shifted (then it
    starts over)."""

    def __init__(self, config: PageHinkleyConfig | None = None) -> None:
        self.config = config if config is not None else PageHinkleyConfig()
        self.reset()

    def reset(self) -> None:
        self.num_samples = 0
        self.mean = 0.0
        self.sum_up = self.min_up = 0.0
        self.sum_down = self.min_down = 0.0

    def update(self, x: float) -> bool:
        if not (isinstance(x, int | float) and math.isfinite(x)):
            raise ValueError(f"Page-Hinkley sample must be a finite number, got {x!r}")
        cfg = self.config
        self.num_samples += 1
        self.mean += (x - self.mean) / self.num_samples
        self.sum_up += x - self.mean - cfg.delta
        self.min_up = min(self.min_up, self.sum_up)
        self.sum_down += self.mean - x - cfg.delta
        self.min_down = min(self.min_down, self.sum_down)
        if self.num_samples < cfg.min_samples:
            return False
        shifted = max(self.sum_up - self.min_up, self.sum_down - self.min_down) > cfg.threshold
        if shifted:
            self.reset()
        return shifted

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in STATE_KEYS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Install a state written by `state_dict`; ValueError (and nothing changed) if it is malformed."""
        if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
            raise ValueError(f"a Page-Hinkley state needs exactly the keys {STATE_KEYS}, got {state!r}")
        num = state["num_samples"]
        if not (type(num) is int and num >= 0):
            raise ValueError(f"Page-Hinkley num_samples must be an int >= 0, got {num!r}")
        values = {key: state[key] for key in STATE_KEYS[1:]}
        for key, value in values.items():
            if not (type(value) in (int, float) and math.isfinite(value)):
                raise ValueError(f"Page-Hinkley {key} must be a finite number, got {value!r}")
        if values["min_up"] > values["sum_up"] or values["min_down"] > values["sum_down"]:
            raise ValueError("Page-Hinkley minimum exceeds its running sum")
        self.num_samples = num
        for key, value in values.items():
            setattr(self, key, float(value))
