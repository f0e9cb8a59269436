"""The admission's request lifecycle and cache events: they keep the CHT and the footprint equal to the engine."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Sequence

import numpy as np

from sglang_feather.admission.costs import Footprint
from sglang_feather.admission.deferral import InFlightCheck
from sglang_feather.admission.results import AdmissionStats
from sglang_feather.cht import ChunkedHashTree, RequestState
from sglang_feather.types import ChunkHash, RequestId

logger = logging.getLogger("sglang_feather.admission.core")


class Lifecycle:
    """Mixed into `Admission`: every event that changes which requests wait or run, or what the cache holds."""

    tree: ChunkedHashTree
    clock: Callable[[], float]
    stats: AdmissionStats
    footprint: Footprint
    _in_flight: InFlightCheck
    _forget_plan: Callable[[], None]

    def enqueue(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray | None = None,
        *,
        hashes: Sequence[ChunkHash] | None = None,
        namespace: str | None = None,
        arrival: float | None = None,
    ) -> int:
        """A request starts waiting (give token ids, or the engine's own cumulative hashes); returns chunks.

        `arrival` (on this admission's clock) defaults to now; pass the original time when re-enqueueing."""
        return self._insert(
            request_id, token_ids, hashes, namespace, self.clock() if arrival is None else arrival
        )

    def requeue(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray | None = None,
        *,
        hashes: Sequence[ChunkHash] | None = None,
        namespace: str | None = None,
    ) -> int:
        """A known request waits again with a new prompt (it grew); it keeps its original arrival time."""
        arrival = self.tree.arrival(request_id) if request_id in self.tree else self.clock()
        self._discard(request_id)
        return self._insert(request_id, token_ids, hashes, namespace, arrival)

    def _insert(self, request_id, token_ids, hashes, namespace, arrival: float) -> int:
        if (token_ids is None) == (hashes is None):
            raise ValueError("give exactly one of token_ids and hashes")
        if hashes is None:
            num_chunks = self.tree.insert(request_id, token_ids, namespace=namespace, arrival=arrival)
        else:
            num_chunks = self.tree.insert_hashes(request_id, hashes, arrival=arrival)
        self.footprint.waits(self.tree, request_id)
        return num_chunks

    # ----------------------------------------------------------------- running or not

    def activate(self, request_id: RequestId) -> None:
        """The engine put a waiting request into the batch without a proposal (e.g. found it running while
        reconciling); no decision is recorded."""
        self._activate(request_id)

    def _activate(self, request_id: RequestId, depth_hint: int | None = None) -> None:
        change = self.footprint.joining(self.tree, request_id, depth_hint)
        self.tree.activate(request_id)
        self.footprint.joined(change)

    def retract(self, request_id: RequestId) -> None:
        """A running request is pushed back to waiting (KV exhausted, preemption)."""
        change = self.footprint.leaving(self.tree, request_id)
        self.tree.deactivate(request_id)
        self.footprint.left(change)
        self.footprint.waits(self.tree, request_id)

    def finish(self, request_id: RequestId) -> None:
        """A running request completed."""
        change = self.footprint.leaving(self.tree, request_id)
        self.tree.finish(request_id)
        self.footprint.left(change)

    def abort(self, request_id: RequestId) -> bool:
        """A request left in whatever state it was (finished, aborted); False if Feather did not know it."""
        return self._discard(request_id)

    def _discard(self, request_id: RequestId) -> bool:
        """Drop a request in any state from the tree and the footprint; False if the tree did not know it."""
        state = self.tree.state(request_id)
        if state is RequestState.ACTIVE:
            change = self.footprint.leaving(self.tree, request_id)
            self.tree.discard(request_id)
            self.footprint.left(change)
            return True
        if state is RequestState.WAITING:
            self.footprint.stops_waiting(self.tree, request_id)
        return self.tree.discard(request_id)

    def leave(self, request_id: RequestId) -> bool:
        """A request is gone for good, whatever its state: a running one finished (its chunks leave the working
        set), a waiting one was aborted; False if Feather did not know it."""
        if self.tree.state(request_id) is RequestState.ACTIVE:
            self.finish(request_id)
            return True
        return self.abort(request_id)

    def forget_all(self) -> None:
        """Drop every request (the stopper keeps what it learned, the cache tier what the engine's cache
        holds); for an adapter that rebuilds its view. A tree that refuses to let its requests go is replaced
        by an empty one (the cache tier then relearns from the next events)."""
        tree = self.tree
        try:
            for rid in [*tree.waiting_ids(), *tree.active_ids()]:
                tree.discard(rid)
        except Exception:
            logger.exception("Feather could not empty its tree; starting a new one without the cache tier")
            self.tree = ChunkedHashTree(tree.chunk_size)
        self._forget_plan()
        self.footprint.reset()
        self._in_flight.reset()

    # ----------------------------------------------------------------- the engine's cache

    def cache_stored(self, hashes: Sequence[ChunkHash], parent: ChunkHash | None = None) -> int:
        """The engine's cache now holds the chunk chain `hashes` below the prefix `parent` (None: from the
        start); returns the chunks newly cached. See `ChunkedHashTree.cache_store`."""
        self.stats.num_cache_events += 1
        return self.tree.cache_store(hashes, parent)

    def cache_removed(self, hashes: Sequence[ChunkHash]) -> int:
        """The engine evicted these prefixes (and what extends them); returns the chunks uncached."""
        self.stats.num_cache_events += 1
        return self.tree.cache_remove(hashes)

    def cache_cleared(self) -> None:
        """The engine's cache was emptied."""
        self.stats.num_cache_events += 1
        self.tree.cache_clear()
