"""`Candidate`: what `best()` reports about the next waiting request; `TakenPicks`: what `take_picks` took."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

from sglang_feather.cht.checks import checked_count, checked_max_missing
from sglang_feather.types import RequestId


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
    arrival: float
    """When it arrived, as its insert gave it (its insertion number when none was given): the ranking's last
    tie-break, and where its wait starts on the inserter's clock."""

    @property
    def delta(self) -> int:
        return self.depth_before - self.depth_after

    @property
    def adds_group(self) -> bool:
        """No running request holds even its first chunk: admitting it adds a prefix group to the batch."""
        return self.depth_running == 0

    @property
    def is_stranger(self) -> bool:
        """Nothing of it is covered, neither running nor cached: the ranking serves it last."""
        return self.depth_running == 0 and self.depth_cached == 0

    @property
    def runs_uncached(self) -> bool:
        """Running requests hold chunks of its prompt that the cache does not: their prefill is still computing
        them. A cache never holds a whole prompt (its last token is always computed), so a prompt that running
        requests hold whole counts one chunk less."""
        return min(self.depth_running, self.num_chunks - 1) > self.depth_cached


@dataclass(frozen=True, slots=True)
class TakenPicks:
    """`take_picks(max_picks, skip_running_uncached, max_missing, first)`: the picks in order, each activated
    before the next was taken (all but the last, unless nothing was left after it), and the requests skipped
    on the way."""

    candidates: list[Candidate]
    skipped: list[RequestId]
    """Requests suspended on the way (their prefix runs uncached), in order."""
    skip_ends: list[int]
    """`len(skipped)` when each pick was taken: pick i's skips are `skipped[skip_ends[i-1]:skip_ends[i]]`."""
    is_exhausted: bool
    """Nothing (unsuspended) was left to pick after the last one; the last pick was activated too."""


class _Steps(Protocol):
    def best(self) -> Candidate | None: ...
    def candidate(self, request_id: RequestId) -> Candidate: ...
    def is_suspended(self, request_id: RequestId) -> bool: ...
    def suspend(self, request_id: RequestId) -> None: ...
    def activate(self, request_id: RequestId) -> None: ...


def take_picks_stepwise(
    tree: _Steps,
    max_picks: int,
    skip_running_uncached: bool,
    max_missing: int = sys.maxsize,
    first: RequestId | None = None,
) -> TakenPicks:
    """What either tree's `take_picks(max_picks, skip_running_uncached, max_missing=None, first=None)` does, one
    `candidate` / `best` / `suspend` / `activate` at a time (the Python tree and the reference model run this;
    the compiled tree runs its own loop and is held to it).

    Up to `max_picks` picks of `best()`, each activated before the next is taken (the last one only when
    nothing is left after it); with `skip_running_uncached`, a best whose prefix runs uncached
    (`Candidate.runs_uncached`) is suspended and passed over; with `max_missing` (>= 1), the pick whose
    `num_missing` brings the picks' sum to it is the last (what an engine's prefill budget admits, in chunks).
    `first`, a waiting request (the aging guard's due one), is the first pick, as `candidate` describes it;
    with `skip_running_uncached` a `first` whose prefix runs uncached is suspended and nothing is taken. What a
    pass planned ahead takes while no request can fall due, in one call."""
    picks: list[Candidate] = []
    skipped: list[RequestId] = []
    ends: list[int] = []
    num_missing = 0
    if first is not None:
        head = tree.candidate(first)
        if tree.is_suspended(first):
            tree.suspend(first)  # raises: a suspended request cannot be taken
        if max_picks and skip_running_uncached and head.runs_uncached:
            tree.suspend(first)
            return TakenPicks(picks, [first], ends, False)
        if max_picks:
            picks.append(head)
            ends.append(0)
            num_missing = head.num_missing
    for i in range(len(picks), max_picks):
        if num_missing >= max_missing:
            break
        if i:
            tree.activate(picks[-1].request_id)
        candidate = tree.best()
        while candidate is not None and skip_running_uncached and candidate.runs_uncached:
            tree.suspend(candidate.request_id)
            skipped.append(candidate.request_id)
            candidate = tree.best()
        if candidate is None:
            return TakenPicks(picks, skipped, ends, True)
        picks.append(candidate)
        ends.append(len(skipped))
        num_missing += candidate.num_missing
    return TakenPicks(picks, skipped, ends, False)


def checked_picks(
    max_picks: int, skip_running_uncached: bool, max_missing: int | None
) -> tuple[int, bool, int]:
    """`take_picks`' arguments checked, as either tree checks them: `max_picks` a count, `max_missing` (None: no
    budget) at least 1."""
    return (
        checked_count("max_picks", max_picks),
        bool(skip_running_uncached),
        checked_max_missing(max_missing),
    )
