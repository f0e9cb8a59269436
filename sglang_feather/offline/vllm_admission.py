"""vLLM's FCFS, vLLM 0.34's cache-aware admission window and FeatherScheduler on the model-free harness."""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import vllm
from vllm.v1.core.sched.scheduler import Scheduler

from sglang_feather.offline.vllm_harness import (
    Driver,
    EngineShape,
    FakeClock,
    UnsupportedSchedulerOption,
    make_scheduler,
    vllm_config,
)
from sglang_feather.offline.vllm_inputs import STEP_S, TINY_VOCAB, ReplayRequest
from sglang_feather.offline.vllm_metrics import RunMeter, RunResult
from sglang_feather.vllm import FeatherScheduler
from sglang_feather.workload import Segment, concat_tokens

# How it works.
#
# Each policy is a scheduler class and the SchedulerConfig fields it sets; the window policies set vLLM 0.34's
# cache_aware_admission_window (16, or the workload's request count: wider than any queue it can build) and
# cache_aware_admission_threshold 0.5 and run vLLM's unmodified Scheduler, so `Scheduler.schedule` reorders
# the first N plain-waiting requests by their deepest cached prefix once the KV cache is at least half used.
# `run` replays a workload in steps: requests are added at their arrival step (a chat turn `delay_steps` after
# the previous turn finished), each step is one schedule() answered by the fake model runner, and idle
# stretches are skipped without a step. `cpu_per_step` keeps `num_waiting` requests queued behind a running batch that
# holds most of the KV pool and measures the steps' scheduler CPU.

WHOLE_QUEUE = -1
"""A window as wide as the queue: the workload's request count."""

THRESHOLD = 0.5
"""cache_aware_admission_threshold of the window policies (vLLM 0.34's default)."""


class PolicyUnavailable(RuntimeError):
    """The installed vLLM cannot run this policy (a window on a vLLM without cache-aware admission)."""


@dataclass(frozen=True)
class Policy:
    description: str
    scheduler_cls: Callable[[], type[Scheduler]]
    window: int = 0
    """cache_aware_admission_window; 0 leaves the field unset, WHOLE_QUEUE is the workload's request count."""

    def scheduler_options(self, num_requests: int) -> dict[str, Any]:
        if not self.window:
            return {}
        width = num_requests if self.window == WHOLE_QUEUE else self.window
        return {"cache_aware_admission_window": width, "cache_aware_admission_threshold": THRESHOLD}


POLICIES: dict[str, Policy] = {
    "vllm-fcfs": Policy("vLLM's Scheduler, arrival order (no cache-aware window)", lambda: Scheduler),
    "vllm-window16": Policy(
        "vLLM 0.34's Scheduler, cache_aware_admission_window 16, threshold 0.5", lambda: Scheduler, 16
    ),
    "vllm-window-all": Policy(
        "vLLM 0.34's Scheduler, cache_aware_admission_window = the workload's request count (as wide as the "
        "queue), threshold 0.5",
        lambda: Scheduler,
        WHOLE_QUEUE,
    ),
    "feather": Policy("FeatherScheduler, default options", lambda: FeatherScheduler),
}
"""Name -> policy; the window policies need vLLM 0.34 or later."""


def build(policy_name: str, shape: EngineShape, model_dir: Path | str, num_requests: int) -> Driver:
    """A driver on the policy's scheduler. PolicyUnavailable when the installed vLLM would not honour the
    window (no such SchedulerConfig field, or vLLM turned it off), so a window never silently runs FCFS."""
    policy = POLICIES[policy_name]
    options = policy.scheduler_options(num_requests)
    shape = replace(shape, scheduler_options=options)
    try:
        config = vllm_config(shape, model_dir)
    except UnsupportedSchedulerOption as err:
        raise PolicyUnavailable(
            f"policy {policy_name!r} needs vLLM 0.34's cache-aware admission: {err}"
        ) from None
    cls = policy.scheduler_cls()
    clock = FakeClock()
    kwargs = {"clock": clock} if issubclass(cls, FeatherScheduler) else {}
    scheduler = make_scheduler(cls, shape, config, **kwargs)
    window = getattr(scheduler, "cache_aware_window", 0)
    if window != options.get("cache_aware_admission_window", 0):
        raise PolicyUnavailable(
            f"policy {policy_name!r}: vLLM {vllm.__version__} runs with cache-aware window {window}, not {options}"
        )
    return Driver(scheduler, block_size=shape.block_size, clock=clock, step_s=STEP_S, keep_history=False)


def run(
    policy_name: str,
    requests: Sequence[ReplayRequest],
    engine: EngineShape,
    model_dir: Path | str,
    *,
    workload: str = "",
    seed: int = 0,
    max_steps: int = 50_000,
) -> RunResult:
    """Replay `requests` under the policy on `engine`; every request must finish within `max_steps` steps.
    `workload` and `seed` only label the result."""
    driver = build(policy_name, engine, model_dir, len(requests))
    meter = RunMeter(driver.scheduler, engine.block_size)
    driver.on_scheduled = meter.on_scheduled
    followers = {r.follows: r for r in requests if r.follows is not None}
    order = itertools.count()
    due = [(r.arrival_step, next(order), r) for r in requests if r.follows is None]
    heapq.heapify(due)
    num_finished = 0
    clock = driver.clock
    if clock is None:
        raise RuntimeError("the replay's driver keeps no clock")
    while due or driver.busy():
        if not driver.busy():
            meter.step = max(meter.step, due[0][0])
        while due and due[0][0] <= meter.step:
            request = heapq.heappop(due)[2]
            driver.add(request.rid, request.prompt_ids, request.max_tokens, output_ids=request.output_ids)
            meter.on_arrival(request.rid)
        if meter.step >= max_steps:
            raise RuntimeError(f"{policy_name} on {workload}: unfinished after {max_steps} steps")
        clock.now = 1000.0 + meter.step * STEP_S
        driver.step()
        meter.step += 1
        for request_id in itertools.islice(driver.finished, num_finished, None):
            follower = followers.get(request_id)
            if follower is not None:
                heapq.heappush(due, (meter.step + follower.delay_steps, next(order), follower))
        num_finished = len(driver.finished)
    return meter.result(policy_name, workload, seed, driver.cpu_ns)


@dataclass(frozen=True)
class CpuPerStep:
    """Scheduler CPU per step with `num_waiting` requests queued: the median of `repeats` runs' medians."""

    policy: str
    num_waiting: int
    cpu_per_step_us: float
    runs_us: tuple[float, ...]
    kv_usage: float
    """vLLM's KV-cache usage in the measured steps (the window engages at 0.5 and above)."""
    num_running: float
    """Running requests in the measured steps (the batch holds at most 32)."""


CPU_SHAPE = EngineShape(
    block_size=16, num_blocks=1024, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=2048
)
"""32 running requests of 34 blocks plus their outputs hold most of the 1024-block pool."""


def cpu_per_step(
    policy_name: str, num_waiting: int, model_dir: Path | str, repeats: int = 3, num_steps: int = 40
) -> CpuPerStep:
    """`num_steps` steps with the queue topped up to `num_waiting` before each, after 20 steps in which the
    batch fills up; requests in 64 groups of 512-token prefixes with a 32-token question and 400 output
    tokens. Median of `repeats` runs' per-step medians."""
    runs = [_cpu_run(policy_name, num_waiting, model_dir, num_steps) for _ in range(repeats)]
    medians = tuple(us for us, _, _ in runs)
    usage = statistics.fmean(u for _, u, _ in runs)
    running = statistics.fmean(n for _, _, n in runs)
    return CpuPerStep(policy_name, num_waiting, statistics.median(medians), medians, usage, running)


def _cpu_run(
    policy_name: str, num_waiting: int, model_dir: Path | str, num_steps: int
) -> tuple[float, float, float]:
    """One run's median scheduler CPU per step (µs), mean KV usage and mean running requests over the measured
    steps."""
    driver = build(policy_name, CPU_SHAPE, model_dir, num_waiting)
    added = itertools.count()
    usages, running = [], []
    for step in range(20 + num_steps):
        if step == 20:
            driver.cpu_ns.clear()
        while len(driver.scheduler.waiting) < num_waiting:
            i = next(added)
            segments = (Segment(f"cpu/g{i % 64}", 512), Segment(f"cpu/q{i}", 32))
            driver.add(f"r{i}", concat_tokens(segments, high=TINY_VOCAB).tolist(), max_tokens=400)
        driver.step()
        usages.append(driver.scheduler.kv_cache_manager.usage)
        running.append(len(driver.scheduler.running))
    return (
        statistics.median(driver.cpu_ns) / 1e3,
        statistics.fmean(usages[20:]),
        statistics.fmean(running[20:]),
    )
