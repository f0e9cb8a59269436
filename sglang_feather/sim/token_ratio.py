"""SGLang's `new_token_ratio`: the share of running requests' remaining outputs an admission pass reserves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_feather.sim.requests import ReqState

RETRACT_DECODE_STEPS = 20
"""SGLang 0.5.23 `SGLANG_RETRACT_DECODE_STEPS` (environ.py): outputs a retraction assumes each survivor still
generates when it re-estimates the ratio."""


@dataclass(frozen=True)
class NewTokenRatio:
    """A schedule of the ratio: `init` at start and whenever the engine goes idle, less `(init - min) /
    decay_steps` per decode step down to `min`, and re-estimated from the survivors after a retraction.

    SGLang 0.5.23 (`NewTokenRatioTracker`): init 0.7 (`SGLANG_INIT_NEW_TOKEN_RATIO` x
    `--schedule-conservativeness` 1.0), min 0.7 x 0.14 (`SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`), 600 steps
    (`SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`). A fixed ratio has `min == init`: nothing decays, and a retraction
    (which an exact reservation never needs) leaves it as it is.
    """

    init: float
    min: float
    decay_steps: int = 600

    def __post_init__(self) -> None:
        if not 0.0 <= self.min <= self.init <= 1.0:
            raise ValueError(f"need 0 <= min <= init <= 1, got init={self.init}, min={self.min}")
        if self.decay_steps < 1:
            raise ValueError(f"decay_steps must be >= 1, got {self.decay_steps}")

    @classmethod
    def fixed(cls, ratio: float) -> NewTokenRatio:
        return cls(ratio, ratio)

    @property
    def is_fixed(self) -> bool:
        return self.min == self.init


SGLANG_RATIO = NewTokenRatio(0.7, 0.7 * 0.14, 600)

NAMED_RATIOS: dict[str, NewTokenRatio] = {"sglang": SGLANG_RATIO}
"""Schedules `--new-token-ratio` accepts by name (besides a number, which is a fixed ratio)."""


def parse_ratio(text: str) -> NewTokenRatio:
    """`--new-token-ratio`'s value: a name in `NAMED_RATIOS` or a fixed ratio in [0, 1]."""
    named = NAMED_RATIOS.get(text)
    if named is not None:
        return named
    try:
        return NewTokenRatio.fixed(float(text))
    except ValueError:
        raise ValueError(
            f"expected a ratio in [0, 1] or one of {sorted(NAMED_RATIOS)}, got {text!r}"
        ) from None


class RatioTracker:
    """The ratio's current value as the engine runs (SGLang's scheduler holds one)."""

    def __init__(self, schedule: NewTokenRatio) -> None:
        self.schedule = schedule
        self.current = schedule.init

    def decay_step(self) -> None:
        s = self.schedule
        self.current = max(self.current - (s.init - s.min) / s.decay_steps, s.min)

    def reset(self) -> None:
        self.current = self.schedule.init

    def after_retract(self, survivors: Sequence[ReqState]) -> None:
        """SGLang's `estimate_new_token_ratio_after_retract` over the requests left running."""
        if self.schedule.is_fixed:
            return
        decoded = sum(s.num_out for s in survivors)
        max_new = sum(s.spec.max_new for s in survivors)
        self.current = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(survivors)) / (max_new + 1))
