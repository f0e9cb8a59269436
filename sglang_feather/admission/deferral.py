"""The in-flight check: is a candidate's prefix, shared with running requests, still being computed?"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang_feather.cht import Candidate, ChunkedHashTree, RequestState
from sglang_feather.types import RequestId

# How it works.
#
# A candidate is *in flight* when running requests hold chunks of its prompt that the engine's prefix cache
# does not hold yet (page-rounded): their prefill is still computing that prefix (possibly split by chunked
# prefill), so admitting the candidate now would compute it twice. The cache tier answers where the adapter
# feeds the engine's KV events (`depth_running > depth_cached`). Otherwise the engine's cache is asked, a
# prefix match per candidate; a cold group's followers are asked one after another, so the answer is reused
# within the pass: a request whose cache hit stops at C tokens inside its chunk d (not its last chunk) tells
# that every request sharing its first d chunks hits exactly C too (same tokens up to the uncached page, and
# more prompt after it), until the next admission may change the cache (`CacheFrontier`). Without either,
# only this pass's own admissions count as in flight. The whole-prompt cap: a cache never matches a whole
# prompt (its last token is always computed), so a request fully held by running ones compares one chunk
# less.


@dataclass(frozen=True)
class CacheFrontier:
    """Where the engine's cache hit of a waiting request ends: `num_cached` tokens, inside its chunk `depth`.

    Valid for every request that shares the first `depth` chunks, while the cache is unchanged: their tokens
    agree up to `depth` full chunks, the uncached page at `num_cached` lies inside them (the frontier is only
    kept when it does), and each has prompt left after them, so an engine that never matches a whole prompt
    still matches up to `num_cached`. An engine that also caps the match per request (SGLang with input
    logprobs from a start position) may see a different hit for such a request; the deferral is a one-pass
    hint, so the cost of that is at most one pass of waiting or one prefix computed twice."""

    request_id: RequestId
    depth: int
    num_cached: int


class InFlightCheck:
    """Answers `is_in_flight` for one scheduling pass at a time; `admitted` after every admission."""

    def __init__(self, *, enabled: bool, page_size: int, cache_events: bool) -> None:
        self.enabled = enabled
        self.page_size = page_size
        self.cache_events = cache_events
        self.needs_engine = enabled and not cache_events
        """The check reads more than the tree: the engine's cache (`cached_tokens`) or this pass's admissions.
        Only such a check keeps anything within a pass (frontiers, admissions) for `reset` to forget."""
        self._frontiers: list[CacheFrontier] = []
        self._pass_admitted: list[RequestId] = []

    @property
    def num_admitted(self) -> int:
        return len(self._pass_admitted)

    def reset(self) -> None:
        """A pass starts or ends: forget its admissions and frontiers."""
        self._frontiers.clear()
        self._pass_admitted.clear()

    def admitted(self, request_id: RequestId) -> None:
        """The engine admitted a request: the cache may change, so the frontiers go. Kept only where the check
        reads them (it asks the engine, or reads this pass's admissions); with cache events or the check off
        an admission changes nothing here."""
        if self.needs_engine:
            self._pass_admitted.append(request_id)
            self._frontiers.clear()

    def is_in_flight(
        self,
        tree: ChunkedHashTree,
        candidate: Candidate,
        cached_tokens: Callable[[RequestId], int] | None,
    ) -> bool:
        """Running requests share chunks with the candidate beyond what the engine's cache holds."""
        if not self.enabled:
            return False
        if self.cache_events:
            return candidate.runs_uncached
        covered = candidate.depth_running
        if covered == candidate.num_chunks:
            covered -= 1
        if covered <= 0:
            return False
        if cached_tokens is None:
            return self._shares_only_this_pass(tree, candidate, covered)
        page = self.page_size
        shared = covered * tree.chunk_size
        return shared - shared % page > self._cached_tokens(tree, candidate, cached_tokens) // page * page

    def _cached_tokens(
        self, tree: ChunkedHashTree, candidate: Candidate, cached_tokens: Callable[[RequestId], int]
    ) -> int:
        """`cached_tokens(candidate)`, answered from this pass's frontiers when the candidate shares one."""
        rid = candidate.request_id
        for frontier in self._frontiers:
            if frontier.request_id in tree and tree.shares_prefix(rid, frontier.request_id, frontier.depth):
                return frontier.num_cached
        num_cached = cached_tokens(rid)
        chunk_size = tree.chunk_size
        depth = num_cached // chunk_size + 1
        if depth < candidate.num_chunks and num_cached + self.page_size <= depth * chunk_size:
            self._frontiers.append(CacheFrontier(rid, depth, num_cached))
        return num_cached

    def _shares_only_this_pass(self, tree: ChunkedHashTree, candidate: Candidate, covered: int) -> bool:
        """Without a view of the cache: the shared chunks are held only by requests admitted in this pass."""
        if not self._pass_admitted:
            return False
        rid = candidate.request_id
        fresh = sum(
            tree.state(other) is RequestState.ACTIVE and tree.shares_prefix(rid, other, covered)
            for other in self._pass_admitted
        )
        return tree.num_holding(rid, covered) == fresh
