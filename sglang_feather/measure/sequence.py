"""The shape of a scheduling sequence: how many requests each pass admits and when they finish."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequencePlan:
    """All W requests arrive before the first pass; each pass admits up to `num_per_pass` of them.

    A request admitted in pass p finishes right before pass p + `finish_after_passes`. The sequence ends
    when the queue is drained or after `max_passes` passes (None: drain).
    """

    num_per_pass: int = 32
    finish_after_passes: int = 2
    max_passes: int | None = None

    def __post_init__(self) -> None:
        if self.num_per_pass < 1 or self.finish_after_passes < 1:
            raise ValueError(f"num_per_pass and finish_after_passes must be >= 1: {self}")
        if self.max_passes is not None and self.max_passes < 1:
            raise ValueError(f"max_passes must be >= 1 or None: {self}")
