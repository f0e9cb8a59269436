"""The admission component: which waiting requests join the batch, behind one API every engine adapter shares."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from sglang_feather.admission.concentration import Concentration
from sglang_feather.admission.config import AdmissionConfig, StopScope
from sglang_feather.admission.costs import (
    Footprint,
    Headroom,
    KvHeadroom,
    NoFootprint,
    RunningFootprint,
    observe,
)
from sglang_feather.admission.deferral import InFlightCheck
from sglang_feather.admission.lifecycle import Lifecycle
from sglang_feather.admission.plan import PassPlan, Planning
from sglang_feather.admission.results import AdmissionPlan, AdmissionStats, Pick, Proposal, StopReason
from sglang_feather.admission.rewards import LearningHooks, RewardWindow
from sglang_feather.admission.views import TreeViews
from sglang_feather.cht import Candidate, ChunkedHashTree
from sglang_feather.policy import AgingGuard, make_policy
from sglang_feather.policy.base import Decision, DecisionRecord, StoppingPolicy
from sglang_feather.policy.context import is_forced_case
from sglang_feather.policy.persist import load_state
from sglang_feather.types import RequestId

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
# (batch size, shared-prefix depth before/after, w, queue length, wait, and what it costs the running batch:
# whether it adds a prefix group, the groups and chunks running, its new and missing chunks, its group's
# waiting requests, the engine's KV headroom; `costs`) and says ADD or STOP; the engine `accept`s (the
# request's chunks enter the working set), `decline`s or `withdraw`s (its own budget refused; nothing is
# learned). A STOP ends the pass, or, with the `new-groups` stop scope, only closes the pass to candidates
# that add a prefix group: they are skipped for the rest of it while requests of running groups still join.
# An engine that walks its
# own queue splits `propose` in two: `next_pick()` says which request to put where its loop reaches next,
# `decide(pick, batch_size)` asks the stopper when it gets there, so the pick and the decision come from one
# view of the cache. The decisions are rewarded by the decode throughput of the window their pass opened
# (`rewards`). Lifecycle events (`finish`, `abort`, `leave`, `retract`, `requeue`) keep the CHT equal to the
# engine's queues. With a stopper that adds without looking, a pass can also be planned ahead: `plan_ahead`
# takes the next picks at once and `settle` books what the engine admitted (plan.py).


class Admission(Lifecycle, TreeViews, LearningHooks, Planning):
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
        stop_scope: StopScope = StopScope.NEW_GROUPS,
        concentration: Concentration | None = None,
    ):
        self.tree = tree
        self._stopper = stopper
        self.guard = guard
        self.clock = clock
        self.stats = AdmissionStats()
        self.page_size = page_size
        self.state_tag = dict(state_tag or {})
        self._state_path = state_path
        self._in_flight = InFlightCheck(
            enabled=defer_uncached_prefix, page_size=page_size, cache_events=cache_events
        )
        self._window = RewardWindow(stopper, self.stats, clock)
        self._decided_this_pass = False
        self._aged_this_pass = False
        self.footprint: Footprint = NoFootprint()
        self.concentration = concentration
        """The concentration rule (`concentration.py`); None: candidates are never held back for KV room."""
        self._prefixes_closed = False
        """The rule held a candidate back in this pass: the rest of the pass is closed to candidates that lock a
        new prefix (the room and the running groups' demand fall together as their requests join, so the pool
        binds for as long as the pass lasts), without asking the engine's room again."""
        self._guard_held = False
        """The rule held back the guard's pick in this pass: the ranking fills the rest of the pass."""
        self.stopper = stopper
        self.stop_scope = stop_scope
        self._groups_closed = False
        """A STOP under the new-groups scope closed this pass to candidates that add a prefix group."""
        self._plan: PassPlan | None = None
        if state_path is not None:
            load_state(stopper, state_path, tag=self.state_tag)

    @classmethod
    def from_config(cls, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic) -> Admission:
        """The admission `config` describes, on the core `ChunkedHashTree` is: on the compiled one, with the
        compiled guard and planned pass (`compiled.py`)."""
        tree = ChunkedHashTree(config.chunk_size)
        admission_type, guard_type = _TYPES_BY_CORE[tree.core]()
        return admission_type(
            tree,
            make_policy(config.stopper, seed=config.seed, **config.stopper_options),
            guard_type(config.max_wait_s, when_overtaken=config.due_when_overtaken),
            clock=clock,
            state_path=config.state_path,
            defer_uncached_prefix=config.defer_uncached_prefix,
            page_size=config.page_size,
            state_tag=config.state_tag,
            cache_events=config.cache_events,
            stop_scope=StopScope(config.stop_scope),
            concentration=Concentration(config.chunk_size) if config.concentrate else None,
        )

    @property
    def stopper(self) -> StoppingPolicy:
        return self._stopper

    @stopper.setter
    def stopper(self, stopper: StoppingPolicy) -> None:
        """Hand the admission to `stopper` (between passes), the reward for the decisions still open included;
        the footprint is kept only for a stopper that looks at observations or for the concentration rule
        (counted from the tree when one takes over from a blind one)."""
        self._stopper = stopper
        self._window.hand_over(stopper)
        if stopper.blind_decision is not None and self.concentration is None:
            self.footprint = NoFootprint()
        else:
            self._counted_footprint()

    def _counted_footprint(self) -> RunningFootprint:
        """The footprint a stopper that looks is shown: counted from the tree if the admission kept none (its
        stopper became one that looks without being handed over, e.g. `blind_decision` changed in place)."""
        if isinstance(self.footprint, NoFootprint):
            self.footprint = RunningFootprint.recount(self.tree)
        return self.footprint

    # ----------------------------------------------------------------- one scheduling pass

    def begin_pass(self) -> None:
        """A new scheduling pass starts (stoppers with per-pass state reset it); what the last pass left, if
        the engine did not end it, is undone first (`end_pass`)."""
        self.end_pass()
        self._stopper.begin_pass()
        self._decided_this_pass = False

    def end_pass(self) -> None:
        """The pass is over: requests skipped in it compete again (a plan not settled is undone, as if the
        engine admitted none of it)."""
        self._drop_plan()
        self._resume_skipped()
        if self._in_flight.needs_engine:  # no other check keeps anything within a pass
            self._in_flight.reset()
        self._aged_this_pass = False
        self._groups_closed = False
        self._prefixes_closed = False
        self._guard_held = False
        if self.concentration is not None:
            self.concentration.pass_ended()

    def propose(
        self,
        batch_size: int,
        cached_tokens: Callable[[RequestId], int] | None = None,
        headroom: Headroom | None = None,
    ) -> Proposal | None:
        """The next request to admit and the stopper's verdict; None when nothing (not skipped) waits.
        `cached_tokens(rid)` is the prompt prefix the engine's cache holds for a request (not needed with cache
        events; without either, only this pass's own admissions count as in flight); `headroom()` the
        engine's KV room now (see `decide`)."""
        pick = self.next_pick(cached_tokens)
        return None if pick is None else self.decide(pick, batch_size, headroom)

    def next_pick(self, cached_tokens: Callable[[RequestId], int] | None = None) -> Pick | None:
        """The request `propose()` would offer next, without asking the stopper: a due request once the oldest
        is due (one per pass), else the CHT's best; requests in flight are skipped for the pass. None when
        nothing (not skipped) waits."""
        return self._next_pick(self.guard, self._aged_this_pass, cached_tokens)

    def _next_pick(
        self, guard: AgingGuard, is_aged: bool, cached_tokens: Callable[[RequestId], int] | None
    ) -> Pick | None:
        """`next_pick` as it would be with `guard` and, when `is_aged`, a due request already admitted."""
        tree = self.tree
        oldest = tree.oldest()
        if oldest is None:
            return None
        due_request = self._due_request(oldest, guard, is_aged)
        if due_request is not None:
            due = tree.candidate(due_request)
            if not self._in_flight.is_in_flight(tree, due, cached_tokens):
                return Pick(due, is_aged=True)
            self._skip(due.request_id)  # its prefix is being computed: it is due again next pass
        while True:
            candidate = tree.best()
            if candidate is None:
                return None
            if self._closed_to(candidate):
                if candidate.is_stranger:
                    return None  # nothing covered: every request left is a stranger, a new group too
                if self._groups_closed and candidate.adds_group:
                    self._hold_back(candidate.request_id)
                else:
                    self._concentrate(candidate.request_id)
                continue
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
        return Pick(candidate, is_aged=self._is_due(candidate, self.guard, self._aged_this_pass))

    def decide(self, pick: Pick, batch_size: int, headroom: Headroom | None = None) -> Proposal:
        """The stopper's verdict on `pick` joining a batch of `batch_size` (an aged pick is added, a deferred
        one, or one that adds a group to a pass a STOP closed to new groups, stopped, without asking it).
        `headroom()` is the engine's KV room now (`KvHeadroom`; None or absent: unknown)."""
        candidate = pick.candidate
        blind = self.stopper.blind_decision
        observation = None
        if blind is None:
            observation = observe(
                self.tree, self._counted_footprint(), candidate, batch_size, self.wait_s, headroom
            )
        adds_group = candidate.adds_group
        if self._concentrates(pick, self._room_seen(headroom)):
            return Proposal(candidate, observation, Decision.STOP, is_aged=pick.is_aged, is_held_back=True)
        if pick.is_aged:
            return Proposal(candidate, observation, Decision.ADD, is_aged=True)
        if pick.is_deferred or (self._groups_closed and adds_group):
            return Proposal(candidate, observation, Decision.STOP, is_aged=False, is_deferred=True)
        self._count_decision(candidate, batch_size)
        decision = blind if observation is None else self.stopper.decide(observation)
        return Proposal(candidate, observation, decision, is_aged=False)

    def _room_seen(self, headroom: Headroom | None) -> KvHeadroom | None:
        """The engine's room at this decision, shown to the concentration rule (None without one)."""
        if self.concentration is None:
            return None
        room = headroom() if headroom is not None else None
        self.concentration.room_seen(room)
        return room

    def _concentrates(self, pick: Pick, room: KvHeadroom | None) -> bool:
        """The concentration rule holds `pick` back (never a deferred pick; the guard's pick, due by the bound or
        the overtaken rule, is weighed like any other, without needing a running group's request to wait)."""
        if self.concentration is None or pick.is_deferred:
            return False
        candidate = pick.candidate
        if self._prefixes_closed:
            return self._locks_new_prefix(candidate)
        group = self.tree.prefix_hash(candidate.request_id)
        return self.concentration.holds_back(
            candidate, self._counted_footprint(), group, room, self.tree, early=pick.is_aged
        )

    def _closed_to(self, candidate: Candidate) -> bool:
        """A STOP (new-groups scope) or the concentration rule closed this pass to `candidate`."""
        if self._groups_closed and candidate.adds_group:
            return True
        return self._prefixes_closed and self._locks_new_prefix(candidate)

    def _locks_new_prefix(self, candidate: Candidate) -> bool:
        """The concentration rule's test of `candidate` (False without the rule)."""
        if self.concentration is None:
            return False
        group = self.tree.prefix_hash(candidate.request_id)
        return self.concentration.locks_new_prefix(candidate, self._counted_footprint(), group, self.tree)

    def hold_back(self, proposal: Proposal) -> None:
        """Pass over a request the concentration rule held back, until the pass ends; the pass goes on, closed
        to candidates that lock a new prefix (after the guard's pick: to the guard)."""
        self._concentrate(proposal.request_id)
        if proposal.is_aged:  # the guard's pick: the ranking fills the rest of the pass
            self._guard_held = True
        else:
            self._prefixes_closed = True

    def _concentrate(self, request_id: RequestId) -> None:
        self._suspend(request_id)
        self.stats.num_concentrated += 1

    def _count_decision(self, candidate: Candidate, batch_size: int) -> None:
        """A stopper decision on a pick that is neither aged nor deferred: the pass's first one rolls the
        reward window; one the stopper had a choice on counts as a consult."""
        self._roll_window_once()
        self._count_consult(batch_size, candidate.adds_group, candidate.delta)

    def _count_consult(self, batch_size: int, adds_group: bool, delta: int) -> None:
        """A decision the stopper had a choice on (not a forced case) counts as a consult."""
        if not is_forced_case(batch_size, adds_group, delta):
            self.stats.num_consults += 1
            self.stats.num_group_consults += adds_group

    def _roll_window_once(self) -> None:
        """The pass's first stopper decision rolls the reward window."""
        if not self._decided_this_pass:
            self._decided_this_pass = True
            self._window.roll()

    def _is_due(self, candidate: Candidate, guard: AgingGuard, is_aged: bool) -> bool:
        """`guard` serves this request now: it is due (a stranger by the bound or the overtaken rule, any other
        by the bound) and the guard is open (`_guard_closed`); the admission's own guard and flag, or their
        stand-ins while a pass is planned ahead."""
        if self._guard_closed(guard, is_aged):
            return False
        wait_s = self.clock() - candidate.arrival
        return guard.is_starved(wait_s) if candidate.is_stranger else guard.reached_bound(wait_s)

    def _guard_closed(self, guard: AgingGuard, is_aged: bool) -> bool:
        """No request is due now: the guard served one in this pass (`is_aged`), the concentration rule held its
        pick in this pass, or the guard served one of the last EARLY_EVERY admissions."""
        return is_aged or self._guard_held or not guard.serves_early

    def _due_request(self, oldest: RequestId, guard: AgingGuard, is_aged: bool) -> RequestId | None:
        """The request `guard` serves now, `oldest` the longest-waiting one: the oldest stranger once it is due
        (the ranking serves it last), else `oldest` once it reached the bound; None when neither is or the guard
        is closed (`_guard_closed`)."""
        if self._guard_closed(guard, is_aged):
            return None
        oldest_wait_s = self.wait_s(oldest)
        if not guard.is_starved(oldest_wait_s):
            return None  # no stranger waited that long, and the bound is no earlier than a stranger's due
        stranger = self.tree.oldest_stranger()
        if stranger is not None and guard.is_starved(self.wait_s(stranger)):
            return stranger
        return oldest if guard.reached_bound(oldest_wait_s) else None

    def skip(self, proposal: Proposal | Pick) -> None:
        """Pass over a request (deferred, or one the engine's loop passed over) until the pass ends."""
        self._skip(proposal.request_id)

    def _skip(self, request_id: RequestId) -> None:
        self._suspend(request_id)
        self.stats.num_deferred += 1

    def _hold_back(self, request_id: RequestId) -> None:
        """Skip a candidate that adds a prefix group to a pass a STOP closed to new groups."""
        self._suspend(request_id)
        self.stats.num_held_back += 1

    def _suspend(self, request_id: RequestId) -> None:
        self.tree.suspend(request_id)

    def _resume_skipped(self) -> None:
        """Every request skipped in this pass competes again (only the admission suspends requests, so the
        tree's suspended set is the pass's skips)."""
        if self.tree.num_suspended:
            self.tree.resume_all()

    def accept(self, proposal: Proposal) -> None:
        """The engine admitted the proposed request."""
        self._activate(proposal.request_id, proposal.candidate.depth_running)
        if self.concentration is not None:
            self.concentration.admitted(proposal.candidate)
        if not proposal.is_aged and proposal.observation is not None:
            self._window.record(DecisionRecord(proposal.observation, Decision.ADD))
        self._admitted(proposal.candidate, proposal.is_aged, self.clock() - proposal.candidate.arrival)

    def _admitted(self, candidate: Candidate, is_aged: bool, wait_s: float) -> None:
        """An admission's bookkeeping once the tree runs the request: stats, the in-flight check, the guard."""
        self._in_flight.admitted(candidate.request_id)
        self.stats.num_admitted += 1
        self.stats.sum_delta += candidate.delta
        if is_aged:
            self.stats.num_aged += 1
            self._aged_this_pass = True
            # The concentration rule may have held a stranger past its overtaken due: one that reached the bound
            # counts its delay from the bound (holds past the bound count too; the lead is at most half of it).
            stranger = candidate.is_stranger
            if self.concentration is not None and self.guard.reached_bound(wait_s):
                stranger = False
            self.guard.admitted(wait_s, stranger)
        self.guard.served(wait_s)

    def decline(self, proposal: Proposal) -> bool:
        """The stopper said STOP; its decisions await the window's reward. Returns whether the pass goes on:
        under the new-groups stop scope a STOP on a candidate that adds a prefix group skips it and closes the
        rest of the pass to such candidates (True); otherwise the STOP ends the pass (False)."""
        self.stats.num_stops += 1
        if proposal.observation is not None:
            self._window.record(DecisionRecord(proposal.observation, Decision.STOP))
        if self.stop_scope is StopScope.NEW_GROUPS and proposal.candidate.adds_group:
            self._groups_closed = True
            self._suspend(proposal.request_id)
            return True
        return False

    def withdraw(self, proposal: Proposal) -> None:
        """The engine's own budget refused a request the stopper would have added: nothing is learned."""
        self.stats.num_withdrawn += 1

    def select(
        self,
        batch_size: int,
        max_requests: int | None = None,
        fits: Callable[[RequestId], bool] | None = None,
        cached_tokens: Callable[[RequestId], int] | None = None,
        headroom: Headroom | None = None,
    ) -> AdmissionPlan:
        """A whole pass: admit requests until the stopper, the engine's `fits` check or `max_requests` says no
        (`cached_tokens` and `headroom` as for `propose`)."""
        self.begin_pass()
        try:
            return self._select(batch_size, max_requests, fits, cached_tokens, headroom)
        finally:
            self.end_pass()

    def _select(self, batch_size, max_requests, fits, cached_tokens, headroom) -> AdmissionPlan:
        admitted: list[RequestId] = []
        while True:
            if max_requests is not None and len(admitted) >= max_requests:
                return AdmissionPlan(tuple(admitted), StopReason.LIMIT)
            proposal = self.propose(batch_size + len(admitted), cached_tokens, headroom)
            if proposal is None:  # after a STOP closed the pass to new groups, the stopper ended it
                stop = StopReason.STOPPER if self._groups_closed else StopReason.EMPTY
                return AdmissionPlan(tuple(admitted), stop)
            if proposal.is_held_back:  # it locks a new prefix while the pool binds: the pass goes on
                self.hold_back(proposal)
                continue
            if proposal.is_deferred:  # a new group in a pass a STOP closed to them: nothing more to offer
                self.skip(proposal)
                continue
            if proposal.decision is Decision.STOP:
                if self.decline(proposal):
                    continue
                return AdmissionPlan(tuple(admitted), StopReason.STOPPER)
            if fits is not None and not fits(proposal.request_id):
                self.withdraw(proposal)
                return AdmissionPlan(tuple(admitted), StopReason.BUDGET)
            self.accept(proposal)
            admitted.append(proposal.request_id)

    # ----------------------------------------------------------------- bookkeeping views

    def wait_s(self, request_id: RequestId) -> float:
        return self.clock() - self.tree.arrival(request_id)

    def index_sizes(self) -> dict[str, int]:
        """Entries of the admission's own per-request indexes (all zero once every request left): leak checks."""
        return {
            "skipped": self.tree.num_suspended,
            "pass_admitted": self._in_flight.num_admitted,
            "records": self._window.num_records,
        }


def _compiled_types() -> tuple[type[Admission], type]:
    from sglang_feather.admission.compiled import CompiledAdmission, CompiledGuard

    return CompiledAdmission, CompiledGuard


_TYPES_BY_CORE: dict[str, Callable[[], tuple[type[Admission], type]]] = {
    "python": lambda: (Admission, AgingGuard),
    "native": _compiled_types,
}
"""The admission and guard types for each CHT core (the tree's `core`)."""
