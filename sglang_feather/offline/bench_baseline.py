"""SGLang 0.5.23's own `SchedulePolicy.calc_priority` on real `Req` objects and tree cache (benchmark side)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from sglang_feather.measure.sequence import SequencePlan
from sglang_feather.measure.timing import Samples, TimingConfig, gc_disabled, sample
from sglang_feather.measure.workloads import Workload
from sglang_feather.offline.sglang_objects import (
    UNIFIED,
    cache_prompt,
    default_max_prefill_tokens,
    describe_tree_cache,
    make_radix_cache,
    make_req,
    publish_cpu_context,
    quiet_sglang,
)

with quiet_sglang():
    import torch
    from sglang.srt.managers import schedule_policy
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

POLICIES = ("lpm", "dfs-weight")
MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class PolicyTiming:
    policy: str
    active_policy: str
    """What `calc_priority` really ran: LPM turns into FCFS above `prefix_match_cap()` waiting requests."""
    samples: Samples
    order: tuple[int, ...]
    """Request indices in the order the last timed call left the queue."""


@dataclass(frozen=True)
class SequenceTiming:
    policy: str
    total_s: float
    num_passes: int
    num_admitted: int
    num_fcfs_passes: int


@dataclass
class BaselineQueue:
    workload: Workload
    cache: BasePrefixCache
    reqs: list[Req]


def prepare() -> dict[str, str]:
    """Publish the minimal CPU runtime config `calc_priority` reads (once per process); return versions."""
    import sglang

    publish_cpu_context(role="test")
    torch.set_num_threads(1)
    return {"sglang": sglang.__version__, "torch": torch.__version__}


def tree_cache(kind: str = UNIFIED) -> str:
    """The SGLang tree cache the policies run on: its class and SGLang's radix tree under it, as `make_radix_cache` builds it."""
    return describe_tree_cache(make_radix_cache(kind=kind))


def prefill_token_budget() -> int:
    """The token budget of one pass (`default_max_prefill_tokens`)."""
    return default_max_prefill_tokens()


def prefix_match_cap() -> int:
    return schedule_policy.WAITING_QUEUE_PREFIX_MATCH_MAX


def make_reqs(workload: Workload) -> list[Req]:
    return [
        make_req(str(i), prompt, max_new_tokens=MAX_NEW_TOKENS) for i, prompt in enumerate(workload.prompts)
    ]


def build_queue(workload: Workload, kind: str = UNIFIED) -> BaselineQueue:
    """The queue in arrival order and a tree cache of `kind` holding the workload's cached sequences."""
    return BaselineQueue(workload, make_radix_cache(workload.cached, kind=kind), make_reqs(workload))


def sorted_order(queue: BaselineQueue, policy: str) -> list[int]:
    """Request indices in the order one `calc_priority` call sorts the queue (arrival order in)."""
    waiting = list(queue.reqs)
    SchedulePolicy(policy, queue.cache, False, False, False).calc_priority(waiting)
    return [int(r.rid) for r in waiting]


def time_calc_priority(queue: BaselineQueue, policy: str, cfg: TimingConfig) -> PolicyTiming:
    """Median cost of one `calc_priority` call on a fresh copy of the queue in arrival order."""
    sched_policy = SchedulePolicy(policy, queue.cache, False, False, False)
    sched_policy.calc_priority(list(queue.reqs))  # warm-up: the first match splits radix nodes
    last: list[Req] = []

    def run() -> float:
        nonlocal last
        last = list(queue.reqs)
        start = time.perf_counter()
        sched_policy.calc_priority(last)
        return time.perf_counter() - start

    samples = sample(run, cfg)
    active = sched_policy._determine_active_policy(queue.reqs).value
    return PolicyTiming(policy, active, samples, tuple(int(r.rid) for r in last))


def run_sequence(workload: Workload, policy: str, plan: SequencePlan, kind: str = UNIFIED) -> SequenceTiming:
    """All `calc_priority` time while the queue drains `plan.num_per_pass` requests per pass.

    As in SGLang's scheduler the queue stays in the order the last call left it and admitted requests
    leave it; their prompts then enter the tree cache (untimed: prefill does that under any policy), whose
    allocator has room for every prompt, so nothing is evicted.
    """
    num_kv_tokens = sum(map(len, workload.cached)) + sum(map(len, workload.prompts))
    cache = make_radix_cache(workload.cached, kind=kind, num_kv_tokens=num_kv_tokens)
    waiting = make_reqs(workload)
    sched_policy = SchedulePolicy(policy, cache, False, False, False)
    total_s = 0.0
    num_passes = num_admitted = num_fcfs = 0
    with gc_disabled():
        while waiting and (plan.max_passes is None or num_passes < plan.max_passes):
            gc.collect()
            if sched_policy._determine_active_policy(waiting).value == "fcfs":
                num_fcfs += 1
            start = time.perf_counter()
            sched_policy.calc_priority(waiting)
            total_s += time.perf_counter() - start
            admitted, waiting[:] = waiting[: plan.num_per_pass], waiting[plan.num_per_pass :]
            for req in admitted:
                cache_prompt(cache, req.origin_input_ids)
            num_passes += 1
            num_admitted += len(admitted)
    return SequenceTiming(policy, total_s, num_passes, num_admitted, num_fcfs)
