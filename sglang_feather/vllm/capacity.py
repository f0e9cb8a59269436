"""What vLLM's waiting loop will have left this step: tokens and KV blocks, for `Admission.select(fits=...)`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import vllm
from vllm.utils.math_utils import cdiv
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from sglang_feather.admission import KvHeadroom
from sglang_feather.types import RequestId
from sglang_feather.vllm.ids import vllm_request_id

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash

# How it works.
#
# vLLM first schedules its running requests, then admits waiting ones while the step's token budget lasts and
# `allocate_slots` finds KV blocks. Admission asks `fits(rid)` for each candidate it wants to add, in order,
# before vLLM runs; this class replays vLLM's arithmetic from outside: the token budget left after the running
# requests' next chunks, the free blocks left after their growth (less the watermark), and for each candidate
# the tokens and blocks it needs beyond its prefix-cache hit. The hit counts blocks already in vLLM's cache
# plus the full blocks that this step's running chunks and earlier admissions will fill: vLLM caches a block's
# hash when it allocates the block (`KVCacheManager.allocate_slots` -> `cache_blocks(request, computed + new
# tokens)`), before the forward pass computes it, and looks waiting requests up only after the running ones
# are allocated; so a second request of a cold group admitted in the same step, or in the next, hits the first
# one's prefix and vLLM computes it once. Blocks a running or admitted request will compute only in a later
# chunk (chunked prefill) are not counted: a request admitted now would compute those itself. The blocks that
# will be registered are also handed to `reserve` (the cache tier's, see `cache_tier.py`), so Admission's
# deferral of an in-flight prefix sees them too; where the tier is not fed, `cached_tokens` gives Admission
# the same hit instead. A blocked request (grammar still compiling) passes without a reservation: vLLM's loop
# skips it and goes on with the next. It is an estimate: vLLM still makes the real decision, and the adapter
# retracts a planned request that vLLM did not admit.


_CAP_ONLY_WHEN_CHUNKED = not vllm.__version__.startswith(("0.32.", "0.33."))
"""vLLM 0.34 applies long_prefill_token_threshold only with chunked prefill on (`Scheduler.schedule`)."""


class CapacityEstimate:
    def __init__(
        self, scheduler: Scheduler, reserve: Callable[[Sequence[BlockHash], int, int], None] | None = None
    ) -> None:
        self._scheduler = scheduler
        self._reserve = reserve
        self._block_size = scheduler.block_size
        self._pool = scheduler.kv_cache_manager.block_pool
        self._group_ids = list(range(len(scheduler.kv_cache_config.kv_cache_groups)))
        self.can_probe_cache = scheduler.hash_block_size == scheduler.block_size
        self._pending_hashes: set[BlockHash] = set()
        """Hashes of blocks vLLM will have cached (at allocation) before it looks the next candidate up."""
        num_eligible = len(scheduler.running) + len(scheduler.waiting)
        config = scheduler.scheduler_config
        capped = num_eligible > 1 and (config.enable_chunked_prefill or not _CAP_ONLY_WHEN_CHUNKED)
        self._long_prefill = config.long_prefill_token_threshold if capped else 0
        self._chunked_prefill = config.enable_chunked_prefill
        self.num_tokens_left = scheduler.max_num_scheduled_tokens
        self.num_blocks_left = self._pool.get_num_free_blocks() - scheduler.kv_cache_manager.watermark_blocks
        for request in scheduler.running:
            num_new = (
                request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            )
            num_new = min(self._cap(num_new), self.num_tokens_left)
            num_new = max(min(num_new, scheduler.max_model_len - request.num_computed_tokens - 1), 0)
            self.num_tokens_left -= num_new
            computed = request.num_computed_tokens
            self.num_blocks_left -= cdiv(computed + num_new, self._block_size) - cdiv(
                computed, self._block_size
            )
            self._will_register(
                request.block_hashes, computed // self._block_size, (computed + num_new) // self._block_size
            )

    def fits(self, request_id: RequestId) -> bool:
        """Whether vLLM can admit this waiting request after those that fitted before; reserves its share."""
        request = self._scheduler.requests[vllm_request_id(request_id)]
        if self.num_tokens_left <= 0:
            return False
        if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            return True  # blocked (e.g. grammar compiling): vLLM skips it unless it is ready by then
        num_hit_blocks = self._num_hit_blocks(request)
        num_new = request.num_tokens - num_hit_blocks * self._block_size
        if not self._chunked_prefill and num_new > self.num_tokens_left:
            return False
        num_scheduled = min(self._cap(num_new), self.num_tokens_left)
        num_covered = (
            request.num_tokens
            if self._scheduler.scheduler_reserve_full_isl
            else request.num_tokens - num_new + num_scheduled
        )
        num_blocks = cdiv(num_covered, self._block_size) - num_hit_blocks
        if num_blocks > self.num_blocks_left:
            return False
        self.num_tokens_left -= num_scheduled
        self.num_blocks_left -= num_blocks
        num_full_blocks = (request.num_tokens - num_new + num_scheduled) // self._block_size
        self._will_register(request.block_hashes, num_hit_blocks, num_full_blocks)
        return True

    def headroom(self) -> KvHeadroom:
        """The KV room vLLM can still give to admissions this step (free blocks, cached-but-free ones included,
        less the watermark, the running requests' growth and earlier admissions) over the pool's size."""
        total = self._pool.num_gpu_blocks * self._block_size
        return KvHeadroom(max(0, self.num_blocks_left) * self._block_size, total)

    def cached_tokens(self, request_id: RequestId) -> int:
        """The prompt prefix vLLM's prefix cache would give this waiting request if admitted next."""
        return self._num_hit_blocks(self._scheduler.requests[vllm_request_id(request_id)]) * self._block_size

    def _num_hit_blocks(self, request) -> int:
        """vLLM never matches a whole prompt: its last token is always computed (vLLM 0.34 also bounds the hit
        of a request with prompt logprobs or skip_reading_prefix_cache: `Request.get_max_cache_hit_length`)."""
        limit = getattr(request, "get_max_cache_hit_length", None)
        max_hit = limit() if limit is not None else request.num_tokens - 1
        return min(self._num_cached_blocks(request.block_hashes), max_hit // self._block_size)

    def _will_register(self, block_hashes: Sequence[BlockHash], start: int, end: int) -> None:
        """vLLM registers these blocks when it allocates them, before it looks the next candidate up (blocks
        before `start` are registered already)."""
        if start >= end:
            return
        self._pending_hashes.update(block_hashes[start:end])
        if self._reserve is not None:
            self._reserve(block_hashes, start, end)

    def _cap(self, num_tokens: int) -> int:
        return num_tokens if self._long_prefill <= 0 else min(num_tokens, self._long_prefill)

    def _num_cached_blocks(self, block_hashes: list[BlockHash]) -> int:
        if not self.can_probe_cache:
            return 0
        count = 0
        for block_hash in block_hashes:
            if (
                block_hash not in self._pending_hashes
                and self._pool.get_cached_block(block_hash, self._group_ids) is None
            ):
                break
            count += 1
        return count
