"""The Chunked Hash Tree: the next waiting request by what running requests and the cache hold, O(log W)."""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from sglang_feather.cht.checks import (
    check_depth,
    checked_arrival,
    checked_chunk_size,
    checked_depth,
    checked_hashes,
    checked_share_depth,
)
from sglang_feather.cht.errors import (
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, chunk_hashes, namespace_seed
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
from sglang_feather.types import ChunkHash, RequestId

# How it works.
#
# Every request is the path of its cumulative chunk hashes in a trie: node i of a path names the prefix
# "chunks 0..i", so requests that share a prefix share the nodes. A node is *covered* while a running request
# passes through it (`num_active > 0`: the working set) or the engine's KV cache holds its prefix (`cached`,
# kept from the engine's store / remove / clear events by the cache tier). Both sets are closed under prefixes, so
# along any path the covered nodes are a prefix: a waiting request is covered up to its deepest covered node
# `p`, and its prefill recomputes nothing above `p`. The cache tier holds every cached chunk hash with its
# parent (a hash no tracked request holds costs one dict entry and nothing else); a node takes its `cached`
# flag from it when the node is created and on every event that names it. Ranking has two tiers. Tier 1: the
# waiting requests with a covered first chunk rank by deepest `p` first (the most prefill reused), then by the
# number of requests through `p`, waiting or running (the heaviest group first, as SGLang's dfs-weight, and
# admitting a request does not demote its group, so a pass keeps to one group), then by (arrival, seq). A
# request's own length enters nowhere, so short prompts do not jump ahead of long ones. Tier 2, only when no
# waiting request is covered anywhere: first come, first served. Each node keeps a lazy min-heap
# `candidates` of (a) the waiting requests that end exactly there and (b) its children, keyed by the child's
# cached `best` (the earliest waiting request in the child's subtree); a global lazy heap holds one key per
# covered node with waiting requests leaving coverage right below it. Tier 2: each first-level node keeps a
# lazy heap of its waiting requests by (arrival, seq), and a stranger heap holds one key per uncovered
# first-level node. A node that enters coverage (an activation, a cache store) pushes ONE global entry,
# whatever the number of waiting requests below it; one that leaves it (a finish, an eviction) re-offers its
# subtree to its parent. Entries are never updated in place: keys only ever under-estimate (removals raise
# true minima), so a popped entry is checked, and if stale re-keyed and pushed again (the lazy lower-bound
# heap); the one key that can fall, a node's request count, is re-pushed for the covered nodes of a path that
# gains a request. A suspended request counts everywhere but its entries read as stale, so it is
# passed over; `resume` publishes it again like an insert. Every heap is compacted when its entries outnumber
# the live items below it by a constant factor, so memory is bounded by the live requests (and the cache tier
# by the cache's size in chunks). Shared-prefix and coverage depths use binary search along one path, since
# `num_active` never grows with depth along a path and the cached nodes are a prefix of it.


@dataclass(frozen=True, slots=True)
class Candidate:
    """The best waiting request, how much of it is already computed, and what admitting it would do to the
    batch's shared prefix (all in chunks)."""

    request_id: RequestId
    num_chunks: int
    num_missing: int
    """Chunks neither a running request nor the engine's cache holds: what its prefill computes."""
    depth_running: int
    """Its longest prefix held by running requests (0: it shares nothing with the batch)."""
    depth_cached: int
    """Its longest prefix the engine's cache holds, as the cache tier knows it (0 without cache events)."""
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


class PythonTree:
    """The pure-Python core (and the reference the compiled one is held to); see "how it works" above.

    Complexity (n = chunks of the request, W = waiting requests, d = nodes that change coverage, c = chunks
    an event names): insert O(n + log W); activate/deactivate/finish O(n + d log W); remove O(n); best
    O(log n) amortised (a one-slot cache until the next mutation); suspend O(1); resume like an insert without
    hashing; cache_store / cache_remove O(c + d log W), O(1) per chunk no tracked request holds. Every error
    leaves the tree unchanged.
    """

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE):
        self.chunk_size = checked_chunk_size(chunk_size)
        self._root = PrefixNode(None, None, 0, -1)
        self._nodes: dict[ChunkHash, PrefixNode] = {}
        self._requests: dict[RequestId, TrackedRequest] = {}
        self._active: dict[RequestId, TrackedRequest] = {}
        self._suspended: dict[RequestId, TrackedRequest] = {}
        self._cache: dict[ChunkHash, ChunkHash | None] = {}
        """The cache tier: every chunk hash the engine's cache holds -> the hash of its parent prefix."""
        self._cache_children: dict[ChunkHash, set[ChunkHash]] = {}
        self._global: list[tuple] = []
        self._strangers: list[tuple] = []
        self._by_arrival: list[tuple] = []
        self._shared: PrefixNode | None = None
        self._seq = itertools.count()
        self._serial = itertools.count()
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
    def num_suspended(self) -> int:
        return len(self._suspended)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def num_cached(self) -> int:
        """Chunks the cache tier holds (whether or not a tracked request holds them)."""
        return len(self._cache)

    @property
    def num_index_entries(self) -> int:
        """Entries in every internal heap (a diagnostic: bounded by a constant times the live requests)."""
        total = len(self._global) + len(self._strangers) + len(self._by_arrival)
        for node in self._nodes.values():
            total += len(node.candidates) + (len(node.arrivals) if node.arrivals is not None else 0)
        return total

    @property
    def shared_depth(self) -> int:
        """Chunks every running request holds; 0 when nothing runs."""
        return self._shared.depth if self._shared is not None else 0

    def state(self, request_id: RequestId) -> RequestState | None:
        req = self._requests.get(request_id)
        return req.state if req is not None else None

    def is_suspended(self, request_id: RequestId) -> bool:
        return self._get(request_id).suspended

    def is_cached(self, chunk_hash: ChunkHash) -> bool:
        """Whether the cache tier holds the prefix named by `chunk_hash`."""
        return chunk_hash in self._cache

    def waiting_ids(self) -> Iterator[RequestId]:
        return (rid for rid, req in self._requests.items() if req.state is _WAITING)

    def active_ids(self) -> Iterator[RequestId]:
        return iter(self._active)

    def num_chunks(self, request_id: RequestId) -> int:
        return len(self._get(request_id).path)

    def path_hashes(self, request_id: RequestId) -> tuple[ChunkHash, ...]:
        """The request's cumulative chunk hashes, as inserted."""
        return tuple(node.hash for node in self._get(request_id).path)

    def prefix_hash(self, request_id: RequestId, depth: int = 1) -> ChunkHash:
        """The hash that names the request's first `depth` chunks (`path_hashes(...)[depth - 1]`)."""
        path = self._get(request_id).path
        return path[check_depth(request_id, depth, len(path)) - 1].hash

    def num_missing(self, request_id: RequestId) -> int:
        """Chunks of the request's prompt that neither a running request nor the engine's cache holds."""
        path = self._get(request_id).path
        return len(path) - _covered_depth(path)

    def num_holding(self, request_id: RequestId, depth: int) -> int:
        """Running requests that hold the first `depth` chunks of this request's prompt (0: every running
        request); `InvalidDepth` unless 0 <= depth <= its chunks."""
        path = self._get(request_id).path
        depth = checked_depth(request_id, depth, 0, len(path))
        return path[depth - 1].num_active if depth > 0 else len(self._active)

    def shares_prefix(self, request_id: RequestId, other_id: RequestId, depth: int) -> bool:
        """Whether two requests have the same first `depth` chunks (False when either has fewer);
        `InvalidDepth` for a negative depth."""
        path, other = self._get(request_id).path, self._get(other_id).path
        depth = checked_share_depth(depth)
        return depth == 0 or (
            len(other) >= depth and len(path) >= depth and path[depth - 1] is other[depth - 1]
        )

    def best(self) -> Candidate | None:
        """The next waiting, unsuspended request by the two-tier rule (see "how it works"), or None."""
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
        """The earliest-arrived waiting, unsuspended request, or None."""
        heap = self._by_arrival
        while heap:
            req = heap[0][2]
            if req.state is _WAITING and not req.suspended and self._requests.get(req.id) is req:
                return req.id
            heapq.heappop(heap)
        return None

    def oldest_stranger(self) -> RequestId | None:
        """The earliest-arrived waiting, unsuspended request with no covered chunk (nothing of it running or
        cached: the request the ranking serves last), or None."""
        req = self._pop_stranger()
        return req.id if req is not None else None

    def prefix_order(self, request_ids: Iterable[RequestId]) -> list[RequestId]:
        """The given requests (any state) in the trie's depth-first order, children first-seen first.

        Requests that share a prefix are contiguous at every depth, a request comes before those that extend
        its prompt, and equal paths keep their given order. Groups are split at their longest common prefix
        (binary search along each path), so the cost is O(R log n) per branching level, not O(R n).
        """
        order: list[RequestId] = []
        reqs = [self._get(rid) for rid in request_ids]
        stack: list[tuple[list[TrackedRequest], int]] = [(reqs, 0)] if reqs else []
        while stack:
            group, depth = stack.pop()
            if len(group) == 1:
                order.append(group[0].id)
                continue
            first = group[0].path
            common = len(first)
            for req in group:
                path = req.path
                limit = min(common, len(path))
                if limit > depth and path[limit - 1] is not first[limit - 1]:
                    lo, hi = depth, limit - 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if path[mid - 1] is first[mid - 1]:
                            lo = mid
                        else:
                            hi = mid - 1
                    limit = lo
                common = limit
            branches: dict[int, list[TrackedRequest]] = {}
            for req in group:
                if len(req.path) == common:
                    order.append(req.id)
                else:
                    branches.setdefault(req.path[common].serial, []).append(req)
            for serial in sorted(branches, reverse=True):
                stack.append((branches[serial], common + 1))
        return order

    # ----------------------------------------------------------------- mutations

    def insert(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray,
        *,
        namespace: str | None = None,
        arrival: float | None = None,
    ) -> int:
        """Add a waiting request; returns its number of chunks. Checks, in order: the id, the namespace, the
        arrival, the token ids (the compiled core's order too)."""
        if request_id in self._requests:
            raise DuplicateRequest(f"request {request_id!r} is already in the tree")
        namespace_seed(namespace)
        arrival = checked_arrival(request_id, arrival)
        return self._add(request_id, chunk_hashes(token_ids, self.chunk_size, namespace), arrival)

    def insert_hashes(
        self, request_id: RequestId, hashes: Sequence[ChunkHash], *, arrival: float | None = None
    ) -> int:
        """Add a waiting request from precomputed cumulative hashes (e.g. vLLM's block hashes)."""
        if request_id in self._requests:
            raise DuplicateRequest(f"request {request_id!r} is already in the tree")
        return self._add(request_id, hashes, checked_arrival(request_id, arrival))

    def _add(self, request_id: RequestId, hashes: Sequence[ChunkHash], arrival: float | None) -> int:
        hashes = checked_hashes(hashes)
        if not hashes:
            raise EmptyPrompt(f"request {request_id!r} has no chunks")
        path, num_existing = self._build_path(hashes)
        seq = next(self._seq)
        req = TrackedRequest(request_id, path, float(seq) if arrival is None else arrival, seq)
        self._requests[request_id] = req
        for node in path:
            node.num_waiting += 1
        self._publish(req, num_existing)
        self._reweigh(path)
        self._best_valid = False
        return len(path)

    def activate(self, request_id: RequestId) -> None:
        """A waiting request joins the running batch: its chunks enter the working set."""
        req = self._expect(request_id, _WAITING)
        if req.suspended:
            req.suspended = False
            del self._suspended[request_id]
        req.state = _ACTIVE
        self._active[request_id] = req
        path = req.path
        first_entered = len(path)
        for depth, node in enumerate(path):
            node.num_waiting -= 1
            node.num_active += 1
            if node.num_active == 1 and not node.cached and depth < first_entered:
                first_entered = depth
        # A node that enters coverage needs a global entry only if some waiting request leaves coverage right
        # there (the others are counted at a deeper node of this path).
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
        self._push_arrival(req)
        self._leave_working_set(req)
        if leaf.is_covered:
            self._push_global(leaf)
        # Its leaf and first node took an entry while it counted as waiting and running: keep their heaps
        # within the bound of the count it has now.
        _keep_bounded(leaf)
        _keep_bounded(req.path[0])
        self._best_valid = False

    def finish(self, request_id: RequestId) -> None:
        """A running request leaves for good."""
        req = self._expect(request_id, _ACTIVE)
        self._leave_working_set(req)
        del self._requests[request_id]
        req.state = None
        self._release_nodes(req.path)
        self._trim_roots()
        self._best_valid = False

    def remove(self, request_id: RequestId) -> None:
        """A waiting request leaves for good (aborted before it ran)."""
        req = self._expect(request_id, _WAITING)
        if req.suspended:
            req.suspended = False
            del self._suspended[request_id]
        del self._requests[request_id]
        req.state = None
        for node in req.path:
            node.num_waiting -= 1
        self._release_nodes(req.path)
        self._trim_roots()
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

    def suspend(self, request_id: RequestId) -> None:
        """Pass a waiting request over in `best()` and `oldest()` until `resume`; it still counts everywhere."""
        req = self._expect(request_id, _WAITING)
        if req.suspended:
            raise InvalidTransition(f"request {request_id!r} is already suspended")
        req.suspended = True
        self._suspended[request_id] = req
        self._best_valid = False

    def resume(self, request_id: RequestId) -> None:
        """Make a suspended request eligible again."""
        req = self._get(request_id)
        if not req.suspended:
            raise InvalidTransition(f"request {request_id!r} is not suspended")
        req.suspended = False
        del self._suspended[request_id]
        self._publish(req, len(req.path))
        self._best_valid = False

    def resume_all(self) -> None:
        for request_id in list(self._suspended):
            self.resume(request_id)

    # ----------------------------------------------------------------- the cache tier

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
            known = self._cache.get(chunk_hash, _NOT_CACHED)
            if known is not _NOT_CACHED and known != above:
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
            cached = cached and cache.get(chunk_hash, _NOT_CACHED) == parent.hash
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
            _keep_bounded(node)

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
        left.reverse()
        self._reoffer(left)
        self._update_shared_after_leave()

    def _reoffer(self, left: list[PrefixNode]) -> None:
        """Nodes that just left coverage, deepest first: each re-offers its subtree's best to its parent,
        which gets a global entry when it is still covered (a stranger entry at the first level)."""
        for node in left:
            if node.num_waiting == 0:
                node.best = None
                continue
            best = self._refresh(node)
            if node.depth == 1:
                self._push_stranger(node)
                continue
            if best is not None:
                self._push(node.parent, best[:2], node)
            if node.parent.is_covered:
                self._push_global(node.parent)

    def _reweigh(self, path: list[PrefixNode]) -> None:
        """The covered nodes of `path` gained a request: their global keys (which count the requests through
        them) fell, so re-push the ones that have an entry."""
        for node in path:
            if not node.is_covered:
                return
            if node.global_key is not None:
                self._push_global(node)

    # ----------------------------------------------------------------- internals: the lazy heaps

    def _push(self, node: PrefixNode, key: tuple, item: PrefixNode | TrackedRequest) -> None:
        heap = node.candidates
        heapq.heappush(heap, (*key, next(self._push_id), item))
        if len(heap) > 4 * (node.num_waiting + node.num_active) + COMPACT_MIN:
            node.candidates = compacted(heap)

    def _publish(self, req: TrackedRequest, num_existing: int) -> None:
        """Make a waiting request findable: the tier-1 entries, its first node's arrival heap, `oldest`."""
        self._offer(req, num_existing)
        self._push_arrival(req)
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
            best = (*key, req)
            below: PrefixNode | TrackedRequest = req
            for node in reversed(path[num_existing:]):
                node.candidates = [(*key, next(self._push_id), below)]
                node.best = best
                below = node
            if num_existing:
                self._push(path[num_existing - 1], key, below)
            if path[num_existing].cached:
                self._push_global(path[_covered_depth(path) - 1])
                return
            if num_existing == 0:
                return
            node = path[num_existing - 1]
        else:
            node = path[-1]
            self._push(node, key, req)
        while not node.is_covered:
            best = node.best
            if best is not None and best[:2] <= key:
                return
            node.best = (*key, req)
            if node.depth == 1:
                return
            self._push(node.parent, key, node)
            node = node.parent
        self._push_global(node)

    def _global_key(self, node: PrefixNode, top: tuple) -> tuple:
        """Tier-1 rank of the requests leaving coverage right below `node`: deepest first, then the most
        requests through it (waiting or running: admitting one does not demote its group), then the earliest
        of them."""
        return (-node.depth, -(node.num_waiting + node.num_active), top[0], top[1])

    def _push_global(self, node: PrefixNode) -> None:
        top = self._settle(node)
        if top is None:
            return
        key = self._global_key(node, top)
        if node.global_key is not None and node.global_key <= key:
            return
        node.global_key = key
        heap = self._global
        heapq.heappush(heap, (*key, next(self._push_id), node))
        if len(heap) > 2 * len(self._nodes) + COMPACT_MIN:
            self._global = compacted_global(heap)

    def _push_arrival(self, req: TrackedRequest) -> None:
        """Entries in the first node's arrival heap (tier 2) and the tree's arrival order (`oldest`)."""
        entry = (req.arrival, req.seq, req)
        first = req.path[0]
        heapq.heappush(first.arrivals, entry)
        if len(first.arrivals) > 4 * (first.num_waiting + first.num_active) + COMPACT_MIN:
            first.arrivals = compacted_arrivals(first.arrivals)
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
                self._push(stack[-1], current.best[:2], current)

    def _refresh(self, node: PrefixNode) -> tuple | None:
        """Recompute `node.best` from its candidates."""
        node.best = best_of(self._settle(node))
        return node.best

    def _pop_best(self) -> TrackedRequest | None:
        return self._pop_sharing() or self._pop_stranger()

    def _pop_sharing(self) -> TrackedRequest | None:
        heap = self._global
        while heap:
            entry = heap[0]
            node = entry[5]
            if entry[:4] != node.global_key:
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
            key = self._global_key(node, top)
            if key != node.global_key:
                node.global_key = key
                heapq.heapreplace(heap, (*key, next(self._push_id), node))
                continue
            return best_of(top)[2]
        return None

    def _pop_stranger(self) -> TrackedRequest | None:
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

    def _describe(self, req: TrackedRequest) -> Candidate:
        path = req.path
        num_active = len(self._active)
        cached = _cached_depth(path)
        if num_active == 0:
            before = after = len(path)
            running = 0
        else:
            after = self._last_depth(path, min(len(path), self.shared_depth), num_active)
            before = self.shared_depth if num_active > 1 else after
            running = self._last_depth(path, len(path), 1)
        missing = len(path) - max(running, cached)
        sharing = path[after - 1].num_waiting - 1 if after else 0
        return Candidate(req.id, len(path), missing, running, cached, before, after, sharing)

    # ----------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Recount everything from the requests and assert the tree agrees; O(total chunks + heap sizes)."""
        from sglang_feather.cht.invariants import check_tree

        check_tree(self)


_NOT_CACHED = object()


def _keep_bounded(node: PrefixNode) -> None:
    """Compact a node's candidate and arrival heaps once their entries outnumber its live requests by the
    compaction bound (what `_push` and `_push_arrival` keep on every push)."""
    live = node.num_waiting + node.num_active
    if len(node.candidates) > 4 * live + COMPACT_MIN:
        node.candidates = compacted(node.candidates)
    if node.arrivals is not None and len(node.arrivals) > 4 * live + COMPACT_MIN:
        node.arrivals = compacted_arrivals(node.arrivals)


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


def _cached_depth(path: list[PrefixNode]) -> int:
    """The request's prefix the cache tier holds (the cached nodes are a prefix of every path)."""
    return _prefix_length(path, _IS_CACHED)


def _covered_depth(path: list[PrefixNode]) -> int:
    """The request's prefix held by running requests or the cache (a prefix of every path)."""
    return _prefix_length(path, _IS_COVERED)


_IS_CACHED = attrgetter("cached")
_IS_COVERED = attrgetter("is_covered")
