"""The admission component: which waiting requests join the batch, behind one API every engine adapter shares."""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sglang_feather.admission.config import AdmissionConfig
from sglang_feather.admission.deferral import InFlightCheck
from sglang_feather.admission.results import AdmissionPlan, AdmissionStats, Pick, Proposal, StopReason
from sglang_feather.admission.rewards import RewardWindow
from sglang_feather.admission.views import TreeViews
from sglang_feather.cht import ChunkedHashTree, RequestState
from sglang_feather.policy import AgingGuard, make_policy
from sglang_feather.policy.base import Decision, DecisionRecord, Observation, StoppingPolicy
from sglang_feather.policy.context import is_forced
from sglang_feather.policy.persist import load_state, save_state
from sglang_feather.types import ChunkHash, RequestId

logger = logging.getLogger(__name__)

# How it works.
#
# An engine runs one scheduling pass at a time: `begin_pass()`, then `propose(batch_size)` for each next
# candidate, then `end_pass()`. A candidate is normally the CHT's best waiting request (requests whose prompt
# running requests or the engine's cache hold first, deepest covered prefix first, then the heaviest group,
# then arrival; requests with nothing covered in arrival order), but once the oldest waiting request is due
# (the aging guard) one due request per pass goes first. A candidate whose prefix shared with running requests
# is still being computed (`deferral`) is skipped: suspended in the CHT for the rest of the pass, which goes on
# with the next candidate; `end_pass()` puts it back. A due request is deferred too (for that pass: the prefix
# it would compute twice is cached by the next). For any other candidate the stopper sees an `Observation`
# (batch size, shared-prefix depth before/after, w, queue length, wait) and says ADD or STOP; the engine
# `accept`s (the request's chunks enter the working set), `decline`s (STOP ends the pass) or `withdraw`s (its
# own budget refused; nothing is learned). An engine that walks its
# own queue splits `propose` in two: `next_pick()` says which request to put where its loop reaches next,
# `decide(pick, batch_size)` asks the stopper when it gets there, so the pick and the decision come from one
# view of the cache. The decisions are rewarded by the decode throughput of the window their pass opened
# (`rewards`). Lifecycle events (`finish`, `abort`, `leave`, `retract`, `requeue`) keep the CHT equal to the
# engine's queues.


class Admission(TreeViews):
    """The CHT, a stopper and the aging guard behind one event API shared by every engine adapter."""

    def __init__(
        self,
        tree: ChunkedHashTree,
        stopper: StoppingPolicy,
        guard: AgingGuard,
        clock: Callable[[], float] = time.monotonic,
        state_path: str | None = None,
        defer_uncached_prefix: bool = True,
        page_size: int = 1,
        state_tag: Mapping[str, str] | None = None,
        cache_events: bool = False,
    ):
        self.tree = tree
        self.stopper = stopper
        self.guard = guard
        self.clock = clock
        self.stats = AdmissionStats()
        self.page_size = page_size
        self.state_tag = dict(state_tag or {})
        self._state_path = state_path
        self._arrivals: dict[RequestId, float] = {}
        self._skipped: list[RequestId] = []
        self._in_flight = InFlightCheck(
            enabled=defer_uncached_prefix, page_size=page_size, cache_events=cache_events
        )
        self._window = RewardWindow(stopper, self.stats, clock)
        self._decided_this_pass = False
        self._aged_this_pass = False
        if state_path is not None:
            load_state(stopper, state_path, tag=self.state_tag)

    @classmethod
    def from_config(cls, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic) -> Admission:
        return cls(
            ChunkedHashTree(config.chunk_size),
            make_policy(config.stopper, seed=config.seed, **config.stopper_options),
            AgingGuard(config.max_wait_s, when_overtaken=config.due_when_overtaken),
            clock=clock,
            state_path=config.state_path,
            defer_uncached_prefix=config.defer_uncached_prefix,
            page_size=config.page_size,
            state_tag=config.state_tag,
            cache_events=config.cache_events,
        )

    # ----------------------------------------------------------------- request lifecycle

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
        arrival = self._arrivals.get(request_id, self.clock())
        self.tree.discard(request_id)
        self._arrivals.pop(request_id, None)
        return self._insert(request_id, token_ids, hashes, namespace, arrival)

    def _insert(self, request_id, token_ids, hashes, namespace, arrival: float) -> int:
        if (token_ids is None) == (hashes is None):
            raise ValueError("give exactly one of token_ids and hashes")
        if hashes is None:
            num_chunks = self.tree.insert(request_id, token_ids, namespace=namespace, arrival=arrival)
        else:
            num_chunks = self.tree.insert_hashes(request_id, hashes, arrival=arrival)
        self._arrivals[request_id] = arrival
        return num_chunks

    def activate(self, request_id: RequestId) -> None:
        """The engine put a waiting request into the batch without a proposal (e.g. found it running while
        reconciling); no decision is recorded."""
        self.tree.activate(request_id)

    def retract(self, request_id: RequestId) -> None:
        """A running request is pushed back to waiting (KV exhausted, preemption)."""
        self.tree.deactivate(request_id)

    def finish(self, request_id: RequestId) -> None:
        """A running request completed."""
        self.tree.finish(request_id)
        del self._arrivals[request_id]

    def abort(self, request_id: RequestId) -> bool:
        """A request left in whatever state it was (finished, aborted); False if Feather did not know it."""
        self._arrivals.pop(request_id, None)
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
        self._arrivals.clear()
        self._skipped.clear()
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

    # ----------------------------------------------------------------- one scheduling pass

    def begin_pass(self) -> None:
        """A new scheduling pass starts (stoppers with per-pass state reset it)."""
        self._resume_skipped()
        self.stopper.begin_pass()
        self._in_flight.reset()
        self._decided_this_pass = False
        self._aged_this_pass = False

    def end_pass(self) -> None:
        """The pass is over: requests skipped in it compete again."""
        self._resume_skipped()
        self._in_flight.reset()
        self._aged_this_pass = False

    def propose(
        self, batch_size: int, cached_tokens: Callable[[RequestId], int] | None = None
    ) -> Proposal | None:
        """The next request to admit and the stopper's verdict; None when nothing (not skipped) waits.
        `cached_tokens(rid)` is the prompt prefix the engine's cache holds for a request (not needed with cache
        events; without either, only this pass's own admissions count as in flight)."""
        pick = self.next_pick(cached_tokens)
        return None if pick is None else self.decide(pick, batch_size)

    def next_pick(self, cached_tokens: Callable[[RequestId], int] | None = None) -> Pick | None:
        """The request `propose()` would offer next, without asking the stopper: a due request once the oldest
        is due (one per pass), else the CHT's best; requests in flight are skipped for the pass. None when
        nothing (not skipped) waits."""
        tree = self.tree
        oldest = tree.oldest()
        if oldest is None:
            return None
        if self._is_due(oldest):
            due = tree.candidate(self._due_request(oldest))
            if not self._in_flight.is_in_flight(tree, due, cached_tokens):
                return Pick(due, is_aged=True)
            self._skip(due.request_id)  # its prefix is being computed: it is due again next pass
        while True:
            candidate = tree.best()
            if candidate is None:
                return None
            if not self._in_flight.is_in_flight(tree, candidate, cached_tokens):
                return Pick(candidate, is_aged=False)
            self._skip(candidate.request_id)

    def pick_request(
        self, request_id: RequestId, cached_tokens: Callable[[RequestId], int] | None = None
    ) -> Pick:
        """A pick of the waiting request the engine names (one its own loop reached), deferred or not (then
        `skip` it or end the pass)."""
        candidate = self.tree.candidate(request_id)
        if self._in_flight.is_in_flight(self.tree, candidate, cached_tokens):
            return Pick(candidate, is_aged=False, is_deferred=True)
        return Pick(candidate, is_aged=self._is_due(request_id))

    def decide(self, pick: Pick, batch_size: int) -> Proposal:
        """The stopper's verdict on `pick` joining a batch of `batch_size` (an aged pick is added, a deferred
        one stopped, without asking it)."""
        candidate = pick.candidate
        observation = Observation(
            batch_size=batch_size,
            depth_before=candidate.depth_before,
            depth_after=candidate.depth_after,
            num_sharing=candidate.num_sharing,
            num_waiting=self.tree.num_waiting,
            wait_s=self.wait_s(candidate.request_id),
        )
        if pick.is_aged:
            return Proposal(candidate, observation, Decision.ADD, is_aged=True)
        if pick.is_deferred:
            return Proposal(candidate, observation, Decision.STOP, is_aged=False, is_deferred=True)
        if not self._decided_this_pass:
            self._decided_this_pass = True
            self._window.roll()
        self.stats.num_consults += not is_forced(observation)
        return Proposal(candidate, observation, self.stopper.decide(observation), is_aged=False)

    def _is_due(self, request_id: RequestId) -> bool:
        """The aging guard serves this request now: it is due and no due request was admitted in this pass."""
        return not self._aged_this_pass and self.guard.is_starved(self.wait_s(request_id))

    def _due_request(self, oldest: RequestId) -> RequestId:
        """The request the guard serves when `oldest` is due: the oldest one with nothing covered if it is due
        too (the ranking serves it last; a covered request's group keeps being served), else `oldest`."""
        stranger = self.tree.oldest_stranger()
        if stranger is not None and stranger != oldest and self._is_due(stranger):
            return stranger
        return oldest

    def skip(self, proposal: Proposal | Pick) -> None:
        """Pass over a request (deferred, or one the engine's loop passed over) until the pass ends."""
        self._skip(proposal.request_id)

    def _skip(self, request_id: RequestId) -> None:
        self.tree.suspend(request_id)
        self._skipped.append(request_id)
        self.stats.num_deferred += 1

    def _resume_skipped(self) -> None:
        """Every request skipped in this pass competes again (only the admission suspends requests)."""
        if self._skipped:
            self.tree.resume_all()
            self._skipped.clear()

    def accept(self, proposal: Proposal) -> None:
        """The engine admitted the proposed request."""
        self.tree.activate(proposal.request_id)
        self._in_flight.admitted(proposal.request_id)
        self.stats.num_admitted += 1
        self.stats.sum_delta += proposal.candidate.delta
        wait_s = self.wait_s(proposal.request_id)
        if proposal.is_aged:
            self.stats.num_aged += 1
            self._aged_this_pass = True
            self.guard.admitted(wait_s)
        else:
            self._window.record(DecisionRecord(proposal.observation, Decision.ADD))
        self.guard.served(wait_s)

    def decline(self, proposal: Proposal) -> None:
        """The stopper's STOP ends this pass; its decisions await the window's reward."""
        self.stats.num_stops += 1
        self._window.record(DecisionRecord(proposal.observation, Decision.STOP))

    def withdraw(self, proposal: Proposal) -> None:
        """The engine's own budget refused a request the stopper would have added: nothing is learned."""
        self.stats.num_withdrawn += 1

    def select(
        self,
        batch_size: int,
        max_requests: int | None = None,
        fits: Callable[[RequestId], bool] | None = None,
        cached_tokens: Callable[[RequestId], int] | None = None,
    ) -> AdmissionPlan:
        """A whole pass: admit requests until the stopper, the engine's `fits` check or `max_requests` says no
        (`cached_tokens` as for `propose`)."""
        self.begin_pass()
        try:
            return self._select(batch_size, max_requests, fits, cached_tokens)
        finally:
            self.end_pass()

    def _select(self, batch_size, max_requests, fits, cached_tokens) -> AdmissionPlan:
        admitted: list[RequestId] = []
        while True:
            if max_requests is not None and len(admitted) >= max_requests:
                return AdmissionPlan(tuple(admitted), StopReason.LIMIT)
            proposal = self.propose(batch_size + len(admitted), cached_tokens=cached_tokens)
            if proposal is None:
                return AdmissionPlan(tuple(admitted), StopReason.EMPTY)
            if proposal.decision is Decision.STOP:
                self.decline(proposal)
                return AdmissionPlan(tuple(admitted), StopReason.STOPPER)
            if fits is not None and not fits(proposal.request_id):
                self.withdraw(proposal)
                return AdmissionPlan(tuple(admitted), StopReason.BUDGET)
            self.accept(proposal)
            admitted.append(proposal.request_id)

    # ----------------------------------------------------------------- learning

    def on_decode_step(self, num_tokens: int) -> None:
        """A decode-only step finished: it produced `num_tokens` tokens in the time since the previous step
        report (or since the window opened). Report each forward step when it is done."""
        self._window.decode_step(num_tokens)

    def on_prefill_step(self) -> None:
        """A step that computed prompt tokens (a prefill, a chunk of one, or a step mixing prefill and decode)
        finished: neither its time nor its tokens count towards the reward window."""
        self._window.prefill_step()

    def on_batch_drained(self) -> None:
        """Nothing runs any more: reward the open window and open none until the next decision."""
        self._window.drained()

    def end_window(self, num_tokens: int, elapsed_s: float) -> float | None:
        """Reward every decision made since the last window with `num_tokens / elapsed_s` (normalised); a
        window without decisions still updates the normalisation. None for an empty window."""
        return self._window.end(num_tokens, elapsed_s)

    def save_state(self) -> None:
        """Persist the learned stopper (atomic); a no-op without a state path."""
        if self._state_path is not None:
            save_state(self.stopper, self._state_path, tag=self.state_tag)

    # ----------------------------------------------------------------- bookkeeping views

    def wait_s(self, request_id: RequestId) -> float:
        return self.clock() - self._arrivals[request_id]

    def index_sizes(self) -> dict[str, int]:
        """Entries of the admission's own per-request indexes (all zero once every request left): leak checks."""
        return {
            "arrivals": len(self._arrivals),
            "skipped": len(self._skipped),
            "pass_admitted": self._in_flight.num_admitted,
            "records": self._window.num_records,
        }
