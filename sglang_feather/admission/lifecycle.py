"""The admission's request lifecycle: the engine's events applied to the CHT and to the counts kept beside it."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from sglang_feather.admission.costs import Footprint, FootprintChange, NoFootprint, RunningFootprint
from sglang_feather.admission.demand import WaitingDemand
from sglang_feather.cht import ChunkedHashTree, RequestState
from sglang_feather.types import ChunkHash, RequestId

# How it works. Every event that changes which requests wait or run goes to the tree the admission hands in
# and, around the tree's own change, to the counts derived from it: the batch's footprint (`costs.py`), kept
# only for a stopper that looks at its observations, and the running groups' waiting demand (`demand.py`),
# kept only for the concentration rule. Each count asks the tree before or after the change, as it needs.


class Lifecycle:
    """Applies request events to a tree and keeps the footprint and the waiting demand equal to it."""

    def __init__(self, *, keeps_demand: bool) -> None:
        self.footprint: Footprint = NoFootprint()
        """The counts a stopper that looks is shown (`keep_footprint`), else nothing."""
        self.demand: WaitingDemand | None = WaitingDemand() if keeps_demand else None
        """The concentration rule's count of waiting requests of running groups (None without the rule)."""

    def keep_footprint(self, tree: ChunkedHashTree) -> RunningFootprint:
        """The footprint, counted from `tree` if none was kept (a stopper that looks took over)."""
        if isinstance(self.footprint, NoFootprint):
            self.footprint = RunningFootprint.recount(tree)
        return self.footprint

    def drop_footprint(self) -> None:
        """Keep no footprint (the stopper is blind)."""
        self.footprint = NoFootprint()

    def reset(self) -> None:
        """The tree was emptied (or replaced by an empty one)."""
        self.footprint.reset()
        if self.demand is not None:
            self.demand.reset()

    def insert(
        self,
        tree: ChunkedHashTree,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray | None,
        hashes: Sequence[ChunkHash] | None,
        namespace: str | None,
        arrival: float,
    ) -> int:
        """A request starts waiting (token ids or the engine's hashes, exactly one); returns its chunks."""
        if token_ids is not None and hashes is None:
            num_chunks = tree.insert(request_id, token_ids, namespace=namespace, arrival=arrival)
        elif hashes is not None and token_ids is None:
            num_chunks = tree.insert_hashes(request_id, hashes, arrival=arrival)
        else:
            raise ValueError("give exactly one of token_ids and hashes")
        self._waits(tree, request_id)
        return num_chunks

    def activate(self, tree: ChunkedHashTree, request_id: RequestId, depth_hint: int | None = None) -> None:
        """A waiting request joins the batch (`depth_hint`: its candidate's running depth, if known)."""
        change = self.footprint.joining(tree, request_id, depth_hint)
        if self.demand is not None:
            self.demand.joining(tree, request_id)
        tree.activate(request_id)
        self.footprint.joined(change)

    def joined_running(self, num_requests: int) -> None:
        """`num_requests` requests of running groups joined the batch already activated in the tree (a planned
        pass's admissions; its blind stopper keeps no footprint)."""
        if self.demand is not None:
            self.demand.joined_running(num_requests)

    def retract(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """A running request is pushed back to waiting."""
        change = self._leaving(tree, request_id)
        tree.deactivate(request_id)
        self.footprint.left(change)
        self._waits(tree, request_id)

    def finish(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """A running request completed."""
        change = self._leaving(tree, request_id)
        tree.finish(request_id)
        self.footprint.left(change)

    def discard(self, tree: ChunkedHashTree, request_id: RequestId) -> bool:
        """Drop a request in any state; False if the tree did not know it."""
        state = tree.state(request_id)
        if state is RequestState.ACTIVE:
            change = self._leaving(tree, request_id)
            tree.discard(request_id)
            self.footprint.left(change)
            return True
        if state is RequestState.WAITING:
            self.footprint.stops_waiting(tree, request_id)
            if self.demand is not None:
                self.demand.stops_waiting(tree, request_id)
        return tree.discard(request_id)

    def _waits(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        self.footprint.waits(tree, request_id)
        if self.demand is not None:
            self.demand.waits(tree, request_id)

    def _leaving(self, tree: ChunkedHashTree, request_id: RequestId) -> FootprintChange:
        if self.demand is not None:
            self.demand.leaving(tree, request_id)
        return self.footprint.leaving(tree, request_id)
