"""The Chunked Hash Tree: the next waiting request by what running requests and the cache hold, O(log W)."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from sglang_feather.cht.cache_tier import CacheTier
from sglang_feather.cht.candidate import Candidate, TakenPicks, checked_picks, take_picks_stepwise
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
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, chunk_hashes, namespace_seed
from sglang_feather.cht.nodes import PrefixNode, RequestState, TrackedRequest, keep_bounded
from sglang_feather.cht.paths import (
    Trie,
    cached_depth,
    covered_depth,
    idle_cached_span,
    last_depth,
    prefix_order,
)
from sglang_feather.cht.ranking import Ranking
from sglang_feather.cht.working_set import WorkingSet
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
# O(log W) are in ranking.py; node creation and release in paths.py (`Trie`); the running requests and their
# shared depth in working_set.py; the cached hashes in cache_tier.py. The tree owns its requests and composes
# those four, each of which owns its state and knows nothing of the tree. Shared-prefix and coverage depths use
# binary search along one path, since `num_active` never grows with depth along a path and the cached nodes
# are a prefix of it.

_WAITING = RequestState.WAITING
_ACTIVE = RequestState.ACTIVE


class PythonTree:
    """The Python tree (and the reference the compiled one is held to); see "how it works" above.

    Complexity (n = chunks of the request, W = waiting requests, d = nodes that change coverage, c = chunks
    an event names): insert O(n + log W); activate/deactivate/finish O(n + d log W); remove O(n); best
    O(log n) amortised (a one-slot cache until the next mutation); suspend O(1); resume like an insert without
    hashing; cache_store / cache_remove O(c + d log W), O(1) per chunk no tracked request holds. Every error
    leaves the tree unchanged.
    """

    backend = "python"
    """Which backend this is (`backend_name()` names the one `ChunkedHashTree` is)."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE):
        self.chunk_size = checked_chunk_size(chunk_size)
        self._requests: dict[RequestId, TrackedRequest] = {}
        self._suspended: dict[RequestId, TrackedRequest] = {}
        self._seq = itertools.count()
        self._trie = Trie()
        self._running = WorkingSet()
        self._tier = CacheTier()
        self._ranking = Ranking(self._trie.nodes, self._requests)
        self._best_cache: Candidate | None = None
        self._best_valid = False
        self._num_idle_cached = 0
        """Nodes the cache tier holds that no running request holds and a waiting request passes through: the
        only nodes `cached_frontier` can name (none: it answers at once, reading no id)."""

    # ----------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._requests

    @property
    def num_active(self) -> int:
        return len(self._running.requests)

    @property
    def num_waiting(self) -> int:
        return len(self._requests) - len(self._running.requests)

    @property
    def num_running_groups(self) -> int:
        """Prefix groups running requests belong to: first chunks at least one running request holds."""
        return self._running.num_groups

    @property
    def num_suspended(self) -> int:
        return len(self._suspended)

    @property
    def num_nodes(self) -> int:
        return len(self._trie.nodes)

    @property
    def num_index_entries(self) -> int:
        """Entries in every internal heap (a diagnostic: bounded by a constant times the live requests)."""
        total = self._ranking.num_entries
        for node in self._trie.nodes.values():
            total += len(node.candidates) + (len(node.arrivals) if node.arrivals is not None else 0)
        return total

    @property
    def shared_depth(self) -> int:
        """Chunks every running request holds; 0 when nothing runs."""
        return self._running.shared_depth

    def is_cached(self, chunk_hash: ChunkHash) -> bool:
        """Whether the cache tier holds the prefix named by `chunk_hash`."""
        return chunk_hash in self._tier

    @property
    def num_cached(self) -> int:
        """Chunks the cache tier holds (whether or not a tracked request holds them)."""
        return len(self._tier)

    def state(self, request_id: RequestId) -> RequestState | None:
        req = self._requests.get(request_id)
        return req.state if req is not None else None

    def is_suspended(self, request_id: RequestId) -> bool:
        return self._get(request_id).suspended

    def waiting_ids(self) -> Iterator[RequestId]:
        return (rid for rid, req in self._requests.items() if req.state is _WAITING)

    def active_ids(self) -> Iterator[RequestId]:
        return iter(self._running.requests)

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
        return path[depth - 1].num_active if depth > 0 else len(self._running.requests)

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
            req = self._ranking.pop_best()
            self._best_cache = self._describe(req) if req is not None else None
            self._best_valid = True
        return self._best_cache

    def candidate(self, request_id: RequestId) -> Candidate:
        """`best()`'s numbers for a given waiting request (e.g. one the aging guard admits)."""
        req = self._get(request_id)
        if req.state is not _WAITING:
            raise InvalidTransition(f"request {request_id!r} is {req.state and req.state.value}, not waiting")
        return self._describe(req)

    def oldest(self) -> RequestId | None:
        """The earliest-arrived waiting, unsuspended request, or None."""
        req = self._ranking.oldest()
        return req.id if req is not None else None

    def oldest_stranger(self) -> RequestId | None:
        """The earliest-arrived waiting, unsuspended request with no covered chunk (nothing of it running or
        cached: the request the ranking serves last), or None."""
        req = self._ranking.pop_stranger()
        return req.id if req is not None else None

    def cached_frontier(self, request_ids: Iterable[RequestId], limit: int) -> list[RequestId]:
        """Of the first `limit` ids (in the engine's queue order), the first waiting request of each distinct
        deepest cached node that no running request holds, in the ranking's order of those nodes (deepest,
        then the most requests through it, then queue order): one request per cached prefix that a refresh
        keeps young (`admission/refresh.py`). Untracked or running ids are passed over. O(limit log n); O(1),
        reading no id, while no cached node that no running request holds has a waiting request."""
        head = itertools.islice(request_ids, limit)
        if not self._num_idle_cached:
            return []
        found: dict[PrefixNode, tuple[int, int, int, RequestId]] = {}
        for position, request_id in enumerate(head):
            req = self._requests.get(request_id)
            if req is None or req.state is not _WAITING:
                continue
            depth = cached_depth(req.path)
            node = req.path[depth - 1] if depth else None
            if node is not None and node.num_active == 0 and node not in found:
                found[node] = (-depth, -node.num_waiting, position, request_id)
        return [key[-1] for key in sorted(found.values())]

    def prefix_order(self, request_ids: Iterable[RequestId]) -> list[RequestId]:
        """The given requests (any state) in the trie's depth-first order, children first-seen first
        (`paths.prefix_order`)."""
        return prefix_order([self._get(rid) for rid in request_ids])

    def take_picks(
        self,
        max_picks: int,
        skip_running_uncached: bool,
        max_missing: int | None = None,
        first: RequestId | None = None,
    ) -> TakenPicks:
        """`take_picks_stepwise` (candidate.py says what it takes), its arguments checked."""
        return take_picks_stepwise(self, *checked_picks(max_picks, skip_running_uncached, max_missing), first)

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
        arrival, the token ids (the compiled tree's order too)."""
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
        path, num_existing = self._trie.build_path(hashes, self._tier.parents)
        seq = next(self._seq)
        req = TrackedRequest(request_id, path, float(seq) if arrival is None else arrival, seq)
        self._requests[request_id] = req
        before = idle_cached_span(path)  # the new nodes have no request yet
        for node in path:
            node.num_waiting += 1
        self._num_idle_cached += idle_cached_span(path) - before
        self._ranking.publish(req, num_existing)
        self._ranking.reweigh(path)
        self._best_valid = False
        return len(path)

    def activate(self, request_id: RequestId) -> None:
        """A waiting request joins the running batch: its chunks enter the working set."""
        req = self._expect(request_id, _WAITING)
        if req.suspended:
            req.suspended = False
            del self._suspended[request_id]
        req.state = _ACTIVE
        path = req.path
        before = idle_cached_span(path)
        first_entered = self._running.enter(req)
        self._num_idle_cached += idle_cached_span(path) - before
        ranking = self._ranking
        # A node that enters coverage needs a global entry only if some waiting request leaves coverage right
        # there (the others are counted at a deeper node of this path).
        for depth in range(first_entered, len(path)):
            node = path[depth]
            below = path[depth + 1].num_waiting if depth + 1 < len(path) else 0
            if node.num_waiting > below:
                ranking.push_global(node)
        # A cached node its first running request reaches ranks higher now (its key fell): re-push its entry.
        for node in path:
            if not node.cached:
                break
            if node.num_active == 1 and node.global_key is not None:
                ranking.push_global(node)
        self._best_valid = False

    def deactivate(self, request_id: RequestId) -> None:
        """A running request goes back to waiting (retraction, preemption); it keeps its arrival order."""
        req = self._expect(request_id, _ACTIVE)
        before = idle_cached_span(req.path)
        for node in req.path:
            node.num_waiting += 1
        req.state = _WAITING
        leaf = req.path[-1]
        ranking = self._ranking
        ranking.push(leaf, req.key, req)
        ranking.push_arrival(req)
        ranking.reoffer(self._running.leave(req))
        self._num_idle_cached += idle_cached_span(req.path) - before
        if leaf.is_covered:
            ranking.push_global(leaf)
        # Its leaf and first node took an entry while it counted as waiting and running: keep their heaps
        # within the bound of the count it has now.
        keep_bounded(leaf)
        keep_bounded(req.path[0])
        self._best_valid = False

    def finish(self, request_id: RequestId) -> None:
        """A running request leaves for good."""
        req = self._expect(request_id, _ACTIVE)
        before = idle_cached_span(req.path)
        self._ranking.reoffer(self._running.leave(req))
        self._num_idle_cached += idle_cached_span(req.path) - before
        del self._requests[request_id]
        req.state = None
        self._trie.release(req.path)
        self._ranking.trim()
        self._best_valid = False

    def remove(self, request_id: RequestId) -> None:
        """A waiting request leaves for good (aborted before it ran)."""
        req = self._expect(request_id, _WAITING)
        if req.suspended:
            req.suspended = False
            del self._suspended[request_id]
        del self._requests[request_id]
        req.state = None
        before = idle_cached_span(req.path)
        for node in req.path:
            node.num_waiting -= 1
        self._num_idle_cached += idle_cached_span(req.path) - before
        self._trie.release(req.path)
        self._ranking.trim()
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
        self._ranking.publish(req, len(req.path))
        self._best_valid = False

    def resume_all(self) -> None:
        for request_id in list(self._suspended):
            self.resume(request_id)

    # ----------------------------------------------------------------- the cache tier's events

    def cache_store(self, hashes: Sequence[ChunkHash], parent: ChunkHash | None = None) -> int:
        """The engine's cache now holds the chain `hashes` below the prefix `parent` (None: from the start):
        each hash names the prefix one chunk longer than the one before. Returns the chunks newly cached.

        A chain whose `parent` the cache tier does not hold is ignored (the engine could never match it: the
        tier stays closed under prefixes). `HashChainError`, with nothing changed, when a hash is cached, or
        in the tree, under another parent, or repeats within the chain."""
        hashes = checked_hashes(hashes)
        if parent is not None:
            parent = checked_hashes([parent])[0]
            if parent not in self._tier:
                return 0
        self._tier.check_chain(hashes, parent, self._trie.parent_hash)
        new = self._tier.store(hashes, parent)
        nodes = self._trie.nodes
        entered: list[PrefixNode] = []
        for chunk_hash in new:
            node = nodes.get(chunk_hash)
            if node is not None and (node.parent is None or node.parent.cached):
                node.cached = True
                self._best_valid = False
                if node.num_active == 0:
                    entered.append(node)
                    self._num_idle_cached += node.num_waiting > 0
        for node in entered:
            if node.num_waiting:
                self._ranking.push_global(node)
        return len(new)

    def cache_remove(self, hashes: Iterable[ChunkHash]) -> int:
        """The engine evicted these prefixes (and so every cached prefix that extends them); hashes the tier
        does not hold are ignored. Returns the chunks uncached."""
        gone = self._tier.remove(hashes)
        self._leave_cache(gone)
        return len(gone)

    def cache_clear(self) -> None:
        """The engine's cache was emptied."""
        self._leave_cache(self._tier.clear())

    def _leave_cache(self, hashes: list[ChunkHash]) -> None:
        """Tree nodes of uncached hashes lose their flag; those that leave coverage re-offer their subtree."""
        nodes = self._trie.nodes
        left = []
        for chunk_hash in hashes:
            node = nodes.get(chunk_hash)
            if node is not None and node.cached:
                node.cached = False
                self._best_valid = False
                if node.num_active == 0:
                    left.append(node)
                    self._num_idle_cached -= node.num_waiting > 0
        left.sort(key=lambda node: node.depth, reverse=True)
        self._ranking.reoffer(left)

    # ----------------------------------------------------------------- internals

    def _get(self, request_id: RequestId) -> TrackedRequest:
        req = self._requests.get(request_id)
        if req is None:
            raise UnknownRequest(f"request {request_id!r} is not in the tree")
        return req

    def _expect(self, request_id: RequestId, state: RequestState) -> TrackedRequest:
        req = self._get(request_id)
        if req.state is not state:
            raise InvalidTransition(
                f"request {request_id!r} is {req.state and req.state.value}, expected {state.value}"
            )
        return req

    def _describe(self, req: TrackedRequest) -> Candidate:
        path = req.path
        num_active = len(self._running.requests)
        cached = cached_depth(path)
        shared = self._running.shared_depth
        if num_active == 0:
            before = after = len(path)
            running = 0
        else:
            after = last_depth(path, min(len(path), shared), num_active)
            before = shared if num_active > 1 else after
            running = last_depth(path, len(path), 1)
        missing = len(path) - max(running, cached)
        sharing = path[after - 1].num_waiting - 1 if after else 0
        return Candidate(req.id, len(path), missing, running, cached, before, after, sharing, req.arrival)

    # ----------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Recount everything from the requests and assert the tree agrees; O(total chunks + heap sizes)."""
        from sglang_feather.cht.invariants import check_tree

        check_tree(self)
