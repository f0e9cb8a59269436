"""Per-scheduler Feather state: the shared admission component, the queue mirror, events, metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from sglang.srt.environ import envs
from sglang.srt.managers.schedule_policy import AddReqResult
from sglang.srt.mem_cache.common import match_kv_cache, touch_waiting_prefix
from sglang.srt.runtime_context import get_disagg, get_memory

from sglang_feather.admission import Admission, Pick, Proposal
from sglang_feather.admission.config import AdmissionConfig
from sglang_feather.admission.costs import Headroom
from sglang_feather.policy.base import Decision
from sglang_feather.sglang.cache_events import EventTap, EventTranslator, events_enabled
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.mirror import QueueMirror
from sglang_feather.sglang.options import FeatherOptions, options_to_config
from sglang_feather.sglang.planned import PlannedPasses, Settled
from sglang_feather.sglang.queues import full_picture
from sglang_feather.sglang.slots import QueueSlots

logger = logging.getLogger(__name__)

_RID = attrgetter("rid")


def _lru_refresh_enabled(tree_cache: Any) -> bool:
    """Where SGLang 0.5.23 refreshes waiting prefixes for its own policies (`_touch_waiting_prefixes`): its
    switch is on, the cache shares prefixes, evicts by LRU and has no fast match, and this is no decode server."""
    return (
        envs.SGLANG_ENABLE_WAITING_PREFIX_REFRESH.get()
        and get_disagg().disaggregation_mode != "decode"
        and get_memory().radix_eviction_policy.lower() == "lru"
        and not tree_cache.supports_fast_match_prefix()
        and tree_cache.supports_prefix_sharing()
    )


PLAN_FROM = 8
"""Admissions in the last pass from which the next is planned ahead: a plan's fixed cost (the plan, placing it,
settling it; about 90 µs more than the step path's first decisions, docs/results/overhead.md) pays off from
about 8 admissions, each about 12 µs cheaper planned. Both paths admit the same requests."""

SAVE_INTERVAL_S = 30.0
"""How often a learning stopper's state is written to `--feather-state-path` while serving."""

# How it works.
#
# The scheduler's own events keep the CHT equal to SGLang's queues in O(changed requests): `on_queued` (a
# request appended to the waiting queue: arrival or retraction), `on_left` (a request finished or aborted),
# and Feather's own admissions. A pass never sorts the queue. `begin_pass` (from `calc_priority`) moves
# Feather's first pick to the head of `waiting_queue`; SGLang's admission loop walks that list and calls the
# adder, which asks `admit` for each request it reaches: the stopper decides on the pick there, from the same
# view of the cache that picked it. After every admission the next pick is moved into the slot the loop reaches
# next (found by its rank among the mirror's queue numbers, one C-speed move), so the loop walks Feather's order
# while SGLang's token and KV budgets keep the last word. A request the loop reaches that is not Feather's
# pick (the loop passed over the pick: LoRA, pooling mode, storage prefetch) is proposed as it is, and the pick
# waits for the next pass. What the prefix cache
# holds comes from the cache's own KV events (`cache_events`, drained before every enqueue and at each pass
# start), so the ranking prefers requests whose prefix is cached and candidates whose prefix an in-flight
# prefill is computing are skipped, with no cache match per candidate; a cache that records no events falls
# back to SGLang's own `match_kv_cache` for that check. When Feather has nothing more to offer the pass ends. The
# batch launched at one step end has run by the next pass or step end (with the overlap scheduler, to within
# one step), which reports it to the admission's reward window: a decode batch with its tokens, a batch
# that computed prompt tokens (extend, mixed or not) as a prefill step; every `--feather-self-check-interval-s`
# a full reconcile with the queues, the batches and the overlap loop's unprocessed batch runs and counts drift.
# Any exception inside Feather is logged with the request ids, counted, and turns the rest of that pass into
# SGLang's FCFS; the tree is rebuilt from the queues at the next step end. With a stopper that adds without
# looking (`always`, the default) and the cache tier fed, passes are planned ahead instead (`planned.py`).


@dataclass(frozen=True)
class RuntimeParts:
    """What a runtime is composed of, built by `make_runtime` (tests pass their own)."""

    config: AdmissionConfig
    admission: Admission
    mirror: QueueMirror
    slots: QueueSlots
    plans: PlannedPasses
    events: EventTap | None
    """Drains the tree cache's KV events into the cache tier (None: the cache records none)."""


def make_runtime(
    options: FeatherOptions,
    metrics: FeatherMetrics | None = None,
    clock: Callable[[], float] = time.monotonic,
    tree_cache: Any = None,
    state_tag: Mapping[str, str] | None = None,
    publish_events: bool = False,
    prefill_budget_tokens: int | None = None,
) -> FeatherRuntime:
    """The runtime for one scheduler: its admission component, mirror, queue slots, planned passes and event
    tap, built from the server's options and its tree cache. `prefill_budget_tokens`: the prompt tokens one
    prefill batch may compute (the server's `--max-prefill-tokens`, or `--chunked-prefill-size` where
    smaller); it sizes planned blocks. `publish_events`: SGLang's own KV-event publisher drains the cache too."""
    has_cache = tree_cache is not None and not getattr(tree_cache, "disable", False)
    page_size = int(getattr(tree_cache, "page_size", 1) or 1)
    cache_events = events_enabled(tree_cache) and options.admission.chunk_size % page_size == 0
    config = options_to_config(
        options,
        page_size=page_size,
        defer_uncached_prefix=options.admission.defer_uncached_prefix and has_cache,
        state_tag=state_tag,
        cache_events=cache_events,
    )
    admission = Admission.from_config(config, clock=clock)
    mirror = QueueMirror(admission)
    slots = QueueSlots(mirror)
    events = None
    if cache_events:
        events = EventTap(tree_cache, EventTranslator(admission, config.chunk_size), publish=publish_events)
    plans = PlannedPasses(admission, slots, prefill_budget_tokens, config.chunk_size)
    parts = RuntimeParts(config, admission, mirror, slots, plans, events)
    return FeatherRuntime(options, parts, metrics, clock, tree_cache)


class FeatherRuntime:
    """Feather inside one SGLang scheduler (see "how it works"): the scheduler's events and hooks, timed and
    guarded, over the parts it is composed of (`RuntimeParts`, passed in)."""

    def __init__(
        self,
        options: FeatherOptions,
        parts: RuntimeParts,
        metrics: FeatherMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        tree_cache: Any = None,
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self.tree_cache = tree_cache
        self.config = parts.config
        self.admission = parts.admission
        self.mirror = parts.mirror
        self.slots = parts.slots
        self.plans = parts.plans
        self.events = parts.events
        self._pick: Pick | None = None
        """The request moved to where SGLang's loop reaches next, and its `Req` (`_pick_req`)."""
        self._pick_req: Any = None
        has_cache = tree_cache is not None and not getattr(tree_cache, "disable", False)
        self.refreshes_prefixes = has_cache and _lru_refresh_enabled(tree_cache)
        """Each pass refreshes the waiting queue's cached prefixes in the tree cache's LRU (`refresh.py`)
        where SGLang's own refresh of them would run."""
        self.plans_ahead = self.admission.can_plan
        """Plan passes ahead (see "how it works"); False takes the step path, with the same admissions."""
        self.plan_from = PLAN_FROM
        """A pass is planned when the last one admitted at least this many requests (`PLAN_FROM`)."""
        self.planning_pass = False
        """This pass was planned ahead (a plan that ended early is planned again after the step path's pick)."""
        self._admitted_before = 0
        self._fcfs_pass = False
        self._needs_rebuild = False
        self._step_s = 0.0
        self.last_step_s = 0.0
        """Feather's seconds in the last scheduler step, end-of-step hook included (`feather_step_seconds`)."""
        self._last_save = clock()
        self._last_check = clock()
        self._saved_windows = 0
        self._launched: int | None = None
        """Decode tokens of the batch launched at the last step end, 0 for a batch that computed prompt
        tokens, None when none is unreported."""
        self.num_drift = 0
        self.num_errors = 0
        if tree_cache is not None:
            _BY_CACHE[id(tree_cache)] = self

    @property
    def num_scans(self) -> int:
        """Times a pick had to be found in the waiting queue by a linear scan (`QueueSlots.num_scans`)."""
        return self.slots.num_scans

    @property
    def num_misses(self) -> int:
        """Times a pick was not where its rank said (`QueueSlots.num_misses`)."""
        return self.slots.num_misses

    @property
    def num_planned_passes(self) -> int:
        return self.plans.num_planned_passes

    # ------------------------------------------------------------ scheduler events

    def on_queued(self, req: Any) -> None:
        """SGLang appended `req` to its waiting queue (a new request, or a retracted one)."""
        self._guarded(self._queued, req)

    def _queued(self, req: Any) -> None:
        self.drain_events()
        self.mirror.queued(req)

    def drain_events(self) -> None:
        """Bring the cache tier up to the cache's events so far (what was stored before what arrives next)."""
        if self.events is not None:
            self.events.drain()

    def on_left(self, req: Any) -> None:
        """`req` finished or was aborted; it never comes back under this `Req` object."""
        self._guarded(self.mirror.left, req)

    def _guarded(self, event: Callable[[Any], Any], req: Any) -> None:
        t0 = time.perf_counter()
        try:
            event(req)
        except Exception:
            self._failed(f"{event.__name__} event", [req])
        self._step_s += time.perf_counter() - t0

    # ------------------------------------------------------------ prefill pass

    def begin_pass(self, waiting_queue: list[Any], running: Sequence[Any]) -> None:
        """Called from `calc_priority`: put Feather's first candidate at the head of `waiting_queue`."""
        t0 = time.perf_counter()
        self.slots.begin_pass(waiting_queue)
        self._pick = None
        self._fcfs_pass = False
        try:
            if self.events is not None:
                self.events.drain()
            if self._launched is not None:
                self._report_launched()
            self.admission.begin_pass()
            if self._needs_rebuild:
                self._rebuild(waiting_queue, running)
            elif len(waiting_queue) != self.admission.num_waiting:
                self._drifted(self._sync(waiting_queue, running, complete=False))
            self.slots.put_back(waiting_queue)
            if self.refreshes_prefixes:
                self._refresh_prefixes(waiting_queue)
            self._admitted_before = self.admission.stats.num_admitted
            self.planning_pass = self.plans_ahead and self.plans.last_num_admitted >= self.plan_from
            if self.planning_pass:
                self._begin_plan(len(running), 0)
            else:
                self._offer(0)
        except Exception:
            self._failed("pass start", waiting_queue[:8])
        self._step_s += time.perf_counter() - t0

    def admit(
        self,
        req: Any,
        batch_size: int,
        sglang_add: Callable[[], Any],
        added: Callable[[], bool],
        headroom: Headroom | None = None,
    ):
        """What Feather's adder returns for `req`: the stopper's verdict, then SGLang's own `add_one_req`.
        `headroom()` is the adder's KV room (`rem_total_tokens` over the pool's size)."""
        if self._fcfs_pass:
            return sglang_add()
        if self.plans.planned is not None:
            self._planned_step(
                self.plans.passed_over
            )  # the loop passed over a planned request: the rest steps
        t0 = time.perf_counter()
        try:
            proposal = self._proposal_for(req, batch_size, headroom)
        except Exception:
            self._failed("proposal", [req])
            return sglang_add()
        if proposal is None:
            self._step_s += time.perf_counter() - t0
            return AddReqResult.OTHER
        if proposal.decision is Decision.STOP:
            result = self._stop(req, proposal)
            self._step_s += time.perf_counter() - t0
            return result
        self._step_s += time.perf_counter() - t0
        result = sglang_add()
        t0 = time.perf_counter()
        try:
            if added():
                self.admission.accept(proposal)
                self.slots.admitted(req)
                if self.metrics is not None:
                    self.metrics.admitted(proposal.candidate.delta)
                self._offer_after(req, batch_size + 1)
            else:
                self.admission.withdraw(proposal)
        except Exception:
            self._failed("admission", [req])
        self._step_s += time.perf_counter() - t0
        return result

    def _stop(self, req: Any, proposal: Proposal) -> Any:
        """A STOP (or a deferred or held-back pick): skip the request; the pass goes on past it where the
        concentration rule held it back or the stopper's STOP closed the pass to new prefix groups (the next
        pick moves into the slot SGLang's loop reaches next, and the loop continues), else SGLang's loop ends
        here."""
        if proposal.is_held_back:  # the concentration rule: the pass goes on past it
            self.admission.hold_back(proposal)
            if self.metrics is not None:
                self.metrics.concentrated()
            self._offer_after(req)
            return AddReqResult.CONTINUE
        if proposal.is_deferred:
            self.admission.skip(proposal)
            return AddReqResult.OTHER
        goes_on = self.admission.decline(proposal)
        if self.metrics is not None:
            self.metrics.stopped()
        if not goes_on:
            return AddReqResult.OTHER
        self._offer_after(req)
        return AddReqResult.CONTINUE

    def _offer_after(self, req: Any, batch_size: int | None = None) -> None:
        """`req` was admitted (a batch of `batch_size` now runs: then the rest of the pass is planned where it
        can be) or passed over and the pass goes on: offer the next pick in the slot after it."""
        slot = self.slots.slot_after(req)
        if slot is None:
            return
        if batch_size is not None and self.planning_pass and self.admission.can_plan_rest:
            try:
                self._begin_plan(batch_size, slot)
                return
            except LookupError:  # a pick lies before the slot (the loop passed over it): step as before
                self._record(self.plans.settle())
        self._offer(slot)

    def _begin_plan(self, batch_size: int, slot: int) -> None:
        """Plan the pass from `queue[slot]` on; where nothing could be planned, the step path offers there."""
        settled = self.plans.begin(batch_size, slot)
        if self.plans.planned is None:
            self._record(settled)
            self._offer(slot)

    def _offer(self, slot: int) -> None:
        """Move the admission's next pick into `queue[slot]`, the next one SGLang's loop reaches."""
        pick = self.admission.next_pick(None if self.events is not None else self._cached_tokens)
        self._pick = pick
        if pick is None or not self.slots.in_pass:
            return
        self._pick_req = self.mirror.request(pick.request_id)
        self.slots.move_to(self._pick_req, slot)

    # ------------------------------------------------------------ planned passes (the adder's calls)

    def _record(self, settled: Settled | None) -> None:
        """Count what a settled plan booked in the metrics."""
        if settled is not None and self.metrics is not None:
            self.metrics.admitted_all([each.delta for each in settled.admitted])
            self.metrics.consulted_all(settled.num_group_consults, settled.num_other_consults)

    def plan_reached(self, can_run: list[Any]) -> None:
        """SGLang's loop reached the plan's first request (`PlannedPasses.reached`)."""
        t0 = time.perf_counter()
        self.plans.reached(can_run)
        self._step_s += time.perf_counter() - t0

    def planned_all_added(self) -> None:
        """SGLang's adder admitted the plan's last request (`PlannedPasses.all_added`)."""
        self._planned_step(self._all_added)

    def _all_added(self) -> Settled | None:
        """A plan that settled there hands the pass to the step path, whose next pick is offered where the
        loop reaches next."""
        settled = self.plans.all_added()
        if settled is not None:
            self._offer(self.plans.resume_slot)
        return settled

    def planned_room(self, room: Callable[[Any], int | None], adder: Any, k: int) -> None:
        """SGLang's loop reached `planned[k]` (or refused it): `room(adder)` is its KV room now
        (`PlannedPasses.room`)."""
        t0 = time.perf_counter()
        self.plans.room(k, room(adder))
        self._step_s += time.perf_counter() - t0

    def planned_refused(self) -> None:
        """SGLang's budget refused the planned request its loop reached (`PlannedPasses.refused`)."""
        self._planned_step(self.plans.refused)

    def _planned_step(self, step: Callable[[], Settled | None]) -> None:
        t0 = time.perf_counter()
        try:
            self._record(step())
        except Exception:
            planned = self.plans.planned
            self._failed("planned admission", planned[-1:] if planned else [])
        self._step_s += time.perf_counter() - t0

    def _refresh_prefixes(self, waiting_queue: list[Any]) -> None:
        """Touch, in the tree cache's LRU, the cached prefixes Admission names from the queue's head."""
        for rid in self.admission.prefixes_to_refresh(map(_RID, waiting_queue)):
            touch_waiting_prefix(self.mirror.request(rid), self.tree_cache)

    def _proposal_for(self, req: Any, batch_size: int, headroom: Headroom | None) -> Proposal | None:
        """The stopper's proposal for the request SGLang reached; None ends the pass (Feather has nothing
        more to offer: the request is skipped for this pass or was never Feather's candidate)."""
        pick, self._pick = self._pick, None
        if pick is not None and req is self._pick_req:
            return self._decide(pick, batch_size, headroom)
        if pick is not None:  # SGLang's loop passed over Feather's pick (LoRA, pooling mode, prefetch)
            self.admission.skip(pick)
        rid = req.rid
        if rid not in self.mirror or self.mirror.request(rid) is not req:
            self.mirror.queued(req)
            self._drifted(1)
        if not self.admission.is_waiting(rid) or self.admission.is_skipped(rid):
            return None
        # SGLang's loop ran `req.init_next_round_input` just before: `prefix_len` is what the cache holds.
        pick = self.admission.pick_request(rid, cached_tokens=lambda _: req.prefix_len)
        return self._decide(pick, batch_size, headroom)

    def _decide(self, pick: Pick, batch_size: int, headroom: Headroom | None) -> Proposal:
        """The admission's verdict on `pick`, counting a consult of the stopper in the metrics."""
        num_consults = self.admission.stats.num_consults
        proposal = self.admission.decide(pick, batch_size, headroom)
        if self.metrics is not None and self.admission.stats.num_consults > num_consults:
            self.metrics.consulted(proposal.candidate.adds_group)
        return proposal

    def _cached_tokens(self, rid: Any) -> int:
        """The prompt prefix SGLang's prefix cache holds for a waiting request (tokens)."""
        if self.tree_cache is None:
            return 0
        req = self.mirror.request(rid)
        match_kv_cache(req, self.tree_cache)
        return req.prefix_len

    # ------------------------------------------------------------ step end

    def end_step(self, scheduler: Any, plan: Any) -> None:
        """After `get_next_batch_to_run`: reward bookkeeping, metrics, the periodic self-check."""
        t0 = time.perf_counter()
        self.slots.end_pass()
        self._pick = self._pick_req = None
        try:
            self._record(self.plans.settle())
            self.plans.last_num_admitted = self.admission.stats.num_admitted - self._admitted_before
            self.admission.end_pass()
            if self._launched is not None:
                self._report_launched()
            batch = plan.batch_to_run
            if batch is not None:
                if batch.forward_mode.is_decode():
                    self._launched = batch.batch_size()
                else:
                    self._launched = 0
                    if self.metrics is not None:  # what runs now: the running batch and the prefill batch
                        self.metrics.prefix_groups(self.admission.num_running_groups)
            now = self.clock()
            if self._needs_rebuild or now - self._last_check >= self.options.self_check_interval_s:
                self._last_check = now
                self._self_check(scheduler, plan)
            if self.admission.num_active == 0:
                self.admission.on_batch_drained()
            if self.config.state_path is not None:
                self._maybe_save(now)
        except Exception:
            self._failed("step end", [])
        self._step_s += time.perf_counter() - t0
        self.last_step_s = self._step_s
        if self.metrics is not None:
            self.metrics.tracked(self.admission.num_waiting, self.admission.num_active)
            self.metrics.rewards(self.admission.stats.num_windows, self.admission.stats.sum_reward)
            self.metrics.scheduler_step(self._step_s)
        self._step_s = 0.0

    def check_queue_order(self, waiting_queue: Sequence[Any]) -> None:
        """Invariant, between passes: the mirror's sorted part is the waiting queue less the picks Feather moved
        to its head and SGLang did not admit (`QueueSlots.check_order`; ValueError otherwise)."""
        self.slots.check_order(waiting_queue)

    def _report_launched(self) -> None:
        """The batch launched at the last step end has run (`_launched` is not None): report it to the reward
        window (once)."""
        num_tokens, self._launched = self._launched, None
        if num_tokens:
            self.admission.on_decode_step(num_tokens)
        else:
            self.admission.on_prefill_step()

    def _self_check(self, scheduler: Any, plan: Any) -> None:
        waiting, active = full_picture(scheduler, plan)
        if self._needs_rebuild:
            self._rebuild(waiting, active)
        else:
            self._drifted(self._sync(waiting, active, complete=True))

    def _rebuild(self, waiting: Sequence[Any], active: Sequence[Any]) -> None:
        """Forget every request and mirror the queues afresh (after an exception left the tree in doubt)."""
        self.admission.forget_all()
        self.mirror.forget()
        self._sync(waiting, active, complete=False)
        self._needs_rebuild = False

    def _sync(self, waiting: Sequence[Any], active: Sequence[Any], *, complete: bool) -> int:
        """`QueueMirror.sync`, which numbers the waiting queue in its order: the picks Feather moved to its head
        are then in queue-number order where they are, so none is put back."""
        self.slots.forget_moved()
        return self.mirror.sync(waiting, active, complete=complete)

    def _drifted(self, num_changes: int) -> None:
        if num_changes:
            self.num_drift += num_changes
            logger.debug(
                "Feather mirror corrected %d request(s) a scheduler event did not report", num_changes
            )
            if self.metrics is not None:
                self.metrics.drift(num_changes)

    def _failed(self, where: str, reqs: Sequence[Any]) -> None:
        self.num_errors += 1
        self._fcfs_pass = True
        self.plans.close()
        self._needs_rebuild = True
        rids = [getattr(req, "rid", None) for req in reqs]
        logger.exception("Feather failed in %s (requests %s); this pass falls back to FCFS", where, rids)
        if self.metrics is not None:
            self.metrics.error()

    def _maybe_save(self, now: float) -> None:
        """Persist learned state (a state path is set) at most every SAVE_INTERVAL_S, and only after new rewards
        arrived."""
        num_windows = self.admission.stats.num_windows
        if num_windows != self._saved_windows and now - self._last_save >= SAVE_INTERVAL_S:
            self._last_save = now
            self._saved_windows = num_windows
            self.admission.save_state()

    def close(self) -> None:
        """Forget every request, give the cache its own `take_events` back, and persist the learned state
        (when a state path is set)."""
        if _BY_CACHE.get(id(self.tree_cache)) is self:
            del _BY_CACHE[id(self.tree_cache)]
        if self.events is not None:
            self.events.close()
        self.admission.forget_all()
        if self.config.state_path is not None:
            self.admission.save_state()


_BY_CACHE: dict[int, FeatherRuntime] = {}
"""The runtime of each scheduler's prefix cache, for events SGLang raises with the cache but no scheduler."""


def runtime_for_cache(tree_cache: Any) -> FeatherRuntime | None:
    return _BY_CACHE.get(id(tree_cache))
