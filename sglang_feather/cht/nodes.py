"""Tree nodes, tracked requests and the lazy-heap helpers the Chunked Hash Tree is built from."""

from __future__ import annotations

import enum
import heapq
from typing import overload

from sglang_feather.types import ChunkHash, RequestId


class RequestState(enum.Enum):
    WAITING = "waiting"
    ACTIVE = "active"


class PrefixNode:
    __slots__ = (
        "hash",
        "parent",
        "depth",
        "serial",
        "num_active",
        "num_waiting",
        "candidates",
        "best",
        "global_key",
        "arrivals",
        "stranger_key",
        "cached",
        "is_alive",
    )

    def __init__(self, chunk_hash: ChunkHash, parent: PrefixNode | None, depth: int, serial: int):
        self.hash = chunk_hash
        self.parent = parent
        """The node one chunk up; None at the first level (the empty prefix above it is no node)."""
        self.depth = depth
        self.serial = serial
        """Creation order: siblings are visited in this order by `prefix_order` (first seen first)."""
        self.num_active = 0
        self.num_waiting = 0
        self.candidates: list[tuple] = []
        self.best: tuple | None = None
        self.global_key: tuple | None = None
        """Key of this node's one live entry in the tree's global heap (None: no entry needed)."""
        self.arrivals: list[tuple] | None = [] if depth == 1 else None
        """First-level nodes only: lazy min-heap of (arrival, seq, request) of the waiting requests below."""
        self.stranger_key: tuple[float, int] | None = None
        """First-level nodes only: key of this node's one live entry in the tree's stranger heap."""
        self.cached = False
        """The engine's KV cache holds this prefix (the cache tier says so, and so it does for the parent)."""
        self.is_alive = True

    @property
    def is_covered(self) -> bool:
        """A running request holds this prefix or the engine's cache does: admitting a request through it
        recomputes none of it."""
        return self.num_active > 0 or self.cached


class TrackedRequest:
    __slots__ = ("id", "path", "arrival", "seq", "state", "suspended")

    def __init__(self, request_id: RequestId, path: list[PrefixNode], arrival: float, seq: int):
        self.id = request_id
        self.path = path
        self.arrival = arrival
        self.seq = seq
        self.state: RequestState | None = RequestState.WAITING
        """None once it has left the tree (its heap entries then read as stale)."""
        self.suspended = False

    @property
    def key(self) -> tuple[float, int]:
        return (self.arrival, self.seq)


_WAITING = RequestState.WAITING

COMPACT_MIN = 64


@overload
def best_of(entry: tuple) -> tuple: ...
@overload
def best_of(entry: None) -> None: ...
@overload
def best_of(entry: tuple | None) -> tuple | None: ...
def best_of(entry: tuple | None) -> tuple | None:
    """A `best` cache value (arrival, seq, request) from a valid candidate entry (arrival, seq, push, item)."""
    if entry is None:
        return None
    item = entry[3]
    return (*entry[:2], item if item.__class__ is TrackedRequest else item.best[2])


def compacted(heap: list[tuple]) -> list[tuple]:
    """Entries that may still be valid, one per item, as a heap."""
    kept: dict[int, tuple] = {}
    for entry in heap:
        item = entry[3]
        if item.__class__ is TrackedRequest:
            alive = item.state is _WAITING and not item.suspended
        else:
            alive = (
                item.is_alive and not item.is_covered and item.best is not None and item.best[:2] == entry[:2]
            )
        if alive and (id(item) not in kept or entry < kept[id(item)]):
            kept[id(item)] = entry
    compacted = list(kept.values())
    heapq.heapify(compacted)
    return compacted


def compacted_global(heap: list[tuple]) -> list[tuple]:
    """The live entry per covered node (the one that matches the node's `global_key`); entries are
    (-depth, -runs, -requests through it, arrival, seq, push, node)."""
    kept = {
        id(entry[6]): entry
        for entry in heap
        if entry[:5] == entry[6].global_key and entry[6].is_alive and entry[6].is_covered
    }
    compacted = list(kept.values())
    for entry in heap:
        entry[6].global_key = None
    for entry in compacted:
        entry[6].global_key = entry[:5]
    heapq.heapify(compacted)
    return compacted


def compacted_strangers(heap: list[tuple]) -> list[tuple]:
    """The live entry per uncovered first-level node (the one matching its `stranger_key`)."""
    kept = {
        id(entry[3]): entry
        for entry in heap
        if entry[:2] == entry[3].stranger_key and entry[3].is_alive and not entry[3].is_covered
    }
    compacted = list(kept.values())
    for entry in heap:
        entry[3].stranger_key = None
    for entry in compacted:
        entry[3].stranger_key = entry[:2]
    heapq.heapify(compacted)
    return compacted


def compacted_arrivals(heap: list[tuple]) -> list[tuple]:
    """One entry per waiting, unsuspended request, as a heap (entries are (arrival, seq, request))."""
    kept = {id(entry[2]): entry for entry in heap if entry[2].state is _WAITING and not entry[2].suspended}
    compacted = list(kept.values())
    heapq.heapify(compacted)
    return compacted


def keep_bounded(node: PrefixNode) -> None:
    """Compact a node's candidate and arrival heaps once their entries outnumber its live requests by the
    compaction bound (what `_push` and `_push_arrival` keep on every push)."""
    live = node.num_waiting + node.num_active
    if len(node.candidates) > 4 * live + COMPACT_MIN:
        node.candidates = compacted(node.candidates)
    if node.arrivals is not None and len(node.arrivals) > 4 * live + COMPACT_MIN:
        node.arrivals = compacted_arrivals(node.arrivals)
