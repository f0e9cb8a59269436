"""A scheduler's queues driven through Feather's plugin hooks on real CPU SGLang objects (benchmarks, soak)."""

from __future__ import annotations

import time
from array import array
from collections.abc import Collection
from dataclasses import dataclass
from types import SimpleNamespace

from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, NextBatchPlan, Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_feather.offline import bench_baseline
from sglang_feather.offline.sglang_objects import (
    cpu_server_args,
    default_max_prefill_tokens,
    make_allocator,
    make_radix_cache,
)
from sglang_feather.sglang import plugin
from sglang_feather.sglang.options import FEATHER, FeatherOptions, attach
from sglang_feather.sglang.policy import FeatherSchedulePolicy

# How it works.
#
# `AdapterHarness` stands in for SGLang's `Scheduler` and nothing else: its queues are SGLang's own
# (`waiting_queue`, a real `ScheduleBatch` as the running batch), its prefix cache the one a server builds
# (`UnifiedRadixCache` on SGLang's Rust radix tree, its KV-event recorder on for `feather` as the plugin turns it on)
# with a real token allocator, its requests real `Req`s, and every
# call into Feather goes through the function the plugin registers for that SGLang method (`plugin.HOOKS`),
# called with the arguments SGLang's wrapper passes: `_add_request_to_queue` for arrivals and retractions,
# `init_schedule_policy` at startup, `get_prefill_adder_class` and `get_next_batch_to_run` around each pass,
# `merge_batch` when a prefill batch joins the running batch, `release_kv_cache` for finishes and
# `_release_aborted_request` for aborts. A pass is the heart of `Scheduler._get_new_batch_prefill_raw`:
# `calc_priority`, the real `PrefillAdder` (Feather's subclass for `feather`) walking the waiting list until
# it stops, the waiting list rebuilt without the admitted requests. The model is absent (CPU): admitted
# requests get no KV slots (only the cached prompts hold some), a decode step appends one token to every
# running request, and the bodies of the wrapped SGLang methods that need KV pools are not run — only their
# queue effects and Feather's hooks. Any SGLang policy name runs the same pass with SGLang's own
# `SchedulePolicy` and `PrefillAdder` and no hooks, for side-by-side timing.

NEW_TOKEN_RATIO = 0.7
"""SGLang 0.5.23's initial `new_token_ratio` (`SGLANG_INIT_NEW_TOKEN_RATIO` default): the decode reservation
the adder charges per running request."""


def sglang_policy_class() -> type:
    """SGLang's own `SchedulePolicy` (the plugin may have rebound the module attribute to Feather's)."""
    return FeatherSchedulePolicy.__bases__[0]


class _SchedulerView(SimpleNamespace):
    """The attributes of SGLang's `Scheduler` that Feather's hooks read (weak-referenceable, as a Scheduler)."""


@dataclass(frozen=True)
class PassResult:
    admitted: tuple[Req, ...]
    calc_priority_s: float
    """`policy.calc_priority(waiting_queue, running_batch)` alone."""
    pass_s: float
    """The whole pass: calc_priority, the adder loop, the queue update, Feather's end-of-step hook."""
    adapter_s: float | None
    """Feather's own share of the pass (`FeatherRuntime.last_step_s`, what `feather_step_seconds` reports);
    None for SGLang's policies."""


class AdapterHarness:
    def __init__(
        self,
        policy: str,
        *,
        options: FeatherOptions | None = None,
        cached: tuple[array, ...] = (),
        allocator_size: int = 1 << 23,
    ) -> None:
        bench_baseline.prepare()
        server_args = cpu_server_args()
        self.is_feather = policy == FEATHER
        self.cache = make_radix_cache(
            cached, allocator=make_allocator(allocator_size), kv_events=self.is_feather
        )
        self.allocator = self.cache.token_to_kv_pool_allocator
        self.max_prefill_tokens = default_max_prefill_tokens()
        self.max_running_requests = 1 << 20
        policy_cls = FeatherSchedulePolicy if self.is_feather else sglang_policy_class()
        self.scheduler = _SchedulerView(
            server_args=server_args,
            policy=policy_cls(policy, self.cache, False, False, False),
            waiting_queue=[],
            chunked_req=None,
            running_batch=ScheduleBatch(reqs=[], batch_is_full=False),
            metrics_collector_context=None,
            max_prefill_tokens=self.max_prefill_tokens,
            chunked_prefill_size=None,  # the adder below runs with no chunked prefill
        )
        if self.is_feather:
            attach(server_args, options or FeatherOptions())
            plugin._after_init_schedule_policy(None, self.scheduler)

    @property
    def runtime(self):
        return self.scheduler.policy.feather

    @property
    def waiting(self) -> list[Req]:
        return self.scheduler.waiting_queue

    @property
    def running(self) -> list[Req]:
        return self.scheduler.running_batch.reqs

    # ------------------------------------------------------------ events

    def arrive(self, req: Req) -> None:
        """`Scheduler._add_request_to_queue`: a new request, or a retracted one, joins the waiting queue."""
        self.scheduler.waiting_queue.append(req)
        if self.is_feather:
            plugin._after_add_request_to_queue(None, self.scheduler, req)

    def retract(self, req: Req) -> None:
        """`ScheduleBatch.retract_decode` then `_add_request_to_queue(req, is_retracted=True)`."""
        self.running.remove(req)
        self._released(req)
        req.reset_for_retract()
        self.arrive(req)

    def finish(self, req: Req) -> None:
        """A running request reached its length limit; `release_kv_cache` sees it finished."""
        req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
        self.running.remove(req)
        self._released(req)

    def abort_waiting(self, req: Req) -> None:
        """`Scheduler.abort_request` for a waiting request: out of the queue, then `_release_aborted_request`."""
        self.scheduler.waiting_queue.remove(req)
        req.finished_reason = FINISH_ABORT()
        if self.is_feather:
            plugin._after_release_aborted_request(None, self.scheduler, req)

    def _released(self, req: Req) -> None:
        if self.is_feather:
            plugin._after_release_kv_cache(None, req, self.cache, checkpoint=req.finished())

    # ------------------------------------------------------------ scheduler steps

    def prefill_pass(self, passes_over: Collection[str] = ()) -> PassResult:
        """One `_get_new_batch_prefill_raw` (no chunked request: SGLang's CPU default has no chunked prefill);
        its loop passes over the requests whose rid is in `passes_over` without asking the adder, as SGLang's
        does for a LoRA adapter that cannot load or a storage prefetch still running."""
        scheduler = self.scheduler
        running = scheduler.running_batch
        t0 = time.perf_counter()
        scheduler.policy.calc_priority(scheduler.waiting_queue, running)
        t1 = time.perf_counter()
        adder_cls: type = PrefillAdder  # the hook returns a class (SGLang's, or Feather's subclass of it)
        if self.is_feather:
            adder_cls = plugin._after_get_prefill_adder_class(PrefillAdder, scheduler)
        adder = adder_cls(
            1,
            self.cache,
            self.allocator,
            running,
            NEW_TOKEN_RATIO,
            self.max_prefill_tokens,
            None,
            max_running_requests=self.max_running_requests,
            waiting_queue_len=len(scheduler.waiting_queue),
        )
        for req in scheduler.waiting_queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            if len(running.reqs) + len(adder.can_run_list) >= self.max_running_requests:
                break
            if req.rid in passes_over:
                continue
            req.init_next_round_input(self.cache)
            if (
                adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                != AddReqResult.CONTINUE
            ):
                break
        admitted = tuple(adder.can_run_list)
        batch = None
        if admitted:
            chosen = set(admitted)
            scheduler.waiting_queue = [req for req in scheduler.waiting_queue if req not in chosen]
            batch = ScheduleBatch(reqs=list(admitted), batch_is_full=False)
            batch.forward_mode = ForwardMode.EXTEND
        if self.is_feather:
            plugin._after_get_next_batch_to_run(
                NextBatchPlan(batch_to_run=batch, running_batch=running), scheduler, running, None
            )
        t2 = time.perf_counter()
        return PassResult(admitted, t1 - t0, t2 - t0, self.runtime.last_step_s if self.is_feather else None)

    def merge(self, reqs: tuple[Req, ...]) -> None:
        """The next step's `merge_batch`: the admitted prefill batch joins the running batch."""
        running = self.scheduler.running_batch
        running.reqs.extend(reqs)
        if self.is_feather:
            plugin._after_merge_batch(None, running, ScheduleBatch(reqs=list(reqs), batch_is_full=False))

    def decode_step(self, token: int = 7) -> float:
        """One decode step of the running batch; returns the seconds spent in Feather's end-of-step hook."""
        running = self.scheduler.running_batch
        for req in running.reqs:
            req.output_ids.append(token)
        return self.step_end_hook()

    def step_end_hook(self) -> float:
        """`get_next_batch_to_run` returning a decode step of the running batch: Feather's hook, timed."""
        running = self.scheduler.running_batch
        running.forward_mode = ForwardMode.DECODE
        plan = NextBatchPlan(batch_to_run=running if running.reqs else None, running_batch=running)
        t0 = time.perf_counter()
        if self.is_feather:
            plugin._after_get_next_batch_to_run(plan, self.scheduler, running, None)
        return time.perf_counter() - t0

    def self_check(self) -> float:
        """The periodic full reconcile with SGLang's queues (every `SELF_CHECK_INTERVAL_S`), timed."""
        running = self.scheduler.running_batch
        plan = NextBatchPlan(batch_to_run=None, running_batch=running)
        t0 = time.perf_counter()
        self.runtime._self_check(self.scheduler, plan)
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.is_feather:
            self.runtime.close()

    def tracked(self) -> dict[str, int]:
        """Feather's internal index sizes (all zero once every request finished or was aborted)."""
        runtime = self.runtime
        tree = runtime.admission.tree
        admission = runtime.admission
        return {
            "mirror": len(runtime.mirror),
            "mirror_in_order": runtime.mirror.num_in_order,
            "tree_requests": len(tree),
            "tree_waiting": tree.num_waiting,
            "tree_active": tree.num_active,
            "tree_suspended": tree.num_suspended,
            "tree_nodes": tree.num_nodes,
            "tree_index_entries": tree.num_index_entries,
            **admission.index_sizes(),
        }
