"""The Python core's paths and counts: building a request's path of nodes, releasing it, the shared depth."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

from sglang_feather.cht.cache_tier import NOT_CACHED
from sglang_feather.cht.errors import HashChainError, InvalidTransition, UnknownRequest
from sglang_feather.cht.nodes import (
    COMPACT_MIN,
    PrefixNode,
    RequestState,
    TrackedRequest,
    compacted_arrivals,
    compacted_global,
    compacted_strangers,
    keep_bounded,
)
from sglang_feather.types import ChunkHash, RequestId


class Paths:
    """`PythonTree`'s request lookup, node creation and release, and the running batch's shared prefix (a
    mixin)."""

    def _get(self, request_id: RequestId) -> TrackedRequest:
        req = self._requests.get(request_id)
        if req is None:
            raise UnknownRequest(f"request {request_id!r} is not in the tree")
        return req

    def _expect(self, request_id: RequestId, state: RequestState) -> TrackedRequest:
        req = self._get(request_id)
        if req.state is not state:
            raise InvalidTransition(f"request {request_id!r} is {req.state.value}, expected {state.value}")
        return req

    def _build_path(self, hashes: Sequence[ChunkHash]) -> tuple[list[PrefixNode], int]:
        """The nodes for `hashes` and how many already existed; refuses anything that is not one chain.

        Existing nodes must form a prefix of the list, each the child of the one before (so a hash known at
        another depth or under another parent is refused), and the rest must be new and distinct. A new node
        is cached when the cache tier holds its hash under its parent's and its parent is cached.
        """
        nodes = self._nodes
        path: list[PrefixNode] = []
        parent = self._root
        for chunk_hash in hashes:
            node = nodes.get(chunk_hash)
            if node is None:
                break
            if node.parent is not parent:
                raise HashChainError(
                    f"hash {chunk_hash!r} at depth {len(path) + 1} is already at depth {node.depth} under "
                    "another prefix: hashes are not cumulative or two prefixes collide"
                )
            path.append(node)
            parent = node
        num_existing = len(path)
        fresh = hashes[num_existing:]
        if len(set(fresh)) != len(fresh) or any(h in nodes for h in fresh):
            raise HashChainError(
                "a hash repeats or skips a level within one request: hashes are not cumulative"
            )
        serial = self._serial
        cache = self._cache
        cached = parent is self._root or parent.cached
        for depth, chunk_hash in enumerate(fresh, start=num_existing + 1):
            cached = cached and cache.get(chunk_hash, NOT_CACHED) == parent.hash
            parent = nodes[chunk_hash] = PrefixNode(chunk_hash, parent, depth, next(serial))
            parent.cached = cached
            path.append(parent)
        return path, num_existing

    def _release_nodes(self, path: list[PrefixNode]) -> None:
        for node in reversed(path):
            if node.num_active or node.num_waiting:
                break
            node.is_alive = False
            node.candidates = []
            node.arrivals = None
            node.best = None
            node.global_key = None
            node.stranger_key = None
            del self._nodes[node.hash]
        for node in path:
            if not node.is_alive:
                break
            keep_bounded(node)

    def _trim_roots(self) -> None:
        """Keep the tree-wide heaps bounded by the live requests and nodes after a request leaves."""
        if len(self._global) > 2 * len(self._nodes) + COMPACT_MIN:
            self._global = compacted_global(self._global)
        if len(self._strangers) > 2 * len(self._nodes) + COMPACT_MIN:
            self._strangers = compacted_strangers(self._strangers)
        if len(self._by_arrival) > 2 * len(self._requests) + COMPACT_MIN:
            self._by_arrival = compacted_arrivals(self._by_arrival)

    @staticmethod
    def _last_depth(path: list[PrefixNode], limit: int, threshold: int) -> int:
        """Largest d <= limit with path[d-1].num_active >= threshold (0 if none); `num_active` falls with depth."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if path[mid - 1].num_active >= threshold:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _update_shared_after_activate(self, req: TrackedRequest) -> None:
        if len(self._active) == 1:
            self._shared = req.path[-1]
            return
        depth = self._last_depth(req.path, min(len(req.path), self.shared_depth), len(self._active))
        self._shared = req.path[depth - 1] if depth else self._root

    def _update_shared_after_leave(self) -> None:
        if not self._active:
            self._shared = None
            return
        path = next(iter(self._active.values())).path
        depth = self._last_depth(path, len(path), len(self._active))
        self._shared = path[depth - 1] if depth else self._root

    def _leave_working_set(self, req: TrackedRequest) -> None:
        """Drop a running request's references; nodes that leave coverage re-offer their waiting subtree."""
        del self._active[req.id]
        left = []
        for node in req.path:
            node.num_active -= 1
            if node.num_active == 0 and not node.cached:
                left.append(node)
        if req.path and req.path[0].num_active == 0:
            self._num_running_groups -= 1
        left.reverse()
        self._reoffer(left)
        self._update_shared_after_leave()


def _prefix_length(path: list[PrefixNode], holds: Callable[[PrefixNode], bool]) -> int:
    """Largest d with holds(path[d-1]) (0 if none), for a property that holds on a prefix of every path."""
    lo, hi = 0, len(path)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(path[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def cached_depth(path: list[PrefixNode]) -> int:
    """The request's prefix the cache tier holds (the cached nodes are a prefix of every path)."""
    return _prefix_length(path, _IS_CACHED)


def covered_depth(path: list[PrefixNode]) -> int:
    """The request's prefix held by running requests or the cache (a prefix of every path)."""
    return _prefix_length(path, _IS_COVERED)


_IS_CACHED = attrgetter("cached")
_IS_COVERED = attrgetter("is_covered")
