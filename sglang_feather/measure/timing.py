"""Sampling with one garbage-collector discipline for both sides of every comparison."""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Spread:
    """Median and range of a cell's samples."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))


GC_POLICY = (
    "cyclic GC disabled inside every timed region on both sides; an untimed gc.collect() before every "
    "sample (and between the passes of a sequence); each cell's inputs are built, collected and "
    "gc.freeze()-d before timing, so collections only scan what the timed code allocated"
)


@dataclass(frozen=True)
class TimingConfig:
    repeat: int = 5
    """Fewest samples per measurement."""
    min_time_s: float = 0.3
    """Keep sampling until this much time was measured (capped by `max_samples`)."""
    max_samples: int = 50


@dataclass(frozen=True)
class Samples:
    median_s: float
    mean_s: float
    num_samples: int


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then move every live object out of the collector's sight for the duration.

    No collection on the way out: a full one costs about a second with SGLang and torch loaded, and the next
    `frozen_heap` or sample starts with one anyway."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def gc_disabled() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def sample(run: Callable[[], float], cfg: TimingConfig, reset: Callable[[], None] | None = None) -> Samples:
    """Call `run` (which returns the seconds it measured itself) until `cfg` is satisfied.

    `reset` restores the state `run` changed; it runs untimed after every sample.
    """
    return sample_named(lambda: {"run": run()}, cfg, reset)["run"]


def sample_named(
    run: Callable[[], Mapping[str, float]], cfg: TimingConfig, reset: Callable[[], None] | None = None
) -> dict[str, Samples]:
    """`sample` for a run that measures several things at once; the first one decides when to stop."""
    values: dict[str, list[float]] = {}
    with gc_disabled():
        while True:
            gc.collect()
            for name, seconds in run().items():
                values.setdefault(name, []).append(seconds)
            if reset is not None:
                reset()
            primary = next(iter(values.values()))
            if len(primary) >= cfg.max_samples or (
                len(primary) >= cfg.repeat and sum(primary) >= cfg.min_time_s
            ):
                break
    return {
        name: Samples(statistics.median(seq), statistics.fmean(seq), len(seq)) for name, seq in values.items()
    }


def median_run(run: Callable[[], T], seconds: Callable[[T], float], cfg: TimingConfig) -> tuple[T, int]:
    """Repeat a run that times itself (up to `cfg.repeat` times, until `cfg.min_time_s` was measured).

    Returns the run whose `seconds` is the median, and how many runs there were.
    """
    results: list[T] = []
    while len(results) < cfg.repeat and (not results or sum(map(seconds, results)) < cfg.min_time_s):
        results.append(run())
    results.sort(key=seconds)
    return results[len(results) // 2], len(results)


def timing_from_args(timing: TimingConfig, args) -> TimingConfig:
    """`timing` with the CLI's `--repeat` / `--min-time` applied where given."""
    return replace(
        timing,
        repeat=args.repeat or timing.repeat,
        min_time_s=args.min_time if args.min_time is not None else timing.min_time_s,
    )
