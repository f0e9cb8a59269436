"""FeatherScheduler: vLLM v1's Scheduler whose admissions come from Feather (CHT order + stopping policy)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from sglang_feather.admission import Admission
from sglang_feather.types import RequestId
from sglang_feather.vllm.cache_tier import CacheFeed, unfed_reason
from sglang_feather.vllm.capacity import CapacityEstimate
from sglang_feather.vllm.config import admission_config, check_supported, check_vllm_version, state_tag
from sglang_feather.vllm.hashes import request_chunk_hashes
from sglang_feather.vllm.ids import vllm_request_id

logger = init_logger("vllm.feather")
"""Under vLLM's logger tree, so the line shows in vLLM's own log output."""

# How it works.
#
# Every request vLLM accepts is also enqueued in Feather's Admission, keyed by vLLM's own chained block
# hashes (one CHT chunk per full KV block; no second hashing pass). Each schedule() asks Admission for this
# step's admissions: candidates best-first by the CHT (the deepest prefix a running request or vLLM's prefix
# cache already holds), while the stopping policy says "add" and `CapacityEstimate` says vLLM can still take
# them. Only those requests are left in `self.waiting`, in that order, while vLLM's own schedule() runs, so
# vLLM's unchanged loop does the block allocation, chunked prefill and preemption; the others are put back
# behind them afterwards. vLLM's events then drive the CHT: a planned request vLLM did not admit and every
# preempted request is retracted (back to waiting), finished and aborted requests leave. What vLLM's prefix
# cache holds reaches Admission's cache tier from the block pool's own calls (`CacheFeed`, `cache_tier.py`),
# plus the blocks this step will register before vLLM looks a candidate up (reserved by `CapacityEstimate`,
# settled after vLLM's schedule()); the tier also answers the deferral of an in-flight prefix, with no cache
# lookup per candidate. Where the tier cannot equal vLLM's prefix match (`unfed_reason`), each pass passes
# vLLM's hit (`CapacityEstimate.cached_tokens`) for the deferral instead. The stopper's reward window is
# Admission's own: update_from_output reports each finished step, a decode step with its sampled tokens
# (`on_decode_step`), a step that computed prompt tokens without them (`on_prefill_step`), and an emptied
# batch (`on_batch_drained`); Admission opens and closes the windows at its decisions. With the tier fed, each
# schedule() first moves the cached prefixes Admission names from the queue's head to the end of vLLM's free
# queue (its LRU), so what the queue waits for is evicted last.


class FeatherScheduler(Scheduler):
    """Use with `--scheduler-cls sglang_feather.vllm.FeatherScheduler --enable-prefix-caching`; options from
    `--additional-config '{"feather": {...}}'` (see docs/vllm.md)."""

    def __init__(
        self, vllm_config: Any, *args: Any, clock: Callable[[], float] = time.monotonic, **kwargs: Any
    ):
        check_vllm_version(vllm.__version__)
        check_supported(vllm_config)
        super().__init__(vllm_config, *args, **kwargs)
        if not isinstance(self.waiting, FCFSRequestQueue):
            raise TypeError(
                f"FeatherScheduler needs vLLM's FCFS waiting queue, got {type(self.waiting).__name__}"
            )
        unfed = unfed_reason(self)
        config = admission_config(
            vllm_config.additional_config,
            chunk_size=self.hash_block_size,
            page_size=self.block_size,
            state_tag=state_tag(vllm_config),
            can_probe_cache=self.hash_block_size == self.block_size,
            cache_events=unfed is None,
        )
        self.admission = Admission.from_config(config, clock=clock)
        self.cache_feed = (
            CacheFeed(self.admission, self.kv_cache_manager.block_pool) if unfed is None else None
        )
        """Keeps Admission's cache tier equal to vLLM's prefix cache; None where it cannot (`unfed_reason`)."""
        logger.info(
            "FeatherScheduler: chunk = block = %d tokens, stopper %s, max_wait_s %s, cache tier %s",
            self.admission.chunk_size,
            self.admission.stopper.name,
            self.admission.guard.max_wait_s,
            "fed by the block pool" if unfed is None else f"off ({unfed})",
        )

    # ------------------------------------------------------------------ requests in and out

    def add_request(self, request: Request) -> None:
        if request.resumable:
            raise ValueError(
                f"request {request.request_id!r} is a streaming-input (resumable) session; FeatherScheduler does "
                "not support those: their prompt grows while they wait, which the CHT cannot follow"
            )
        request_id = request.request_id
        self.admission.enqueue(request_id, hashes=request_chunk_hashes(request_id, request.block_hashes))
        try:
            super().add_request(request)
        except BaseException:
            self.admission.abort(request_id)
            raise

    def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
        super()._preempt_request(request, timestamp, drop_stale_output)
        self.admission.retract(request.request_id)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        result = super()._free_request(request, delay_free_blocks)
        self.admission.leave(request.request_id)
        return result

    # ------------------------------------------------------------------ one step

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if self.pause_state is not PauseState.UNPAUSED:
            return super().schedule(throttle_prefills)  # vLLM admits no waiting request while paused
        feed = self.cache_feed
        if feed is not None:  # the waiting queue's cached prefixes stay fresh in vLLM's LRU (`refresh.py`)
            queue_ids = (request.request_id for request in self.waiting)
            for request_id in self.admission.prefixes_to_refresh(queue_ids):
                feed.refresh(self.requests[vllm_request_id(request_id)].block_hashes)
        estimate = CapacityEstimate(self, reserve=feed.reserve if feed is not None else None)
        plan = self.admission.select(
            len(self.running),
            max_requests=self._num_free_slots(),
            fits=estimate.fits,
            cached_tokens=estimate.cached_tokens if feed is None else None,
            headroom=estimate.headroom,
        )
        held = self._keep_only(plan.admitted)
        try:
            output = super().schedule(throttle_prefills)
        finally:
            self._fcfs_waiting().extend(held)
            if feed is not None:
                feed.settle()
        for request_id in plan.admitted:
            if self.requests[vllm_request_id(request_id)].status is not RequestStatus.RUNNING:
                self.admission.retract(request_id)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Any:
        computed_prefill = _computed_prefill(scheduler_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if computed_prefill:
            self.admission.on_prefill_step()
        else:
            self.admission.on_decode_step(sum(map(len, model_runner_output.sampled_token_ids)))
        if not self.running:
            self.admission.on_batch_drained()
        return outputs

    def shutdown(self) -> None:
        self.admission.save_state()
        stats = self.admission.stats
        logger.info(
            "FeatherScheduler: %d admitted (%d by the aging bound), %d stops, %d reward windows, %d cache events",
            stats.num_admitted,
            stats.num_aged,
            stats.num_stops,
            stats.num_windows,
            stats.num_cache_events,
        )
        super().shutdown()

    # ------------------------------------------------------------------ internals

    def _num_free_slots(self) -> int:
        return max(self.max_num_active_reqs - len(self.running) - self.num_waiting_for_streaming_input, 0)

    def _keep_only(self, admitted: Sequence[RequestId]) -> list[Request]:
        """Leave just the admitted requests in `self.waiting`, in admission order; return the others in order."""
        rank = {request_id: i for i, request_id in enumerate(admitted)}
        chosen = sorted((r for r in self.waiting if r.request_id in rank), key=lambda r: rank[r.request_id])
        held = [r for r in self.waiting if r.request_id not in rank]
        waiting = self._fcfs_waiting()
        waiting.clear()
        waiting.extend(chosen)
        return held

    def _fcfs_waiting(self) -> FCFSRequestQueue:
        """vLLM's waiting queue, the FCFS deque the adapter runs on (the constructor refuses any other)."""
        if not isinstance(self.waiting, FCFSRequestQueue):
            raise TypeError(f"FeatherScheduler runs on vLLM's FCFS queue, not {type(self.waiting).__name__}")
        return self.waiting


def _computed_prefill(output: SchedulerOutput) -> bool:
    """The step computed prompt tokens: some request ran more tokens than one plus its speculative drafts."""
    drafts = output.scheduled_spec_decode_tokens
    return any(n > 1 + len(drafts.get(rid, ())) for rid, n in output.num_scheduled_tokens.items())
