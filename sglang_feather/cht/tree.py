"""The Chunked Hash Tree: the waiting request that misses the fewest chunks of the running batch, in O(log W)."""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from sglang_feather.cht.errors import (
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, chunk_hashes
from sglang_feather.cht.nodes import (
    COMPACT_MIN,
    PrefixNode,
    RequestState,
    TrackedRequest,
    best_of,
    compacted,
    compacted_global,
)
from sglang_feather.types import ChunkHash, RequestId

# How it works.
#
# Every request is the path of its cumulative chunk hashes in a trie: node i of a path names the prefix
# "chunks 0..i", so requests that share a prefix share the nodes. A node is *in the working set* while at
# least one running (active) request passes through it (`num_active > 0`); that set is closed under
# prefixes. A waiting request r of `n` chunks is covered up to its deepest working-set node `p`, so it misses
# `n - depth(p)` chunks, and `p` is the same for every waiting request that leaves the working set below `p`.
# Hence: best = min over working-set nodes p (and the root) of [ shortest waiting request that leaves the
# working set right below p ] - depth(p). Each node keeps a lazy min-heap `candidates` of (a) the waiting
# requests that end exactly there and (b) its children, keyed by the child's cached `best` (the shortest,
# then earliest, waiting request in the child's subtree); a global lazy heap holds one key per working-set
# node. Activating a request therefore touches only its own path: each node that enters the working set
# pushes ONE global entry, whatever the number of waiting requests below it (no per-holder update; this is
# the trap of updating every holder of every chunk, O(W x chunks) when a group's prefix arrives). Entries
# are never updated in place: keys only ever under-estimate (removals raise true minima), so a popped entry
# is checked, and if stale re-keyed and pushed again (the lazy lower-bound heap). Shared-prefix depths use
# binary search along one path, since `num_active` never grows with depth along a path.


@dataclass(frozen=True)
class Candidate:
    """The best waiting request and what admitting it would do to the batch's shared prefix (in chunks)."""

    request_id: RequestId
    num_chunks: int
    num_missing: int
    depth_before: int
    """Shared-prefix depth of the running batch now. A batch of one request shares nothing yet, so it has
    nothing to lose: then `depth_before == depth_after`; an empty batch gives the candidate's `num_chunks`."""
    depth_after: int
    num_sharing: int
    """`w`: other waiting requests that hold the prefix of depth `depth_after` (0 when that depth is 0)."""

    @property
    def delta(self) -> int:
        return self.depth_before - self.depth_after


_WAITING = RequestState.WAITING
_ACTIVE = RequestState.ACTIVE


class ChunkedHashTree:
    """Waiting and running requests as chunk-hash paths; see the module's "how it works" paragraph.

    Complexity (n = chunks of the request, W = waiting requests, d = nodes that change working-set
    membership): insert O(n + log W); activate/deactivate/finish O(n + d log W); remove O(n);
    best O(log n) amortised (a one-slot cache until the next mutation). Every error leaves the tree unchanged.
    """

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self._root = PrefixNode(None, None, 0)
        self._nodes: dict[ChunkHash, PrefixNode] = {}
        self._requests: dict[RequestId, TrackedRequest] = {}
        self._active: dict[RequestId, TrackedRequest] = {}
        self._global: list[tuple] = []
        self._by_arrival: list[tuple] = []
        self._shared: PrefixNode | None = None
        self._seq = itertools.count()
        self._push_id = itertools.count()
        self._best_cache: Candidate | None = None
        self._best_valid = False

    # ----------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._requests

    @property
    def num_active(self) -> int:
        return len(self._active)

    @property
    def num_waiting(self) -> int:
        return len(self._requests) - len(self._active)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def shared_depth(self) -> int:
        """Chunks every running request holds; 0 when nothing runs."""
        return self._shared.depth if self._shared is not None else 0

    def state(self, request_id: RequestId) -> RequestState | None:
        req = self._requests.get(request_id)
        return req.state if req is not None else None

    def waiting_ids(self) -> Iterator[RequestId]:
        return (rid for rid, req in self._requests.items() if req.state is _WAITING)

    def active_ids(self) -> Iterator[RequestId]:
        return iter(self._active)

    def num_chunks(self, request_id: RequestId) -> int:
        return len(self._get(request_id).path)

    def num_missing(self, request_id: RequestId) -> int:
        """Chunks of the request's prompt not held by any running request."""
        path = self._get(request_id).path
        return len(path) - self._last_depth(path, len(path), 1)

    def num_holding(self, request_id: RequestId, depth: int) -> int:
        """Running requests that hold the first `depth` chunks of this request's prompt."""
        return self._get(request_id).path[depth - 1].num_active if depth > 0 else len(self._active)

    def shares_prefix(self, request_id: RequestId, other_id: RequestId, depth: int) -> bool:
        """Whether two requests have the same first `depth` chunks."""
        path, other = self._get(request_id).path, self._get(other_id).path
        return depth == 0 or (
            len(other) >= depth and len(path) >= depth and path[depth - 1] is other[depth - 1]
        )

    def best(self) -> Candidate | None:
        """The waiting request with the fewest missing chunks (ties: earliest arrival), or None."""
        if not self._best_valid:
            req = self._pop_best()
            self._best_cache = self._describe(req) if req is not None else None
            self._best_valid = True
        return self._best_cache

    def candidate(self, request_id: RequestId) -> Candidate:
        """`best()`'s numbers for a given waiting request (e.g. one the aging guard admits)."""
        req = self._get(request_id)
        if req.state is not _WAITING:
            raise InvalidTransition(f"request {request_id!r} is {req.state.value}, not waiting")
        return self._describe(req)

    def oldest(self) -> RequestId | None:
        """The earliest-arrived waiting request, or None."""
        heap = self._by_arrival
        while heap:
            req = heap[0][2]
            if req.state is _WAITING and self._requests.get(req.id) is req:
                return req.id
            heapq.heappop(heap)
        return None

    # ----------------------------------------------------------------- mutations

    def insert(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray,
        *,
        namespace: str | None = None,
        arrival: float | None = None,
    ) -> int:
        """Add a waiting request; returns its number of chunks."""
        if request_id in self._requests:
            raise DuplicateRequest(f"request {request_id!r} is already in the tree")
        return self.insert_hashes(
            request_id, chunk_hashes(token_ids, self.chunk_size, namespace), arrival=arrival
        )

    def insert_hashes(
        self, request_id: RequestId, hashes: Sequence[ChunkHash], *, arrival: float | None = None
    ) -> int:
        """Add a waiting request from precomputed cumulative hashes (e.g. vLLM's block hashes)."""
        if request_id in self._requests:
            raise DuplicateRequest(f"request {request_id!r} is already in the tree")
        if not hashes:
            raise EmptyPrompt(f"request {request_id!r} has no chunks")
        path, num_existing = self._build_path(hashes)
        seq = next(self._seq)
        req = TrackedRequest(request_id, path, float(seq) if arrival is None else float(arrival), seq)
        self._requests[request_id] = req
        for node in path:
            node.num_waiting += 1
        self._offer(req, num_existing)
        heapq.heappush(self._by_arrival, (req.arrival, seq, req))
        self._best_valid = False
        return len(path)

    def activate(self, request_id: RequestId) -> None:
        """A waiting request joins the running batch: its chunks enter the working set."""
        req = self._expect(request_id, _WAITING)
        req.state = _ACTIVE
        self._active[request_id] = req
        path = req.path
        first_entered = len(path)
        for depth, node in enumerate(path):
            node.num_waiting -= 1
            node.num_active += 1
            if node.num_active == 1 and depth < first_entered:
                first_entered = depth
        # A node that enters the working set needs a global entry only if some waiting request leaves the
        # working set right there (the others are counted at a deeper node of this path).
        for depth in range(first_entered, len(path)):
            node = path[depth]
            below = path[depth + 1].num_waiting if depth + 1 < len(path) else 0
            if node.num_waiting > below:
                self._push_global(node)
        self._update_shared_after_activate(req)
        self._best_valid = False

    def deactivate(self, request_id: RequestId) -> None:
        """A running request goes back to waiting (retraction, preemption); it keeps its arrival order."""
        req = self._expect(request_id, _ACTIVE)
        for node in req.path:
            node.num_waiting += 1
        req.state = _WAITING
        leaf = req.path[-1]
        self._push(leaf, req.key, req)
        self._leave_working_set(req)
        if leaf.num_active > 0:
            self._push_global(leaf)
        heapq.heappush(self._by_arrival, (req.arrival, req.seq, req))
        self._best_valid = False

    def finish(self, request_id: RequestId) -> None:
        """A running request leaves for good."""
        req = self._expect(request_id, _ACTIVE)
        self._leave_working_set(req)
        del self._requests[request_id]
        req.state = None
        self._release_nodes(req.path)
        self._best_valid = False

    def remove(self, request_id: RequestId) -> None:
        """A waiting request leaves for good (aborted before it ran)."""
        req = self._expect(request_id, _WAITING)
        del self._requests[request_id]
        req.state = None
        for node in req.path:
            node.num_waiting -= 1
        self._release_nodes(req.path)
        self._best_valid = False

    def discard(self, request_id: RequestId) -> bool:
        """Remove a request in whatever state it is; False if the tree does not hold it."""
        req = self._requests.get(request_id)
        if req is None:
            return False
        if req.state is _ACTIVE:
            self.finish(request_id)
        else:
            self.remove(request_id)
        return True

    # ----------------------------------------------------------------- internals: paths and counts

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
        """The nodes for `hashes` and how many already existed; existing nodes form a prefix of any path."""
        nodes = self._nodes
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in nodes:
                lo = mid
            else:
                hi = mid - 1
        path: list[PrefixNode] = []
        if lo:
            node = nodes[hashes[lo - 1]]
            if node.depth != lo:
                raise HashChainError(
                    f"hash {hashes[lo - 1]:#x} at depth {lo} is already at depth {node.depth}: hashes are not "
                    "cumulative or two prefixes collide"
                )
            while node.parent is not None:
                path.append(node)
                node = node.parent
            path.reverse()
        fresh = hashes[lo:]
        if len(set(fresh)) != len(fresh) or any(h in nodes for h in fresh):
            raise HashChainError(
                "a hash repeats or skips a level within one request: hashes are not cumulative"
            )
        parent = path[-1] if path else self._root
        for depth, chunk_hash in enumerate(fresh, start=lo + 1):
            parent = nodes[chunk_hash] = PrefixNode(chunk_hash, parent, depth)
            path.append(parent)
        return path, lo

    def _release_nodes(self, path: list[PrefixNode]) -> None:
        for node in reversed(path):
            if node.num_active or node.num_waiting:
                break
            node.is_alive = False
            node.candidates = []
            node.best = None
            del self._nodes[node.hash]

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
        """Drop a running request's references; nodes that leave the working set re-offer their waiting subtree."""
        del self._active[req.id]
        left = []
        for node in req.path:
            node.num_active -= 1
            if node.num_active == 0:
                left.append(node)
        for node in reversed(left):
            if node.num_waiting == 0:
                node.best = None
                continue
            best = self._refresh(node)
            if best is not None:
                self._push(node.parent, best[:3], node)
        if left and left[0].num_waiting:
            self._push_global(left[0].parent)  # still in the working set (prefix-closed), or the root
        self._update_shared_after_leave()

    # ----------------------------------------------------------------- internals: the lazy heaps

    def _push(self, node: PrefixNode, key: tuple, item: PrefixNode | TrackedRequest) -> None:
        heap = node.candidates
        heapq.heappush(heap, (*key, next(self._push_id), item))
        num_live = node.num_waiting + node.num_active if node.parent is not None else len(self._requests)
        if len(heap) > 4 * num_live + COMPACT_MIN:
            node.candidates = compacted(heap)

    def _offer(self, req: TrackedRequest, num_existing: int) -> None:
        """Publish a new waiting request: terminal entry at its leaf, then cached bests up to the working set.

        Nodes created for this request hold only it, so their heaps are built directly. Above them, a cached
        `best` (even one whose request has left) is a lower bound of its subtree's true minimum, so the walk
        stops at the first node whose cached key is already <= ours.
        """
        key = req.key
        path = req.path
        if num_existing < len(path):
            best = (*key, req)
            below: PrefixNode | TrackedRequest = req
            for node in reversed(path[num_existing:]):
                node.candidates = [(*key, next(self._push_id), below)]
                node.best = best
                below = node
            node = path[num_existing].parent
            self._push(node, key, below)
        else:
            node = path[-1]
            self._push(node, key, req)
        while node.num_active == 0 and node.parent is not None:
            best = node.best
            if best is not None and best[:3] <= key:
                return
            node.best = (*key, req)
            self._push(node.parent, key, node)
            node = node.parent
        self._push_global(node)

    def _push_global(self, node: PrefixNode) -> None:
        top = self._settle(node)
        if top is None:
            return
        key = (top[0] - node.depth, top[1], top[2])
        if node.global_key is not None and node.global_key <= key:
            return
        node.global_key = key
        heap = self._global
        heapq.heappush(heap, (*key, next(self._push_id), node))
        if len(heap) > 2 * (len(self._nodes) + 1) + COMPACT_MIN:
            self._global = compacted_global(heap)

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
                item = entry[4]
                if item.__class__ is TrackedRequest:
                    if item.state is _WAITING:
                        break
                elif (
                    item.is_alive
                    and item.num_active == 0
                    and item.best is not None
                    and item.best[:3] == entry[:3]
                ):
                    if item.best[3].state is _WAITING:
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
                self._push(stack[-1], current.best[:3], current)

    def _refresh(self, node: PrefixNode) -> tuple | None:
        """Recompute `node.best` from its candidates."""
        node.best = best_of(self._settle(node))
        return node.best

    def _pop_best(self) -> TrackedRequest | None:
        heap = self._global
        while heap:
            entry = heap[0]
            node = entry[4]
            if entry[:3] != node.global_key:
                heapq.heappop(heap)  # superseded by the node's newer, smaller entry (or no longer needed)
                continue
            if node.parent is not None and (not node.is_alive or node.num_active == 0):
                node.global_key = None
                heapq.heappop(heap)
                continue
            top = self._settle(node)
            if top is None:
                node.global_key = None
                heapq.heappop(heap)
                continue
            key = (top[0] - node.depth, top[1], top[2])
            if key != node.global_key:
                node.global_key = key
                heapq.heapreplace(heap, (*key, next(self._push_id), node))
                continue
            return best_of(top)[3]
        return None

    def _describe(self, req: TrackedRequest) -> Candidate:
        path = req.path
        num_active = len(self._active)
        if num_active == 0:
            before = after = missing = len(path)
        else:
            after = self._last_depth(path, min(len(path), self.shared_depth), num_active)
            before = self.shared_depth if num_active > 1 else after
            missing = len(path) - self._last_depth(path, len(path), 1)
        sharing = path[after - 1].num_waiting - 1 if after else 0
        return Candidate(req.id, len(path), missing, before, after, sharing)

    # ----------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Recount everything from the requests and assert the tree agrees; O(total chunks + heap sizes)."""
        from sglang_feather.cht.invariants import check_tree

        check_tree(self)
