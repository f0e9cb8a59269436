"""The Chunked Hash Tree: the next waiting request by what running requests and the cache hold, O(log W)."""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from sglang_feather.cht.cache_tier import CacheTier
from sglang_feather.cht.candidate import Candidate, TakesPicks
from sglang_feather.cht.checks import (
    check_depth,
    checked_arrival,
    checked_chunk_size,
    checked_depth,
    checked_hashes,
    checked_share_depth,
)
from sglang_feather.cht.errors import DuplicateRequest, EmptyPrompt, InvalidTransition
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, chunk_hashes, namespace_seed
from sglang_feather.cht.nodes import PrefixNode, RequestState, TrackedRequest, keep_bounded
from sglang_feather.cht.paths import Paths, cached_depth, covered_depth
from sglang_feather.cht.ranking import Ranking
from sglang_feather.types import ChunkHash, RequestId

__all__ = ["Candidate", "PythonTree", "RequestState"]

# How it works.
#
# Every request is the path of its cumulative chunk hashes in a trie: node i of a path names the prefix
# "chunks 0..i", so requests that share a prefix share the nodes. A node is *covered* while a running request
# passes through it (`num_active > 0`: the working set) or the engine's KV cache holds its prefix (`cached`,
# kept from the engine's store / remove / clear events by the cache tier, cache_tier.py). Both sets are closed
# under prefixes, so along any path the covered nodes are a prefix: a waiting request is covered up to its
# deepest covered node `p`, and its prefill recomputes nothing above `p`. Ranking has two tiers. Tier 1: the
# waiting requests with a covered first chunk rank by deepest `p` first (the most prefill reused), then by the
# number of requests through `p`, waiting or running (the heaviest group first, as SGLang's dfs-weight, and
# admitting a request does not demote its group, so a pass keeps to one group), then by (arrival, seq). A
# request's own length enters nowhere, so short prompts do not jump ahead of long ones. Tier 2, only when no
# waiting request is covered anywhere: first come, first served. The lazy heaps that answer both tiers in
# O(log W) are in ranking.py; node creation, release and the shared depth in paths.py. Shared-prefix and
# coverage depths use binary search along one path, since `num_active` never grows with depth along a path and
# the cached nodes are a prefix of it.

_WAITING = RequestState.WAITING
_ACTIVE = RequestState.ACTIVE


class PythonTree(Ranking, CacheTier, Paths, TakesPicks):
    """The pure-Python core (and the reference the compiled one is held to); see "how it works" above.

    Complexity (n = chunks of the request, W = waiting requests, d = nodes that change coverage, c = chunks
    an event names): insert O(n + log W); activate/deactivate/finish O(n + d log W); remove O(n); best
    O(log n) amortised (a one-slot cache until the next mutation); suspend O(1); resume like an insert without
    hashing; cache_store / cache_remove O(c + d log W), O(1) per chunk no tracked request holds. Every error
    leaves the tree unchanged.
    """

    core = "python"
    """Which core this is (`backend_name()` names the one `ChunkedHashTree` is)."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE):
        self.chunk_size = checked_chunk_size(chunk_size)
        self._root = PrefixNode(None, None, 0, -1)
        self._nodes: dict[ChunkHash, PrefixNode] = {}
        self._requests: dict[RequestId, TrackedRequest] = {}
        self._active: dict[RequestId, TrackedRequest] = {}
        self._num_running_groups = 0
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
    def num_running_groups(self) -> int:
        """Prefix groups running requests belong to: first chunks at least one running request holds."""
        return self._num_running_groups

    @property
    def num_suspended(self) -> int:
        return len(self._suspended)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

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

    def arrival(self, request_id: RequestId) -> float:
        """When the request arrived, as its insert gave it (its insertion number when none was given)."""
        return self._get(request_id).arrival

    def num_missing(self, request_id: RequestId) -> int:
        """Chunks of the request's prompt that neither a running request nor the engine's cache holds."""
        path = self._get(request_id).path
        return len(path) - covered_depth(path)

    def num_holding(self, request_id: RequestId, depth: int) -> int:
        """Running requests that hold the first `depth` chunks of this request's prompt (0: every running
        request); `InvalidDepth` unless 0 <= depth <= its chunks."""
        path = self._get(request_id).path
        depth = checked_depth(request_id, depth, 0, len(path))
        return path[depth - 1].num_active if depth > 0 else len(self._active)

    def num_waiting_holding(self, request_id: RequestId, depth: int) -> int:
        """Waiting requests (suspended ones and this one included) that hold the first `depth` chunks of this
        request's prompt (0: every waiting request); `InvalidDepth` unless 0 <= depth <= its chunks."""
        path = self._get(request_id).path
        depth = checked_depth(request_id, depth, 0, len(path))
        return path[depth - 1].num_waiting if depth > 0 else self.num_waiting

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

    def cached_frontier(self, request_ids: Iterable[RequestId], limit: int) -> list[RequestId]:
        """Of the first `limit` ids (in the engine's queue order), the first waiting request of each distinct
        deepest cached node that no running request holds, in the ranking's order of those nodes (deepest,
        then the most requests through it, then queue order): one request per cached prefix that a refresh
        keeps young (`admission/refresh.py`). Untracked or running ids are passed over. O(limit log n)."""
        found: dict[PrefixNode, tuple[int, int, int, RequestId]] = {}
        for position, request_id in enumerate(itertools.islice(request_ids, limit)):
            req = self._requests.get(request_id)
            if req is None or req.state is not _WAITING:
                continue
            depth = cached_depth(req.path)
            node = req.path[depth - 1] if depth else None
            if node is not None and node.num_active == 0 and node not in found:
                found[node] = (-depth, -node.num_waiting, position, request_id)
        return [key[-1] for key in sorted(found.values())]

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
        if path and path[0].num_active == 1:
            self._num_running_groups += 1
        # A node that enters coverage needs a global entry only if some waiting request leaves coverage right
        # there (the others are counted at a deeper node of this path).
        for depth in range(first_entered, len(path)):
            node = path[depth]
            below = path[depth + 1].num_waiting if depth + 1 < len(path) else 0
            if node.num_waiting > below:
                self._push_global(node)
        # A cached node its first running request reaches ranks higher now (its key fell): re-push its entry.
        for node in path:
            if not node.cached:
                break
            if node.num_active == 1 and node.global_key is not None:
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
        keep_bounded(leaf)
        keep_bounded(req.path[0])
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

    # ----------------------------------------------------------------- internals

    def _describe(self, req: TrackedRequest) -> Candidate:
        path = req.path
        num_active = len(self._active)
        cached = cached_depth(path)
        if num_active == 0:
            before = after = len(path)
            running = 0
        else:
            after = self._last_depth(path, min(len(path), self.shared_depth), num_active)
            before = self.shared_depth if num_active > 1 else after
            running = self._last_depth(path, len(path), 1)
        missing = len(path) - max(running, cached)
        sharing = path[after - 1].num_waiting - 1 if after else 0
        return Candidate(req.id, len(path), missing, running, cached, before, after, sharing, req.arrival)

    # ----------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Recount everything from the requests and assert the tree agrees; O(total chunks + heap sizes)."""
        from sglang_feather.cht.invariants import check_tree

        check_tree(self)
