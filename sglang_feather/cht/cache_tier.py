"""The Python core's cache tier: the chunk hashes the engine's KV cache holds, kept from its events."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from sglang_feather.cht.checks import checked_hashes
from sglang_feather.cht.errors import HashChainError
from sglang_feather.cht.nodes import PrefixNode
from sglang_feather.types import ChunkHash

# How it works. The tier maps every cached chunk hash to its parent's (`_cache`) and every parent to its cached
# children (`_cache_children`), so an eviction drops the cached chunks that extend it with no scan. A chain
# whose parent is not cached is ignored (the engine could never match it: the tier stays closed under
# prefixes); a hash cached or tracked under another parent is refused before anything changes. A hash no
# tracked request holds costs one dict entry and O(1) per event. A tree node takes its `cached` flag when it is
# created (`PythonTree._build_path`) and from every event that names it; a node that enters or leaves coverage
# is handled exactly like one that enters or leaves the working set (one global entry pushed; its waiting
# subtree re-offered to its parent, `Ranking._reoffer`).

NOT_CACHED = object()


class CacheTier:
    """`PythonTree`'s cache-tier events and queries (a mixin over its nodes, heaps and `_cache` dicts)."""

    def is_cached(self, chunk_hash: ChunkHash) -> bool:
        """Whether the cache tier holds the prefix named by `chunk_hash`."""
        return chunk_hash in self._cache

    @property
    def num_cached(self) -> int:
        """Chunks the cache tier holds (whether or not a tracked request holds them)."""
        return len(self._cache)

    def cache_store(self, hashes: Sequence[ChunkHash], parent: ChunkHash | None = None) -> int:
        """The engine's cache now holds the chain `hashes` below the prefix `parent` (None: from the start):
        each hash names the prefix one chunk longer than the one before. Returns the chunks newly cached.

        A chain whose `parent` the cache tier does not hold is ignored (the engine could never match it: the
        tier stays closed under prefixes). `HashChainError`, with nothing changed, when a hash is cached, or
        in the tree, under another parent, or repeats within the chain."""
        hashes = checked_hashes(hashes)
        if parent is not None:
            parent = checked_hashes([parent])[0]
            if parent not in self._cache:
                return 0
        self._check_chain(hashes, parent)
        entered: list[PrefixNode] = []
        num_new = 0
        above = parent
        flagged = False
        for chunk_hash in hashes:
            if chunk_hash not in self._cache:
                self._cache[chunk_hash] = above
                if above is not None:
                    self._cache_children.setdefault(above, set()).add(chunk_hash)
                num_new += 1
                node = self._nodes.get(chunk_hash)
                if node is not None and (node.depth == 1 or node.parent.cached):
                    node.cached = flagged = True
                    if node.num_active == 0:
                        entered.append(node)
            above = chunk_hash
        for node in entered:
            if node.num_waiting:
                self._push_global(node)
        if flagged:
            self._best_valid = False
        return num_new

    def cache_remove(self, hashes: Iterable[ChunkHash]) -> int:
        """The engine evicted these prefixes (and so every cached prefix that extends them); hashes the tier
        does not hold are ignored. Returns the chunks uncached."""
        try:
            named = iter(hashes)
        except TypeError:
            raise HashChainError("chunk hashes must be an iterable of integers") from None
        doomed = [
            chunk_hash for chunk_hash in named if chunk_hash in self._cache
        ]  # may raise: nothing changed
        gone: list[ChunkHash] = []
        for chunk_hash in doomed:
            if chunk_hash in self._cache:
                gone.extend(self._uncache_subtree(chunk_hash))
        self._leave_cache(gone)
        return len(gone)

    def cache_clear(self) -> None:
        """The engine's cache was emptied."""
        gone = list(self._cache)
        self._cache.clear()
        self._cache_children.clear()
        self._leave_cache(gone)

    def _check_chain(self, hashes: array, parent: ChunkHash | None) -> None:
        above = parent
        seen = set()
        for depth, chunk_hash in enumerate(hashes):
            if chunk_hash in seen:
                raise HashChainError(f"hash {chunk_hash!r} repeats within one cache_store chain")
            seen.add(chunk_hash)
            known = self._cache.get(chunk_hash, NOT_CACHED)
            if known is not NOT_CACHED and known != above:
                raise HashChainError(
                    f"hash {chunk_hash!r} (chain position {depth}) is cached under another prefix: hashes are "
                    "not cumulative or two prefixes collide"
                )
            node = self._nodes.get(chunk_hash)
            if node is not None and (node.parent.hash if node.depth > 1 else None) != above:
                raise HashChainError(
                    f"hash {chunk_hash!r} (chain position {depth}) is in the tree under another prefix"
                )
            above = chunk_hash

    def _uncache_subtree(self, chunk_hash: ChunkHash) -> list[ChunkHash]:
        """Drop a cached hash and every cached hash below it from the tier; returns them."""
        parent = self._cache.pop(chunk_hash)
        if parent is not None:
            siblings = self._cache_children[parent]
            siblings.discard(chunk_hash)
            if not siblings:
                del self._cache_children[parent]
        gone = [chunk_hash]
        stack = [chunk_hash]
        while stack:
            for child in self._cache_children.pop(stack.pop(), ()):
                del self._cache[child]
                gone.append(child)
                stack.append(child)
        return gone

    def _leave_cache(self, hashes: list[ChunkHash]) -> None:
        """Tree nodes of uncached hashes lose their flag; those that leave coverage re-offer their subtree."""
        left = []
        for chunk_hash in hashes:
            node = self._nodes.get(chunk_hash)
            if node is not None and node.cached:
                node.cached = False
                self._best_valid = False
                if node.num_active == 0:
                    left.append(node)
        left.sort(key=lambda node: node.depth, reverse=True)
        self._reoffer(left)
