"""The Python tree's ranking: the lazy lower-bound heaps that find the next waiting request in O(log W)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping

from sglang_feather.cht.nodes import (
    COMPACT_MIN,
    PrefixNode,
    RequestState,
    TrackedRequest,
    best_of,
    compacted,
    compacted_arrivals,
    compacted_global,
    compacted_strangers,
)
from sglang_feather.cht.paths import covered_depth
from sglang_feather.types import ChunkHash, RequestId

# How it works. Each node keeps a lazy min-heap `candidates` of (a) the waiting requests that end exactly there
# and (b) its children, keyed by the child's cached `best` (the earliest waiting request in the child's
# subtree); a global lazy heap holds one key per covered node with waiting requests leaving coverage right below
# it (tier 1: deepest covered node, then one running requests hold before one only cached, then the most
# requests through it, then arrival). Tier 2: each first-level node keeps a lazy heap of its waiting requests by
# (arrival, seq), and a stranger heap holds one key per uncovered first-level node. A node that enters coverage
# (an activation, a cache store) pushes ONE global entry, whatever the number of waiting requests below it; one
# that leaves it (a finish, an eviction) re-offers its subtree to its parent. Entries are never updated in
# place: keys only ever under-estimate (removals raise true minima), so a popped entry is checked, and if stale
# re-keyed and pushed again (the lazy lower-bound heap); the keys that can fall are re-pushed: a node's request
# count for the covered nodes of a path that gains a request, its running flag for the cached nodes its first
# running request reaches. A suspended request counts everywhere but its entries read as stale, so it is passed
# over; `resume` publishes it again like an insert. Every heap is compacted when its entries outnumber the live
# items below it by a constant factor, so memory is bounded by the live requests.

_WAITING = RequestState.WAITING


class Ranking:
    """The tree's heaps: publishing waiting requests, re-offering subtrees, popping the best. It owns the
    tree-wide heaps and the push counter; the nodes' own heaps and keys live on the nodes it is handed. It
    receives the tree's node and request maps, read only for their sizes (the compaction bounds)."""

    def __init__(self, nodes: Mapping[ChunkHash, PrefixNode], requests: Mapping[RequestId, TrackedRequest]):
        self._nodes = nodes
        self._requests = requests
        self._global: list[tuple] = []
        self._strangers: list[tuple] = []
        self._by_arrival: list[tuple] = []
        self._push_id = itertools.count()

    @property
    def num_entries(self) -> int:
        """Entries in the tree-wide heaps (the nodes' own heaps are counted by the tree)."""
        return len(self._global) + len(self._strangers) + len(self._by_arrival)

    def heaps(self) -> tuple[list[tuple], list[tuple], list[tuple]]:
        """The tree-wide heaps (global, stranger, arrival order), for the invariant checker."""
        return self._global, self._strangers, self._by_arrival

    def oldest(self) -> TrackedRequest | None:
        """The earliest-arrived waiting, unsuspended request, or None."""
        heap = self._by_arrival
        while heap:
            req = heap[0][2]
            if req.state is _WAITING and not req.suspended and self._requests.get(req.id) is req:
                return req
            heapq.heappop(heap)
        return None

    def trim(self) -> None:
        """Keep the tree-wide heaps bounded by the live requests and nodes after a request leaves."""
        if len(self._global) > 2 * len(self._nodes) + COMPACT_MIN:
            self._global = compacted_global(self._global)
        if len(self._strangers) > 2 * len(self._nodes) + COMPACT_MIN:
            self._strangers = compacted_strangers(self._strangers)
        if len(self._by_arrival) > 2 * len(self._requests) + COMPACT_MIN:
            self._by_arrival = compacted_arrivals(self._by_arrival)

    def reoffer(self, left: list[PrefixNode]) -> None:
        """Nodes that just left coverage, deepest first: each re-offers its subtree's best to its parent,
        which gets a global entry when it is still covered (a stranger entry at the first level)."""
        for node in left:
            if node.num_waiting == 0:
                node.best = None
                continue
            best = self._refresh(node)
            parent = node.parent
            if parent is None:
                self._push_stranger(node)
                continue
            if best is not None:
                self.push(parent, best[:2], node)
            if parent.is_covered:
                self.push_global(parent)

    def reweigh(self, path: list[PrefixNode]) -> None:
        """The covered nodes of `path` gained a request: their global keys (which count the requests through
        them) fell, so re-push the ones that have an entry."""
        for node in path:
            if not node.is_covered:
                return
            if node.global_key is not None:
                self.push_global(node)

    def push(self, node: PrefixNode, key: tuple, item: PrefixNode | TrackedRequest) -> None:
        heap = node.candidates
        heapq.heappush(heap, (*key, next(self._push_id), item))
        if len(heap) > 4 * (node.num_waiting + node.num_active) + COMPACT_MIN:
            node.candidates = compacted(heap)

    def publish(self, req: TrackedRequest, num_existing: int) -> None:
        """Make a waiting request findable: the tier-1 entries, its first node's arrival heap, `oldest`."""
        self._offer(req, num_existing)
        self.push_arrival(req)
        first = req.path[0]
        if not first.is_covered:
            key = req.key
            if first.stranger_key is None or key < first.stranger_key:
                self._push_stranger_key(first, key)

    def _offer(self, req: TrackedRequest, num_existing: int) -> None:
        """Publish a waiting request for tier 1: terminal entry at its leaf, then cached bests upwards.

        Nodes created for this request hold only it, so their heaps are built directly; the deepest covered
        one (a cached prefix) gets the global entry. Above them, a cached `best` (even one whose request has
        left) is a lower bound of its subtree's true minimum, so the walk stops at the first node whose cached
        key is already <= ours, at a covered node (which gets a global entry), or at the first level (whose
        entry waits until the node is covered).
        """
        key = req.key
        path = req.path
        if num_existing < len(path):
            own_best = (*key, req)
            below: PrefixNode | TrackedRequest = req
            for node in reversed(path[num_existing:]):
                node.candidates = [(*key, next(self._push_id), below)]
                node.best = own_best
                below = node
            if num_existing:
                self.push(path[num_existing - 1], key, below)
            if path[num_existing].cached:
                self.push_global(path[covered_depth(path) - 1])
                return
            if num_existing == 0:
                return
            node = path[num_existing - 1]
        else:
            node = path[-1]
            self.push(node, key, req)
        while not node.is_covered:
            best = node.best
            if best is not None and best[:2] <= key:
                return
            node.best = (*key, req)
            parent = node.parent
            if parent is None:
                return
            self.push(parent, key, node)
            node = parent
        self.push_global(node)

    @staticmethod
    def global_key(node: PrefixNode, top: tuple) -> tuple:
        """Tier-1 rank of the requests leaving coverage right below `node`: deepest first, then a node running
        requests hold before one only the cache holds (a running group's requests add no prefix to the batch's
        KV), then the most requests through it (waiting or running: admitting one does not demote its group),
        then the earliest of them."""
        return (-node.depth, -(node.num_active > 0), -(node.num_waiting + node.num_active), top[0], top[1])

    def push_global(self, node: PrefixNode) -> None:
        top = self._settle(node)
        if top is None:
            return
        key = self.global_key(node, top)
        if node.global_key is not None and node.global_key <= key:
            return
        node.global_key = key
        heap = self._global
        heapq.heappush(heap, (*key, next(self._push_id), node))
        if len(heap) > 2 * len(self._nodes) + COMPACT_MIN:
            self._global = compacted_global(heap)

    def push_arrival(self, req: TrackedRequest) -> None:
        """Entries in the first node's arrival heap (tier 2) and the tree's arrival order (`oldest`)."""
        entry = (req.arrival, req.seq, req)
        first = req.path[0]
        arrivals = first.arrivals
        assert arrivals is not None, "a first-level node holds an arrival heap while it lives"
        heapq.heappush(arrivals, entry)
        if len(arrivals) > 4 * (first.num_waiting + first.num_active) + COMPACT_MIN:
            first.arrivals = compacted_arrivals(arrivals)
        heapq.heappush(self._by_arrival, entry)
        if len(self._by_arrival) > 2 * len(self._requests) + COMPACT_MIN:
            self._by_arrival = compacted_arrivals(self._by_arrival)

    def _push_stranger(self, first: PrefixNode) -> None:
        """An uncovered first-level node: make sure the stranger heap bounds its earliest request."""
        top = self._settle_arrivals(first)
        if top is not None and (first.stranger_key is None or top[:2] < first.stranger_key):
            self._push_stranger_key(first, top[:2])

    def _push_stranger_key(self, first: PrefixNode, key: tuple[float, int]) -> None:
        first.stranger_key = key
        heap = self._strangers
        heapq.heappush(heap, (*key, next(self._push_id), first))
        if len(heap) > 2 * len(self._nodes) + COMPACT_MIN:
            self._strangers = compacted_strangers(heap)

    @staticmethod
    def _settle_arrivals(first: PrefixNode) -> tuple | None:
        heap = first.arrivals
        while heap:
            req = heap[0][2]
            if req.state is _WAITING and not req.suspended:
                return heap[0]
            heapq.heappop(heap)
        return None

    def _settle(self, node: PrefixNode) -> tuple | None:
        """Drop stale entries from the top of `node.candidates`; the valid top entry, or None.

        A child entry whose cached best has left is re-keyed by recomputing that child first; the
        recomputation descends iteratively (paths can be thousands of chunks deep).
        """
        stack = [node]
        while True:
            current = stack[-1]
            heap = current.candidates
            blocked = None
            while heap:
                entry = heap[0]
                item = entry[3]
                if item.__class__ is TrackedRequest:
                    if item.state is _WAITING and not item.suspended:
                        break
                elif (
                    item.is_alive
                    and not item.is_covered
                    and item.best is not None
                    and item.best[:2] == entry[:2]
                ):
                    best_req = item.best[2]
                    if best_req.state is _WAITING and not best_req.suspended:
                        break
                    blocked = item
                heapq.heappop(heap)
                if blocked is not None:
                    break
            if blocked is not None:
                stack.append(blocked)
                continue
            stack.pop()
            top = heap[0] if heap else None
            if not stack:
                return top
            current.best = best_of(top)
            if current.best is not None:
                self.push(stack[-1], current.best[:2], current)

    def _refresh(self, node: PrefixNode) -> tuple | None:
        """Recompute `node.best` from its candidates."""
        node.best = best_of(self._settle(node))
        return node.best

    def pop_best(self) -> TrackedRequest | None:
        return self._pop_sharing() or self.pop_stranger()

    def _pop_sharing(self) -> TrackedRequest | None:
        heap = self._global
        while heap:
            entry = heap[0]
            node = entry[6]
            if entry[:5] != node.global_key:
                heapq.heappop(heap)  # superseded by the node's newer, smaller entry (or no longer needed)
                continue
            if not node.is_alive or not node.is_covered:
                node.global_key = None
                heapq.heappop(heap)
                continue
            top = self._settle(node)
            if top is None:
                node.global_key = None
                heapq.heappop(heap)
                continue
            key = self.global_key(node, top)
            if key != node.global_key:
                node.global_key = key
                heapq.heapreplace(heap, (*key, next(self._push_id), node))
                continue
            return best_of(top)[2]
        return None

    def pop_stranger(self) -> TrackedRequest | None:
        heap = self._strangers
        while heap:
            entry = heap[0]
            first = entry[3]
            if entry[:2] != first.stranger_key:
                heapq.heappop(heap)
                continue
            if not first.is_alive or first.is_covered:
                first.stranger_key = None
                heapq.heappop(heap)
                continue
            top = self._settle_arrivals(first)
            if top is None:
                first.stranger_key = None
                heapq.heappop(heap)
                continue
            if top[:2] != first.stranger_key:
                first.stranger_key = top[:2]
                heapq.heapreplace(heap, (*top[:2], next(self._push_id), first))
                continue
            return top[2]
        return None
