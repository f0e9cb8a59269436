"""The KV token pool and one pass of SGLang's PrefillAdder budgets, as offered to a policy."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from sglang_feather.admission import KvHeadroom
from sglang_feather.sim.metrics import RunLog
from sglang_feather.sim.prefix_cache import CacheFull, PrefixCache
from sglang_feather.sim.requests import Phase, ReqState

CLIP_MAX_NEW_TOKENS = 4096
"""SGLang's cap on the output tokens reserved per request (schedule_policy.CLIP_MAX_NEW_TOKENS)."""


@dataclass
class KVPool:
    """KV slots in tokens: the prefix cache's blocks plus the tokens running requests hold privately."""

    capacity: int
    cache: PrefixCache
    num_private: int = 0
    max_used: int = 0

    @property
    def free(self) -> int:
        return self.capacity - self.cache.num_tokens - self.num_private

    def fits(self, num_tokens: int) -> bool:
        return self.free + self.cache.num_evictable >= num_tokens

    def _make_room(self, num_tokens: int) -> None:
        if self.free < num_tokens:
            self.cache.evict(num_tokens - self.free)
        if self.free < num_tokens:
            raise CacheFull(f"KV pool: need {num_tokens} tokens, {self.free} free after eviction")

    def alloc(self, s: ReqState, num_tokens: int) -> None:
        self._make_room(num_tokens)
        s.num_private += num_tokens
        self.num_private += num_tokens
        self.max_used = max(self.max_used, self.capacity - self.free)

    def alloc_decode(self, running: Sequence[ReqState]) -> None:
        self._make_room(len(running))
        for s in running:
            s.num_private += 1
        self.num_private += len(running)
        self.max_used = max(self.max_used, self.capacity - self.free)

    def release(self, s: ReqState, num_tokens: int) -> None:
        if not 0 <= num_tokens <= s.num_private:
            raise RuntimeError(f"{s.rid}: release of {num_tokens} KV tokens, holds {s.num_private}")
        s.num_private -= num_tokens
        self.num_private -= num_tokens

    def insert(self, hashes: Sequence[int], ends: Sequence[int], tokens: np.ndarray) -> None:
        self.cache.insert(hashes, ends, tokens, self.free)
        self.max_used = max(self.max_used, self.capacity - self.free)

    def insert_best_effort(self, hashes: Sequence[int], ends: Sequence[int], tokens: np.ndarray) -> None:
        """Cache a finished sequence if there is room (SGLang frees the request's KV into the tree)."""
        try:
            self.insert(hashes, ends, tokens)
        except CacheFull:
            return


@dataclass(frozen=True)
class PassLimits:
    """SGLang's per-pass limits, from the server arguments the engine models."""

    max_running_requests: int
    max_prefill_tokens: int
    chunked_prefill_size: int | None


@dataclass
class PassBudget:
    """One scheduling pass: budgets left, what was admitted, and the engine time spent inside `try_admit`.

    It reads and changes only what it is given: the KV pool, the waiting requests (an admitted one leaves
    them), the run log's cache hit and miss counts; `batch_full` and `chunked` tell the engine what the pass
    found: a full batch, a request admitted in part."""

    pool: KVPool
    waiting: dict[str, ReqState]
    log: RunLog
    now: float
    max_running_requests: int
    num_running_before: int
    """Requests running when the pass opened (the running batch does not change during a pass)."""
    offset: float
    """Tokens promised but not yet allocated: running requests' remaining outputs, admitted ones' outputs."""
    rem_input: int
    rem_chunk: int | None
    items: list[tuple[ReqState, int]] = field(default_factory=list)
    admitted: list[tuple[ReqState, int]] = field(default_factory=list)
    engine_s: float = 0.0
    stopped: bool = False
    batch_full: bool = False
    carried: ReqState | None = None
    """The chunked prefill this pass continues (admitted in an earlier pass)."""
    chunked: ReqState | None = None
    """The request this pass admitted only in part: the engine's next chunked prefill."""

    @classmethod
    def open(
        cls,
        limits: PassLimits,
        pool: KVPool,
        waiting: dict[str, ReqState],
        running: Sequence[ReqState],
        chunked: ReqState | None,
        ratio: float,
        log: RunLog,
        now: float,
    ) -> PassBudget:
        reserve = sum(min(s.remaining_out, CLIP_MAX_NEW_TOKENS) for s in running) * ratio
        b = cls(
            pool,
            waiting,
            log,
            now,
            limits.max_running_requests,
            len(running),
            reserve,
            limits.max_prefill_tokens,
            limits.chunked_prefill_size,
        )
        s = chunked
        if s is not None:
            left = s.fill_len - s.num_filled
            n = left if b.rem_chunk is None else min(left, b.rem_chunk)
            pool.alloc(s, n)
            b.carried = s
            b.items.append((s, n))
            b.offset += left - n + min(s.remaining_out, CLIP_MAX_NEW_TOKENS)
            b.rem_input -= n
            if b.rem_chunk is not None:
                b.rem_chunk -= n
        return b

    @property
    def remaining_total(self) -> float:
        """SGLang's `rem_total_tokens`: free plus evictable KV less what admitted and running requests hold."""
        pool = self.pool
        return pool.free + pool.cache.num_evictable - self.offset

    @property
    def num_running(self) -> int:
        """Requests in the batch: running, admitted in this pass, and a chunked prefill still in progress."""
        return self.num_running_before + len(self.admitted) + (self.carried is not None)

    def kv_headroom(self) -> KvHeadroom:
        return KvHeadroom(max(0, int(self.remaining_total)), self.pool.capacity)

    def refresh_prefixes(self, rids: Sequence[str]) -> None:
        self.pool.cache.touch_paths([self.waiting[rid].hashes for rid in rids])

    def waiting_ids(self) -> Iterator[str]:
        return iter(self.waiting)

    def slots_left(self) -> int:
        return self.max_running_requests - self.num_running

    def try_admit(self, rid: str) -> bool:
        t0 = time.perf_counter()
        try:
            return self._admit(rid)
        finally:
            self.engine_s += time.perf_counter() - t0

    def _stop(self, batch_full: bool) -> bool:
        self.stopped = True
        if batch_full:
            self.batch_full = True
        return False

    def num_cached_tokens(self, rid: str) -> int:
        s = self.waiting[rid]
        nblocks = self.pool.cache.match(s.hashes)
        return s.ends[nblocks - 1] if nblocks else 0

    def _admit(self, rid: str) -> bool:
        s = self.waiting.get(rid)
        if s is None:
            raise KeyError(f"request {rid!r} is not waiting")
        if self.stopped:
            return False
        if self.remaining_total <= 0:
            return self._stop(bool(self.admitted) or self.num_running_before > 0)
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return self._stop(False)
        if self.slots_left() <= 0:
            return self._stop(True)
        cache = self.pool.cache
        nblocks = cache.match(s.hashes)
        if nblocks == len(s.hashes) and s.num_out == 0:
            nblocks -= 1
        prefix = s.ends[nblocks - 1] if nblocks else 0
        fill = s.prompt_len + s.num_out
        extend = fill - prefix
        max_new = min(s.remaining_out, CLIP_MAX_NEW_TOKENS)
        locked = list(s.hashes[:nblocks])
        cache.lock(locked)
        if extend + max_new >= self.remaining_total:
            cache.unlock(locked)
            return self._stop(bool(self.admitted) or self.num_running_before > 0)
        if self.rem_chunk is None and self.admitted and extend >= self.rem_input:
            cache.unlock(locked)
            return self._stop(False)
        n = extend if self.rem_chunk is None else min(extend, self.rem_chunk)
        s.locked = locked
        cache.touch(locked)
        self.pool.alloc(s, n)
        s.fill_len, s.num_filled = fill, prefix
        s.num_prefills += 1
        self.log.cache_hit_tokens += prefix
        self.log.cache_miss_tokens += extend
        if s.admit_t is None:
            s.admit_t = self.now
        del self.waiting[rid]
        s.phase = Phase.PREFILLING
        self.offset += extend - n + max_new
        self.rem_input -= n
        if self.rem_chunk is not None:
            self.rem_chunk -= n
        self.items.append((s, n))
        self.admitted.append((s, n))
        if n < extend:
            self.chunked = s
        return True
