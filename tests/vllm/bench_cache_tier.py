"""What the cache tier's feed costs FeatherScheduler.schedule(), on the model-free harness (docs/vllm.md).

Run: `.venv-vllm/bin/python tests/vllm/bench_cache_tier.py` (from the repository root)."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_harness import Driver, EngineShape, make_scheduler, prompt  # noqa: E402

import sglang_feather.vllm.scheduler as scheduler_module  # noqa: E402
from sglang_feather.vllm import FeatherScheduler  # noqa: E402
from sglang_feather.vllm.cache_tier import unfed_reason  # noqa: E402

SHAPE = EngineShape(
    num_blocks=1200,
    max_num_seqs=32,
    max_num_batched_tokens=2048,
    max_model_len=1024,
    feather={"stopper": "ucb"},
)


def timed(owner, name: str, totals: dict[str, float], key: str) -> None:
    """Add the seconds spent in `owner.name` to `totals[key]`."""
    inner = getattr(owner, name)
    totals[key] = 0.0

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def run(fed: bool, seed: int) -> tuple[int, float, float]:
    """400 requests in 16 groups with 40-block prefixes, the feed on or off (then Admission asks vLLM's cache
    per candidate); returns steps, seconds in schedule() and seconds of the feed's own work."""
    scheduler_module.unfed_reason = unfed_reason if fed else (lambda scheduler: "off for the benchmark")
    driver = Driver(make_scheduler(FeatherScheduler, SHAPE), block_size=SHAPE.block_size)
    scheduler = driver.scheduler
    totals: dict[str, float] = {}
    timed(scheduler, "schedule", totals, "schedule")
    feed = scheduler.cache_feed
    if feed is not None:
        pool = scheduler.kv_cache_manager.block_pool
        timed(pool, "cache_full_blocks", totals, "stores")
        timed(pool, "_remove_cached_block_hashes", totals, "removals")
        timed(feed, "_cache_full_blocks", totals, "vllm stores")
        timed(feed, "_remove_cached_block_hashes", totals, "vllm removals")
        timed(feed, "reserve", totals, "reserve")
        timed(feed, "settle", totals, "settle")
    rng = random.Random(seed)
    for i in range(400):
        tokens = prompt(rng.randrange(16), 40, i, rng.randrange(5, 60))
        driver.add(f"r{i}", tokens, max_tokens=rng.randrange(4, 40))
    driver.run(100_000)
    own = 0.0
    if feed is not None:
        own = totals["stores"] - totals["vllm stores"] + totals["removals"] - totals["vllm removals"]
        own += totals["reserve"] + totals["settle"]
    return len(driver.history), totals["schedule"], own


def main() -> None:
    print("seed  feed    steps  schedule() ms  feed's own us/step  share")
    for _ in range(3):
        for seed in (1, 2):
            for fed in (True, False):
                steps, schedule_s, own_s = run(fed, seed)
                own = f"{own_s / steps * 1e6:18.0f}  {own_s / schedule_s:5.1%}" if fed else ""
                print(
                    f"{seed:4}  {'tier' if fed else 'lookup':6}  {steps:5}  {schedule_s * 1e3:13.0f}  {own}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
