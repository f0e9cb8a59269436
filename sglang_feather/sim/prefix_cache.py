"""Radix-style prefix cache of KV blocks with reference counts and LRU eviction of unreferenced leaves."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# How it works.
#
# Each cached block is keyed by its chained hash (see `sharing`), so blocks form a tree by parent hash,
# exactly like a radix tree cut at block boundaries. A running request locks the path of its prompt;
# unlocked blocks are evictable, and eviction removes least-recently-used leaves first (a parent becomes a
# leaf when its last child goes), as SGLang's RadixCache does. The cache never holds more than its capacity;
# `on_insert`/`on_evict` listeners let an engine adapter mirror the content in a real RadixCache, and
# `on_store`/`on_remove` publish the block-level events an engine's KV-event feed carries (SGLang's
# BlockStored / BlockRemoved): the chain of newly cached block hashes, and each evicted block's hash.

InsertListener = Callable[[np.ndarray], None]
"""Called with the token ids of a whole newly cached path (root to its last new block)."""
EvictListener = Callable[[np.ndarray, int], None]
"""Called with the token ids of an evicted block's path and the offset where the evicted block starts."""
StoreListener = Callable[[Sequence[int], Sequence[int], int], None]
"""Called with a cached path's block hashes, their end offsets, and the index of its first newly cached block."""
RemoveListener = Callable[[int], None]
"""Called with the hash of each evicted block (leaves first)."""


class CacheFull(RuntimeError):
    """An insertion needs more room than eviction can free; the engine's budgets should prevent this."""


@dataclass
class _Block:
    parent: int | None
    num_tokens: int
    path: np.ndarray
    lock_ref: int = 0
    num_children: int = 0
    last_access: int = 0


@dataclass
class PrefixCache:
    capacity_tokens: int
    on_insert: list[InsertListener] = field(default_factory=list)
    on_evict: list[EvictListener] = field(default_factory=list)
    on_store: list[StoreListener] = field(default_factory=list)
    on_remove: list[RemoveListener] = field(default_factory=list)
    num_tokens: int = 0
    num_evictable: int = 0
    _blocks: dict[int, _Block] = field(default_factory=dict)
    _heap: list[tuple[int, int]] = field(default_factory=list)
    _tick: itertools.count = field(default_factory=itertools.count)

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of `hashes` that are cached."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int], ends: Sequence[int], tokens: np.ndarray, free_tokens: int) -> int:
        """Cache the blocks of a path (evicting if the pool lacks room); returns the tokens newly cached.

        `free_tokens` is the pool room outside the cache; new blocks take from it first, then from eviction.
        """
        first_new = self.match(hashes)
        needed = ends[-1] - (ends[first_new - 1] if first_new else 0) if first_new < len(hashes) else 0
        if needed > free_tokens:
            self.lock(hashes[:first_new])
            try:
                if self.evict(needed - free_tokens) < needed - free_tokens:
                    raise CacheFull(f"need {needed} tokens, {free_tokens} free and too little evictable")
            finally:
                self.unlock(hashes[:first_new])
        tick = next(self._tick)
        for i in range(first_new, len(hashes)):
            parent = hashes[i - 1] if i else None
            num = ends[i] - (ends[i - 1] if i else 0)
            self._blocks[hashes[i]] = _Block(parent, num, tokens[: ends[i]], last_access=tick)
            if parent is not None:
                self._blocks[parent].num_children += 1
            self.num_tokens += num
            self.num_evictable += num
        if first_new < len(hashes):
            self._push_leaf(hashes[-1])
            path = tokens[: ends[-1]]
            for listener in self.on_insert:
                listener(path)
            for store in self.on_store:
                store(hashes, ends, first_new)
        self.touch(hashes)
        return needed

    def touch(self, hashes: Sequence[int]) -> None:
        tick = next(self._tick)
        last = None
        for h in hashes:
            blk = self._blocks.get(h)
            if blk is None:
                break
            blk.last_access = tick
            last = h
        if last is not None:
            self._push_leaf(last)

    def touch_paths(self, paths: Sequence[Sequence[int]]) -> None:
        """Refresh the cached part of each path in LRU, later paths more recently, as one SGLang
        `match_prefix` / `touch_prefix` call each would (every node matched gets the call's time).

        Walked last path first, each from its deepest cached block up to the first block a later path
        already refreshed, so a shared prefix costs once per call, not once per path.
        """
        if not paths:
            return
        base = next(self._tick)
        for _ in range(len(paths) - 1):
            next(self._tick)
        for i in range(len(paths) - 1, -1, -1):
            h = self._deepest_cached(paths[i])
            if h is None:
                continue
            blk = self._blocks[h]
            if blk.last_access < base:
                leaf = h
                while h is not None and blk.last_access < base:
                    blk.last_access = base + i
                    h = blk.parent
                    blk = self._blocks[h] if h is not None else blk
                self._push_leaf(leaf)

    def _deepest_cached(self, hashes: Sequence[int]) -> int | None:
        """The deepest cached block of a path (its cached blocks are a prefix of it: binary search)."""
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[mid] in self._blocks:
                lo = mid + 1
            else:
                hi = mid
        return hashes[lo - 1] if lo else None

    def lock(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            blk = self._blocks[h]
            if blk.lock_ref == 0:
                self.num_evictable -= blk.num_tokens
            blk.lock_ref += 1

    def unlock(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            blk = self._blocks[h]
            if blk.lock_ref <= 0:
                raise RuntimeError("unlock of an unlocked cache block")
            blk.lock_ref -= 1
            if blk.lock_ref == 0:
                self.num_evictable += blk.num_tokens
        if hashes:
            self._push_leaf(hashes[-1])

    def evict(self, num_tokens: int) -> int:
        """Evict LRU unreferenced leaves until `num_tokens` are freed or nothing is evictable."""
        freed = 0
        while freed < num_tokens and self._heap:
            tick, h = heapq.heappop(self._heap)
            blk = self._blocks.get(h)
            if blk is None or blk.last_access != tick or blk.lock_ref or blk.num_children:
                continue
            del self._blocks[h]
            self.num_tokens -= blk.num_tokens
            self.num_evictable -= blk.num_tokens
            freed += blk.num_tokens
            for listener in self.on_evict:
                listener(blk.path, len(blk.path) - blk.num_tokens)
            for remove in self.on_remove:
                remove(h)
            if blk.parent is not None:
                parent = self._blocks[blk.parent]
                parent.num_children -= 1
                if parent.num_children == 0:
                    heapq.heappush(self._heap, (parent.last_access, blk.parent))
        return freed

    def _push_leaf(self, h: int) -> None:
        blk = self._blocks[h]
        if blk.num_children == 0 and blk.lock_ref == 0:
            heapq.heappush(self._heap, (blk.last_access, h))

    def check_invariants(self) -> None:
        total = sum(b.num_tokens for b in self._blocks.values())
        evictable = sum(b.num_tokens for b in self._blocks.values() if b.lock_ref == 0)
        assert total == self.num_tokens <= self.capacity_tokens, (total, self.num_tokens)
        assert evictable == self.num_evictable, (evictable, self.num_evictable)
        for h, b in self._blocks.items():
            assert b.parent is None or b.parent in self._blocks, h
            kids = sum(1 for c in self._blocks.values() if c.parent == h)
            assert kids == b.num_children, (h, kids, b.num_children)
