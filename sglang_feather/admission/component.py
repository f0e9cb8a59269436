"""The admission component: which waiting requests join the batch, behind one API every engine adapter shares."""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from sglang_feather.admission.concentration import Concentration
from sglang_feather.admission.config import AdmissionConfig, StopScope
from sglang_feather.admission.costs import Footprint, Headroom, RunningFootprint, observe
from sglang_feather.admission.deferral import InFlightCheck
from sglang_feather.admission.due import due_request, is_due
from sglang_feather.admission.lifecycle import Lifecycle
from sglang_feather.admission.plan import Planner
from sglang_feather.admission.refresh import prefixes_to_refresh
from sglang_feather.admission.results import AdmissionPlan, AdmissionStats, Pick, Proposal, StopReason
from sglang_feather.admission.rewards import RewardWindow
from sglang_feather.cht import Candidate, ChunkedHashTree, RequestState, new_tree
from sglang_feather.policy import AgingGuard, make_policy
from sglang_feather.policy.base import Decision, DecisionRecord, StoppingPolicy
from sglang_feather.policy.context import is_forced_case
from sglang_feather.policy.persist import load_state, save_state
from sglang_feather.policy.steps import StepSample
from sglang_feather.types import ChunkHash, RequestId

logger = logging.getLogger(__name__)

# How it works.
#
# An engine runs one scheduling pass at a time: `begin_pass()`, then `propose(batch_size)` for each next
# candidate, then `end_pass()`. A candidate is normally the CHT's best waiting request (requests whose prompt
# running requests or the engine's cache hold first, deepest covered prefix first, then the heaviest group,
# then arrival; requests with nothing covered in arrival order), but once the oldest waiting request is due
# (the aging guard, `due.py`) one due request per pass goes first. A candidate whose prefix shared with
# running requests is still being computed (`deferral`) is skipped: suspended in the CHT for the rest of the
# pass, which goes on with the next candidate; `end_pass()` puts it back. A due request is deferred too (for
# that pass: the prefix it would compute twice is cached by the next). For any other candidate the stopper
# sees an `Observation` (batch size, shared-prefix depth before/after, w, queue length, wait, and what it
# costs the running batch: whether it adds a prefix group, the groups and chunks running, its new and missing
# chunks, its group's waiting requests, the engine's KV headroom; `costs`) and says ADD or STOP; the engine
# `accept`s (the request's chunks enter the working set), `decline`s or `withdraw`s (its own budget refused;
# nothing is learned). A STOP ends the pass, or, with the `new-groups` stop scope, only closes the pass to
# candidates that add a prefix group: they are skipped for the rest of it while requests of running groups
# still join. While the KV pool binds, the concentration rule (`concentration.py`) holds back a candidate that
# would lock a new prefix. An engine that walks its own queue splits `propose` in two: `next_pick()` says which
# request to put where its loop reaches next, `decide(pick, batch_size)` asks the stopper when it gets there,
# so the pick and the decision come from one view of the cache. The decisions are rewarded by the decode
# throughput of the window their pass opened (`rewards.py`). Lifecycle events (`finish`, `abort`, `leave`,
# `retract`, `requeue`) keep the CHT and the counts beside it equal to the engine's queues (`lifecycle.py`).
# With a stopper that adds without looking, a pass can also be planned ahead: `plan_ahead` takes the next
# picks at once and `settle` books what the engine admitted (`plan.py`).
#
# The admission owns the tree, the pass's flags and the stats, and is composed of collaborators that own
# their own state and are handed the tree, the guard or the clock's time per call: the `Lifecycle` (the
# footprint and the waiting demand), the `InFlightCheck`, the `RewardWindow`, the `Planner`, the
# `Concentration` rule and the `AgingGuard`; `from_config` builds them.


class Admission:
    """The CHT, a stopper and the aging guard behind one event API shared by every engine adapter."""

    def __init__(
        self,
        tree: ChunkedHashTree,
        stopper: StoppingPolicy,
        guard: AgingGuard,
        *,
        in_flight: InFlightCheck,
        clock: Callable[[], float] = time.monotonic,
        stop_scope: StopScope = StopScope.NEW_GROUPS,
        concentration: Concentration | None = None,
        state_path: str | None = None,
        state_tag: Mapping[str, str] | None = None,
    ):
        self.tree = tree
        self.guard = guard
        self.clock = clock
        self.stats = AdmissionStats()
        self.state_tag = dict(state_tag or {})
        self.stop_scope = stop_scope
        self.concentration = concentration
        """The concentration rule (`concentration.py`); None: candidates are never held back for KV room."""
        self._state_path = state_path
        self._in_flight = in_flight
        self._lifecycle = Lifecycle(keeps_demand=concentration is not None)
        self._window = RewardWindow(stopper, self.stats, clock)
        self._planner = Planner(
            self.stats, skips_in_flight=in_flight.enabled, stops_at_new_prefix=concentration is not None
        )
        self._stopper = stopper
        self._decided_this_pass = False
        self._aged_this_pass = False
        self._groups_closed = False
        """A STOP under the new-groups scope closed this pass to candidates that add a prefix group."""
        self._prefixes_closed = False
        """The rule held a candidate back in this pass: the rest of the pass is closed to candidates that lock a
        new prefix (the room and the running groups' demand fall together as their requests join, so the pool
        binds for as long as the pass lasts), without asking the engine's room again."""
        self._guard_held = False
        """The rule held back the guard's pick in this pass: the ranking fills the rest of the pass."""
        self.stopper = stopper
        if state_path is not None:
            load_state(stopper, state_path, tag=self.state_tag)

    @classmethod
    def from_config(cls, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic) -> Admission:
        """The admission `config` describes, with its collaborators."""
        return cls(
            new_tree(config.chunk_size),
            make_policy(config.stopper, seed=config.seed, **config.stopper_options),
            AgingGuard(config.max_wait_s, when_overtaken=config.due_when_overtaken),
            in_flight=InFlightCheck(
                enabled=config.defer_uncached_prefix,
                page_size=config.page_size,
                cache_events=config.cache_events,
            ),
            clock=clock,
            stop_scope=StopScope(config.stop_scope),
            concentration=Concentration(config.chunk_size) if config.concentrate else None,
            state_path=config.state_path,
            state_tag=config.state_tag,
        )

    @property
    def stopper(self) -> StoppingPolicy:
        return self._stopper

    @stopper.setter
    def stopper(self, stopper: StoppingPolicy) -> None:
        """Hand the admission to `stopper` (between passes), the reward for the decisions still open included;
        the footprint is kept only for a stopper that looks at observations (counted from the tree when one
        takes over from a blind one)."""
        self._stopper = stopper
        self._window.hand_over(stopper)
        if stopper.blind_decision is not None:
            self._lifecycle.drop_footprint()
        else:
            self._lifecycle.keep_footprint(self.tree)

    @property
    def footprint(self) -> Footprint:
        """The running batch's counts a stopper that looks is shown (`NoFootprint` for a blind one)."""
        return self._lifecycle.footprint

    @property
    def num_waiting_running(self) -> int | None:
        """Waiting requests whose prefix group runs, as the concentration rule counts them (None without it)."""
        demand = self._lifecycle.demand
        return None if demand is None else demand.num_waiting_running

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
        if self._planner.is_open:
            self.settle(0, False)
        if self.tree.num_suspended:  # only the admission suspends requests: the pass's skips
            self.tree.resume_all()
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
        tree = self.tree
        due = due_request(tree, self.guard, self.clock(), self._aged_this_pass or self._guard_held)
        candidate: Candidate | None
        if due is not None:
            candidate = tree.candidate(due)
            if not self._in_flight.is_in_flight(tree, candidate, cached_tokens):
                return Pick(candidate, is_aged=True)
            self._skip(due)  # its prefix is being computed: it is due again next pass
        while True:
            candidate = tree.best()
            if candidate is None:
                return None
            if self._closed_to(candidate):
                if candidate.is_stranger:
                    return None  # nothing covered: every request left is a stranger, a new group too
                if self._groups_closed and candidate.adds_group:
                    self.tree.suspend(candidate.request_id)
                    self.stats.num_held_back += 1
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
        closed = self._aged_this_pass or self._guard_held
        return Pick(candidate, is_aged=is_due(candidate, self.guard, self.clock(), closed))

    def decide(self, pick: Pick, batch_size: int, headroom: Headroom | None = None) -> Proposal:
        """The stopper's verdict on `pick` joining a batch of `batch_size` (an aged pick is added, a deferred
        one, or one that adds a group to a pass a STOP closed to new groups, stopped, without asking it).
        `headroom()` is the engine's KV room now (`KvHeadroom`; None or absent: unknown)."""
        candidate = pick.candidate
        blind = self._stopper.blind_decision
        observation = None
        if blind is None:
            footprint = self._lifecycle.keep_footprint(self.tree)
            observation = observe(self.tree, footprint, candidate, batch_size, self.wait_s, headroom)
        if self._concentrates(pick, headroom):
            return Proposal(candidate, observation, Decision.STOP, is_aged=pick.is_aged, is_held_back=True)
        if pick.is_aged:
            return Proposal(candidate, observation, Decision.ADD, is_aged=True)
        if pick.is_deferred or (self._groups_closed and candidate.adds_group):
            return Proposal(candidate, observation, Decision.STOP, is_aged=False, is_deferred=True)
        self._count_decision(candidate, batch_size)
        if observation is None:  # a blind stopper (`blind_decision`): no observation was built
            if blind is None:
                raise AssertionError("a stopper that looks was given no observation")
            decision = blind
        else:
            decision = self._stopper.decide(observation)
        return Proposal(candidate, observation, decision, is_aged=False)

    def _concentrates(self, pick: Pick, headroom: Headroom | None) -> bool:
        """The concentration rule (None: off) sees the engine's room at this decision and holds `pick` back
        (never a deferred pick; the guard's pick, due by the bound or the overtaken rule, is weighed like any
        other, without needing a running group's request to wait)."""
        rule = self.concentration
        if rule is None:
            return False
        room = headroom() if headroom is not None else None
        rule.room_seen(room)
        if pick.is_deferred:
            return False
        if self._prefixes_closed:
            return rule.locks_new_prefix(pick.candidate, self.tree)
        demand = self._lifecycle.demand  # kept while the rule is on
        if demand is None:
            raise AssertionError("the concentration rule is on but the waiting demand is not kept")
        num_waiting_running = demand.num_waiting_running
        return rule.holds_back(pick.candidate, num_waiting_running, room, self.tree, early=pick.is_aged)

    def _closed_to(self, candidate: Candidate) -> bool:
        """A STOP (new-groups scope) or the concentration rule closed this pass to `candidate`."""
        if self._groups_closed and candidate.adds_group:
            return True
        rule = self.concentration
        return self._prefixes_closed and rule is not None and rule.locks_new_prefix(candidate, self.tree)

    def hold_back(self, proposal: Proposal) -> None:
        """Pass over a request the concentration rule held back, until the pass ends; the pass goes on, closed
        to candidates that lock a new prefix (after the guard's pick: to the guard)."""
        self._concentrate(proposal.request_id)
        if proposal.is_aged:  # the guard's pick: the ranking fills the rest of the pass
            self._guard_held = True
        else:
            self._prefixes_closed = True

    def _count_decision(self, candidate: Candidate, batch_size: int) -> None:
        """A stopper decision on a pick that is neither aged nor deferred: the pass's first one rolls the
        reward window; one the stopper had a choice on (not a forced case) counts as a consult."""
        self._roll_window_once()
        if not is_forced_case(batch_size, candidate.adds_group, candidate.delta):
            self.stats.num_consults += 1
            self.stats.num_group_consults += candidate.adds_group

    def _roll_window_once(self) -> None:
        """The pass's first stopper decision rolls the reward window."""
        if not self._decided_this_pass:
            self._decided_this_pass = True
            self._window.roll()

    def skip(self, item: Proposal | Pick | Candidate) -> None:
        """Pass over a request (deferred, or one the engine's loop passed over) until the pass ends."""
        self._skip(item.request_id)

    def _skip(self, request_id: RequestId) -> None:
        self.tree.suspend(request_id)
        self.stats.num_deferred += 1

    def _concentrate(self, request_id: RequestId) -> None:
        self.tree.suspend(request_id)
        self.stats.num_concentrated += 1

    def accept(self, proposal: Proposal) -> None:
        """The engine admitted the proposed request."""
        candidate = proposal.candidate
        self._lifecycle.activate(self.tree, proposal.request_id, candidate.depth_running)
        if self.concentration is not None:
            self.concentration.admitted(candidate)
        if not proposal.is_aged and proposal.observation is not None:
            self._window.record(DecisionRecord(proposal.observation, Decision.ADD))
        wait_s = self.clock() - candidate.arrival
        self._in_flight.admitted(candidate.request_id)
        self.stats.num_admitted += 1
        self.stats.sum_delta += candidate.delta
        if proposal.is_aged:
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
            self.tree.suspend(proposal.request_id)
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

    # ----------------------------------------------------------------- a pass planned ahead (plan.py)

    @property
    def can_plan(self) -> bool:
        """Whether passes can be planned ahead: the stopper adds without looking (`blind_decision` ADD) and the
        in-flight check asks the engine nothing (it reads the cache tier, or is off)."""
        return self._stopper.blind_decision is Decision.ADD and not self._in_flight.needs_engine

    @property
    def can_plan_rest(self) -> bool:
        """`can_plan`, and nothing closed this pass to some candidates (a STOP under the new-groups scope, or a
        hold of the concentration rule): the rest of the pass can be planned ahead."""
        return self.can_plan and not (self._groups_closed or self._prefixes_closed or self._guard_held)

    def plan_ahead(self, batch_size: int, max_picks: int, max_missing: int | None = None) -> list[Candidate]:
        """Up to `max_picks` more picks of this pass, each taken as `next_pick` takes it once the picks before
        it were accepted (each is activated in the tree before the next is taken; the last when the plan goes
        on, or at `settle`); `batch_size` is what runs when the pass began (read on the pass's first call).
        With `max_missing` (>= 1; the engine's prefill budget in chunks), the pick whose missing chunks bring
        this call's sum to it is the last. With the concentration rule the plan ends before a pick the rule
        could hold back. Empty when nothing (not skipped) is left to plan. Needs `can_plan`; `settle` ends it."""
        if not self.can_plan:
            raise ValueError("plan_ahead needs a stopper that adds without looking and no engine-asked check")
        if self._groups_closed or self._prefixes_closed or self._guard_held:
            raise RuntimeError(
                "a planned pass was closed to some candidates (only a step-by-step pass closes one)"
            )
        return self._planner.plan_ahead(
            self.tree, self.guard, self.clock(), self._aged_this_pass, batch_size, max_picks, max_missing
        )

    @property
    def num_planned(self) -> int:
        return self._planner.num_planned

    def settle(
        self, num_admitted: int, refused: bool, rooms: Mapping[int, int | None] | None = None
    ) -> list[Candidate]:
        """The engine admitted the first `num_admitted` planned picks (`refused`: its loop reached the next one
        and its budget refused it). Books them as `decide` and `accept` would have, counts the refused one as
        withdrawn, undoes the rest (plan.py); returns the admitted ones. `rooms`: the engine's room (tokens, as
        `KvHeadroom.num_free_tokens`; None where it could not say) before the i-th planned pick, read where
        `Concentration.read_points` says, for the concentration rule (None: none reported). The pass may go on
        step by step."""
        settled = self._planner.settle(self.tree, self.guard, num_admitted, refused)
        if settled.is_aged:
            self._aged_this_pass = True
        if settled.rolls:
            self._roll_window_once()
        if num_admitted:
            # A planned pass's stopper is blind: a footprint still kept (a stopper made blind in place) was not
            # booked, so it goes (counted again if a stopper that looks is shown one).
            self._lifecycle.drop_footprint()
            self._lifecycle.joined_running(num_admitted)
        if self.concentration is not None and rooms:
            self.concentration.replay(rooms, settled.admitted)
        return settled.admitted

    # ----------------------------------------------------------------- the request lifecycle (lifecycle.py)

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
        arrival = self.clock() if arrival is None else arrival
        return self._lifecycle.insert(self.tree, request_id, token_ids, hashes, namespace, arrival)

    def requeue(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray | None = None,
        *,
        hashes: Sequence[ChunkHash] | None = None,
        namespace: str | None = None,
    ) -> int:
        """A known request waits again with a new prompt (it grew); it keeps its original arrival time."""
        tree = self.tree
        arrival = tree.arrival(request_id) if request_id in tree else self.clock()
        self._lifecycle.discard(tree, request_id)
        return self._lifecycle.insert(tree, request_id, token_ids, hashes, namespace, arrival)

    def activate(self, request_id: RequestId) -> None:
        """The engine put a waiting request into the batch without a proposal (e.g. found it running while
        reconciling); no decision is recorded."""
        self._lifecycle.activate(self.tree, request_id)

    def retract(self, request_id: RequestId) -> None:
        """A running request is pushed back to waiting (KV exhausted, preemption)."""
        self._lifecycle.retract(self.tree, request_id)

    def finish(self, request_id: RequestId) -> None:
        """A running request completed."""
        self._lifecycle.finish(self.tree, request_id)

    def abort(self, request_id: RequestId) -> bool:
        """A request left in whatever state it was (finished, aborted); False if Feather did not know it."""
        return self._lifecycle.discard(self.tree, request_id)

    def leave(self, request_id: RequestId) -> bool:
        """A request is gone for good, whatever its state: a running one finished (its chunks leave the working
        set), a waiting one was aborted; False if Feather did not know it."""
        return self._lifecycle.discard(self.tree, request_id)

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
            self.tree = new_tree(tree.chunk_size)
        self._planner.forget()
        self._lifecycle.reset()
        self._in_flight.reset()

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

    # ----------------------------------------------------------------- what adapters may ask of the tree

    @property
    def chunk_size(self) -> int:
        return self.tree.chunk_size

    @property
    def page_size(self) -> int:
        """Tokens per KV page of the engine's cache (the in-flight check compares page-rounded prefixes)."""
        return self._in_flight.page_size

    @property
    def num_waiting(self) -> int:
        return self.tree.num_waiting

    @property
    def num_active(self) -> int:
        return self.tree.num_active

    @property
    def num_running_groups(self) -> int:
        """Prefix groups (first chunks) the running requests belong to."""
        return self.tree.num_running_groups

    def state(self, request_id: RequestId) -> RequestState | None:
        """WAITING, ACTIVE, or None for a request Feather does not track."""
        return self.tree.state(request_id)

    def is_waiting(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.WAITING

    def is_active(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.ACTIVE

    def is_skipped(self, request_id: RequestId) -> bool:
        """Skipped for the rest of this pass (deferred, or passed over by the engine's loop)."""
        return self.tree.is_suspended(request_id)

    def prefix_hash(self, request_id: RequestId) -> ChunkHash:
        """The hash of a request's first chunk: its prefix group."""
        return self.tree.prefix_hash(request_id)

    def covered_tokens(self, request_id: RequestId) -> int:
        """Prompt tokens of a tracked request that running requests or the engine's cache hold (whole chunks,
        as the cache tier knows them): what its prefill will not compute. For engines' load reports."""
        tree = self.tree
        return (tree.num_chunks(request_id) - tree.num_missing(request_id)) * tree.chunk_size

    def prefixes_to_refresh(self, queue_head: Iterable[RequestId]) -> list[RequestId]:
        """The waiting requests whose cached prefixes the engine should refresh in its LRU this pass, in that
        order, from its waiting queue's ids in queue order (at most `REFRESH_WINDOW` of them read; `refresh.py`)."""
        return prefixes_to_refresh(self.tree, queue_head)

    def prefix_order(self, request_ids: Sequence[RequestId]) -> list[RequestId]:
        """The tracked ones of `request_ids` with requests sharing a prefix contiguous at every depth."""
        tree = self.tree
        return tree.prefix_order([rid for rid in request_ids if rid in tree])

    def wait_s(self, request_id: RequestId) -> float:
        return self.clock() - self.tree.arrival(request_id)

    def index_sizes(self) -> dict[str, int]:
        """Entries of the admission's own per-request indexes (all zero once every request left): leak checks."""
        return {
            "skipped": self.tree.num_suspended,
            "pass_admitted": self._in_flight.num_admitted,
            "records": self._window.num_records,
        }

    # ----------------------------------------------------------------- the stopper's rewards (rewards.py)

    def on_decode_step(self, num_tokens: int) -> None:
        """A decode-only step finished: it produced `num_tokens` tokens in the time since the previous step
        report (or since the window opened). Report each forward step when it is done. A stopper that
        `observes_steps` is shown the step with the running batch's footprint."""
        elapsed = self._window.decode_step(num_tokens)
        footprint = self.footprint
        if self._stopper.observes_steps and elapsed > 0 and isinstance(footprint, RunningFootprint):
            self._stopper.observe_step(
                StepSample(
                    num_tokens=num_tokens,
                    elapsed_s=elapsed,
                    num_groups=footprint.num_groups,
                    num_running_chunks=footprint.num_running_chunks,
                    num_read_chunks=footprint.num_read_chunks,
                )
            )

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
            save_state(self._stopper, self._state_path, tag=self.state_tag)
