"""What admitting a candidate costs the running batch: its prefix groups, its chunks, the engine's KV room."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from sglang_feather.cht import Candidate, ChunkedHashTree
from sglang_feather.policy.base import Observation
from sglang_feather.types import ChunkHash, RequestId

# How it works.
#
# A prefix group is the first chunk of a prompt. `RunningFootprint` keeps, from the admission's lifecycle
# events and in O(log n) tree queries per event, how many requests of each group run and wait, and how many
# distinct chunks the running requests hold (the working set: what one decode step reads when every shared
# prefix is read once), and their chunks counted per request (what a step reads when nothing is shared). A request joining the batch adds the chunks below its deepest prefix some running
# request holds; a request leaving it removes the chunks below the deepest prefix another running request
# still holds (both found by bisection on the tree's `num_holding`, which never grows with depth). `observe`
# turns a candidate and these counts into the stopper's `Observation`. The engine reports its KV room as
# `KvHeadroom` (what it can still give to new requests, over the pool's size), whatever its allocator. Only a
# stopper that looks at its observation reads these counts, so with a blind one (`always`, the default) the
# admission keeps `NoFootprint` instead, and `RunningFootprint.recount` builds the counts from the tree when a
# stopper that looks takes over.


@dataclass(frozen=True)
class KvHeadroom:
    """The engine's KV room: tokens it can still give to new requests (free plus evictable, less what running
    requests are promised) and the pool's size in tokens."""

    num_free_tokens: int
    num_total_tokens: int

    def __post_init__(self) -> None:
        if self.num_total_tokens <= 0:
            raise ValueError(f"KvHeadroom num_total_tokens must be > 0, got {self.num_total_tokens!r}")

    @property
    def free_fraction(self) -> float:
        """The free share of the pool, clamped to [0, 1] (an engine's estimate may overshoot either way)."""
        return min(1.0, max(0.0, self.num_free_tokens / self.num_total_tokens))


class FootprintChange(NamedTuple):
    """What a request joining or leaving the batch changes: its group, the distinct chunks it adds or removes,
    and its own chunks."""

    group: ChunkHash
    num_distinct_chunks: int
    num_chunks: int


_NO_CHANGE = FootprintChange(ChunkHash(0), 0, 0)

Headroom = Callable[[], KvHeadroom | None]
"""Asked once per stopper decision (the room shrinks as a pass admits); None when the engine cannot say."""


def running_depth(tree: ChunkedHashTree, request_id: RequestId, min_holders: int) -> int:
    """The deepest prefix of the request that at least `min_holders` running requests hold (0: none)."""
    lo, hi = 0, tree.num_chunks(request_id)
    if tree.num_holding(request_id, 0) < min_holders:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tree.num_holding(request_id, mid) >= min_holders:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _is_running_depth(tree: ChunkedHashTree, request_id: RequestId, depth: int, num_chunks: int) -> bool:
    """Whether `depth` is `running_depth(tree, request_id, 1)`: held at `depth`, not one chunk deeper."""
    if not 0 <= depth <= num_chunks:
        return False
    held = depth == 0 or tree.num_holding(request_id, depth) >= 1
    return held and (depth == num_chunks or tree.num_holding(request_id, depth + 1) == 0)


class RunningFootprint:
    """Prefix groups running and waiting, and the running requests' distinct chunks (see "how it works")."""

    def __init__(self) -> None:
        self.running: dict[ChunkHash, int] = {}
        self.waiting: dict[ChunkHash, int] = {}
        self.num_running_chunks = 0
        self.num_read_chunks = 0
        """The running requests' chunks, each request's counted."""

    @property
    def num_groups(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Waiting requests (O(waiting groups))."""
        return sum(self.waiting.values())

    @property
    def num_waiting_running(self) -> int:
        """Waiting requests whose prefix group runs (O(running groups))."""
        waiting = self.waiting
        return sum(waiting.get(group, 0) for group in self.running)

    def reset(self) -> None:
        self.running.clear()
        self.waiting.clear()
        self.num_running_chunks = 0
        self.num_read_chunks = 0

    def waits(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """The request started waiting (call after the tree knows it)."""
        group = tree.prefix_hash(request_id)
        self.waiting[group] = self.waiting.get(group, 0) + 1

    def stops_waiting(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """A waiting request leaves the queue without running (call while the tree still holds it)."""
        _decrement(self.waiting, tree.prefix_hash(request_id))

    def joining(
        self, tree: ChunkedHashTree, request_id: RequestId, depth_hint: int | None = None
    ) -> FootprintChange:
        """A waiting request is about to run (ask before the tree activates it): its group, the chunks it
        adds to the working set and its own. `joined` applies them once the tree took the change. `depth_hint`
        is what its candidate said of its running depth: two probes confirm it, else it is searched for."""
        num_chunks = tree.num_chunks(request_id)
        depth = depth_hint
        if depth is None or not _is_running_depth(tree, request_id, depth, num_chunks):
            depth = running_depth(tree, request_id, 1)
        return FootprintChange(tree.prefix_hash(request_id), num_chunks - depth, num_chunks)

    def joined(self, change: FootprintChange) -> None:
        _decrement(self.waiting, change.group)
        self.running[change.group] = self.running.get(change.group, 0) + 1
        self.num_running_chunks += change.num_distinct_chunks
        self.num_read_chunks += change.num_chunks

    def leaving(self, tree: ChunkedHashTree, request_id: RequestId) -> FootprintChange:
        """A running request is about to stop running (ask before the tree finishes or deactivates it): its
        group, the chunks no other running request holds and its own. `left` applies them."""
        num_chunks = tree.num_chunks(request_id)
        removed = num_chunks - running_depth(tree, request_id, 2)
        return FootprintChange(tree.prefix_hash(request_id), removed, num_chunks)

    def left(self, change: FootprintChange) -> None:
        _decrement(self.running, change.group)
        self.num_running_chunks -= change.num_distinct_chunks
        self.num_read_chunks -= change.num_chunks

    @classmethod
    def recount(cls, tree: ChunkedHashTree) -> RunningFootprint:
        """The footprint of the requests `tree` holds now, counted from scratch (O(their chunks))."""
        footprint = cls()
        for request_id in tree.waiting_ids():
            footprint.waits(tree, request_id)
        chunks: set[ChunkHash] = set()
        for request_id in tree.active_ids():
            group = tree.prefix_hash(request_id)
            footprint.running[group] = footprint.running.get(group, 0) + 1
            path = tree.path_hashes(request_id)
            chunks.update(path)
            footprint.num_read_chunks += len(path)
        footprint.num_running_chunks = len(chunks)
        return footprint


class NoFootprint:
    """The footprint of an admission whose stopper never looks at an observation: it keeps nothing, so the
    lifecycle's events cost no tree queries for it (`RunningFootprint.recount` when a seeing stopper takes
    over)."""

    def reset(self) -> None:
        return None

    def waits(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        return None

    def stops_waiting(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        return None

    def joining(
        self, tree: ChunkedHashTree, request_id: RequestId, depth_hint: int | None = None
    ) -> FootprintChange:
        return _NO_CHANGE

    def joined(self, change: FootprintChange) -> None:
        return None

    def leaving(self, tree: ChunkedHashTree, request_id: RequestId) -> FootprintChange:
        return _NO_CHANGE

    def left(self, change: FootprintChange) -> None:
        return None


Footprint = RunningFootprint | NoFootprint
"""What the admission keeps of the batch's footprint: the counts for a stopper that looks, else nothing."""


def _decrement(counts: dict[ChunkHash, int], key: ChunkHash) -> None:
    num = counts.get(key, 0) - 1
    if num > 0:
        counts[key] = num
    else:
        counts.pop(key, None)


def observe(
    tree: ChunkedHashTree,
    footprint: RunningFootprint,
    candidate: Candidate,
    batch_size: int,
    wait_s: Callable[[RequestId], float],
    headroom: Headroom | None,
) -> Observation:
    """The stopper's view of `candidate` joining a batch of `batch_size` requests."""
    request_id = candidate.request_id
    oldest = tree.oldest()
    room = headroom() if headroom is not None else None
    free = room.free_fraction if room is not None else None
    return Observation(
        batch_size=batch_size,
        depth_before=candidate.depth_before,
        depth_after=candidate.depth_after,
        num_sharing=candidate.num_sharing,
        num_waiting=tree.num_waiting,
        wait_s=wait_s(request_id),
        adds_group=candidate.adds_group,
        num_groups_running=footprint.num_groups,
        num_running_chunks=footprint.num_running_chunks,
        num_new_chunks=candidate.num_chunks - candidate.depth_running,
        num_missing=candidate.num_missing,
        num_group_waiting=max(0, footprint.waiting.get(tree.prefix_hash(request_id), 0) - 1),
        oldest_wait_s=max(0.0, wait_s(oldest)) if oldest is not None else 0.0,
        kv_free_fraction=free if free is None or math.isfinite(free) else None,
        num_read_chunks=footprint.num_read_chunks,
        num_chunks=candidate.num_chunks,
    )
