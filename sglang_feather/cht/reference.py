"""A brute-force Chunked Hash Tree: plain lists and sets, obviously correct, used to check the real one."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_feather.cht.candidate import TakenPicks, checked_picks, take_picks_stepwise
from sglang_feather.cht.errors import (
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.nodes import RequestState
from sglang_feather.cht.tree import Candidate
from sglang_feather.types import ChunkHash, RequestId


class ReferenceTree:
    """Same operations and results as `ChunkedHashTree`, recomputed from scratch on every query."""

    def __init__(self) -> None:
        self.hashes: dict[RequestId, list[ChunkHash]] = {}
        self.states: dict[RequestId, RequestState] = {}
        self.order: dict[RequestId, tuple[float, int]] = {}
        self.suspended: set[RequestId] = set()
        self.first_seen: dict[ChunkHash, int] = {}
        """A rank per hash, renewed when a hash is inserted while no tracked request holds it."""
        self.cache: dict[ChunkHash, ChunkHash | None] = {}
        """Cached hash -> its parent hash; closed under prefixes."""
        self._seq = 0
        self._num_seen = 0

    def take_picks(
        self,
        max_picks: int,
        skip_running_uncached: bool,
        max_missing: int | None = None,
        first: RequestId | None = None,
    ) -> TakenPicks:
        return take_picks_stepwise(self, *checked_picks(max_picks, skip_running_uncached, max_missing), first)

    def insert_hashes(self, rid: RequestId, hashes: Sequence[ChunkHash], arrival: float | None = None) -> int:
        if rid in self.hashes:
            raise DuplicateRequest(rid)
        if not hashes:
            raise EmptyPrompt(rid)
        held = {h for path in self.hashes.values() for h in path}
        for h in hashes:
            if h not in held:
                self.first_seen[h] = self._num_seen
                self._num_seen += 1
        self.hashes[rid] = list(hashes)
        self.states[rid] = RequestState.WAITING
        self.order[rid] = (float(self._seq) if arrival is None else float(arrival), self._seq)
        self._seq += 1
        return len(hashes)

    def _move(self, rid: RequestId, src: RequestState, dst: RequestState | None) -> None:
        if rid not in self.states:
            raise UnknownRequest(rid)
        if self.states[rid] is not src:
            raise InvalidTransition(rid)
        self.suspended.discard(rid)
        if dst is None:
            del self.hashes[rid], self.states[rid], self.order[rid]
        else:
            self.states[rid] = dst

    def activate(self, rid: RequestId) -> None:
        self._move(rid, RequestState.WAITING, RequestState.ACTIVE)

    def deactivate(self, rid: RequestId) -> None:
        self._move(rid, RequestState.ACTIVE, RequestState.WAITING)

    def finish(self, rid: RequestId) -> None:
        self._move(rid, RequestState.ACTIVE, None)

    def remove(self, rid: RequestId) -> None:
        self._move(rid, RequestState.WAITING, None)

    def suspend(self, rid: RequestId) -> None:
        if rid not in self.states:
            raise UnknownRequest(rid)
        if self.states[rid] is not RequestState.WAITING or rid in self.suspended:
            raise InvalidTransition(rid)
        self.suspended.add(rid)

    def resume(self, rid: RequestId) -> None:
        if rid not in self.states:
            raise UnknownRequest(rid)
        if rid not in self.suspended:
            raise InvalidTransition(rid)
        self.suspended.remove(rid)

    def resume_all(self) -> None:
        self.suspended.clear()

    def is_suspended(self, rid: RequestId) -> bool:
        return rid in self.suspended

    def candidate(self, rid: RequestId) -> Candidate:
        if rid not in self.states:
            raise UnknownRequest(rid)
        if self.states[rid] is not RequestState.WAITING:
            raise InvalidTransition(rid)
        return self.describe(rid)

    def cache_store(self, hashes: Sequence[ChunkHash], parent: ChunkHash | None = None) -> int:
        if parent is not None and parent not in self.cache:
            return 0
        above, fresh = parent, {}
        tracked = {}
        for path in self.hashes.values():
            for depth, h in enumerate(path):
                tracked[h] = path[depth - 1] if depth else None
        for h in hashes:
            if h in fresh or self.cache.get(h, above) != above or tracked.get(h, above) != above:
                raise HashChainError(h)
            if h not in self.cache:
                fresh[h] = above
            above = h
        self.cache.update(fresh)
        return len(fresh)

    def cache_remove(self, hashes: Sequence[ChunkHash]) -> int:
        before = len(self.cache)
        doomed = {h for h in hashes if h in self.cache}
        while True:
            more = {h for h, parent in self.cache.items() if parent in doomed and h not in doomed}
            if not more:
                break
            doomed |= more
        for h in doomed:
            del self.cache[h]
        return before - len(self.cache)

    def cache_clear(self) -> None:
        self.cache.clear()

    def cached_depth(self, rid: RequestId) -> int:
        depth, above = 0, None
        for h in self.hashes[rid]:
            if h not in self.cache or self.cache[h] != above:
                break
            depth, above = depth + 1, h
        return depth

    def running_depth(self, rid: RequestId) -> int:
        working = self.working_set()
        depth = 0
        for h in self.hashes[rid]:
            if h not in working:
                break
            depth += 1
        return depth

    def ids(self, state: RequestState) -> list[RequestId]:
        return [rid for rid, s in self.states.items() if s is state]

    def working_set(self) -> set[ChunkHash]:
        return {h for rid in self.ids(RequestState.ACTIVE) for h in self.hashes[rid]}

    def arrival(self, rid: RequestId) -> float:
        return self.order[rid][0]

    def num_missing(self, rid: RequestId) -> int:
        return len(self.hashes[rid]) - max(self.running_depth(rid), self.cached_depth(rid))

    def shared_depth(self) -> int:
        active = [self.hashes[rid] for rid in self.ids(RequestState.ACTIVE)]
        if not active:
            return 0
        depth = 0
        while all(len(path) > depth for path in active) and len({path[depth] for path in active}) == 1:
            depth += 1
        return depth

    def num_running_groups(self) -> int:
        return len({self.hashes[rid][0] for rid in self.ids(RequestState.ACTIVE)})

    def eligible(self) -> list[RequestId]:
        return [rid for rid in self.ids(RequestState.WAITING) if rid not in self.suspended]

    def covered_depth(self, rid: RequestId) -> int:
        return max(self.running_depth(rid), self.cached_depth(rid))

    def best(self) -> Candidate | None:
        """Tier 1, requests with a covered first chunk: deepest covered prefix, then one running requests hold
        before one only the cache holds, then the most requests (waiting or running) through it, then arrival;
        else FCFS."""
        eligible = self.eligible()
        if not eligible:
            return None
        covered = {rid: self.covered_depth(rid) for rid in eligible}
        sharing = [rid for rid in eligible if covered[rid]]
        if sharing:
            paths = list(self.hashes.values())
            working = self.working_set()

            def rank(rid: RequestId) -> tuple:
                depth = covered[rid]
                node = self.hashes[rid][depth - 1]
                weight = sum(len(path) >= depth and path[depth - 1] == node for path in paths)
                return (-depth, -(node in working), -weight, *self.order[rid])

            rid = min(sharing, key=rank)
        else:
            rid = min(eligible, key=lambda r: self.order[r])
        return self.describe(rid)

    def prefix_hash(self, rid: RequestId) -> ChunkHash:
        return self.hashes[rid][0]

    def oldest_stranger(self) -> RequestId | None:
        strangers = [rid for rid in self.eligible() if not self.covered_depth(rid)]
        return min(strangers, key=lambda r: self.order[r]) if strangers else None

    def oldest(self) -> RequestId | None:
        eligible = self.eligible()
        return min(eligible, key=lambda r: self.order[r]) if eligible else None

    def prefix_order(self, rids: list[RequestId]) -> list[RequestId]:
        """Stable sort by the first-seen ranks of each path's hashes: the trie's depth-first order."""
        return sorted(rids, key=lambda r: [self.first_seen[h] for h in self.hashes[r]])

    def describe(self, rid: RequestId) -> Candidate:
        path = self.hashes[rid]
        active = [self.hashes[r] for r in self.ids(RequestState.ACTIVE)]
        if not active:
            before = after = len(path)
        else:
            after = 0
            while after < min(self.shared_depth(), len(path)) and all(
                p[after] == path[after] for p in active
            ):
                after += 1
            before = self.shared_depth() if len(active) > 1 else after
        sharing = (
            sum(
                1
                for r in self.ids(RequestState.WAITING)
                if r != rid and self.hashes[r][:after] == path[:after]
            )
            if after
            else 0
        )
        running, cached = self.running_depth(rid), self.cached_depth(rid)
        missing = len(path) - max(running, cached)
        return Candidate(rid, len(path), missing, running, cached, before, after, sharing, self.order[rid][0])
