"""The Python tree's cache tier: the chunk hashes the engine's KV cache holds, kept from its events."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from sglang_feather.cht.errors import HashChainError
from sglang_feather.cht.paths import NOT_CACHED
from sglang_feather.types import ChunkHash

# How it works. The tier maps every cached chunk hash to its parent's (`parents`) and every parent to its cached
# children (`_children`), so an eviction drops the cached chunks that extend it with no scan. A chain whose
# parent is not cached is ignored (the engine could never match it: the tier stays closed under prefixes); a
# hash cached or tracked under another parent is refused before anything changes. A hash no tracked request
# holds costs one dict entry and O(1) per event. The tier knows hashes only: the tree flags its nodes from what
# `store`, `remove` and `clear` return (a node takes its `cached` flag when it is created, `Trie.build_path`,
# and from every event that names it), and handles a node that enters or leaves coverage exactly like one
# that enters or leaves the working set (one global entry pushed; its waiting subtree re-offered to its
# parent, `Ranking.reoffer`).


class CacheTier:
    """The engine's cached chunk hashes, closed under prefixes; it owns them and nothing else."""

    def __init__(self) -> None:
        self.parents: dict[ChunkHash, ChunkHash | None] = {}
        """Every chunk hash the engine's cache holds -> the hash of its parent prefix (None: a first chunk)."""
        self._children: dict[ChunkHash, set[ChunkHash]] = {}

    def __len__(self) -> int:
        return len(self.parents)

    def __contains__(self, chunk_hash: object) -> bool:
        return chunk_hash in self.parents

    def children(self) -> dict[ChunkHash, set[ChunkHash]]:
        """Parent hash -> its cached children (for the invariant checker)."""
        return self._children

    def check_chain(
        self,
        hashes: Sequence[ChunkHash],
        parent: ChunkHash | None,
        tracked: Callable[[ChunkHash], tuple[bool, ChunkHash | None]],
    ) -> None:
        """`HashChainError` unless `hashes` can be cached below `parent`: no hash repeats, none is cached under
        another parent, and none is tracked (`tracked(hash)`: whether the tree holds it, and its parent's hash)
        under another parent."""
        above = parent
        seen = set()
        for depth, chunk_hash in enumerate(hashes):
            if chunk_hash in seen:
                raise HashChainError(f"hash {chunk_hash!r} repeats within one cache_store chain")
            seen.add(chunk_hash)
            known = self.parents.get(chunk_hash, NOT_CACHED)
            if known is not NOT_CACHED and known != above:
                raise HashChainError(
                    f"hash {chunk_hash!r} (chain position {depth}) is cached under another prefix: hashes are "
                    "not cumulative or two prefixes collide"
                )
            is_tracked, tracked_above = tracked(chunk_hash)
            if is_tracked and tracked_above != above:
                raise HashChainError(
                    f"hash {chunk_hash!r} (chain position {depth}) is in the tree under another prefix"
                )
            above = chunk_hash

    def store(self, hashes: Sequence[ChunkHash], parent: ChunkHash | None) -> list[ChunkHash]:
        """Cache a checked chain below `parent` (`check_chain`); returns the hashes newly cached, in order."""
        new = []
        above = parent
        for chunk_hash in hashes:
            if chunk_hash not in self.parents:
                self.parents[chunk_hash] = above
                if above is not None:
                    self._children.setdefault(above, set()).add(chunk_hash)
                new.append(chunk_hash)
            above = chunk_hash
        return new

    def remove(self, hashes: Iterable[ChunkHash]) -> list[ChunkHash]:
        """Uncache these prefixes and every cached one that extends them (hashes not cached are ignored);
        returns the hashes uncached."""
        try:
            named = iter(hashes)
        except TypeError:
            raise HashChainError("chunk hashes must be an iterable of integers") from None
        doomed = [
            chunk_hash for chunk_hash in named if chunk_hash in self.parents
        ]  # may raise: nothing changed
        gone: list[ChunkHash] = []
        for chunk_hash in doomed:
            if chunk_hash in self.parents:
                gone.extend(self._uncache_subtree(chunk_hash))
        return gone

    def clear(self) -> list[ChunkHash]:
        """Uncache everything; returns the hashes uncached."""
        gone = list(self.parents)
        self.parents.clear()
        self._children.clear()
        return gone

    def _uncache_subtree(self, chunk_hash: ChunkHash) -> list[ChunkHash]:
        """Drop a cached hash and every cached hash below it from the tier; returns them."""
        parent = self.parents.pop(chunk_hash)
        if parent is not None:
            siblings = self._children[parent]
            siblings.discard(chunk_hash)
            if not siblings:
                del self._children[parent]
        gone = [chunk_hash]
        stack = [chunk_hash]
        while stack:
            for child in self._children.pop(stack.pop(), ()):
                del self.parents[child]
                gone.append(child)
                stack.append(child)
        return gone
