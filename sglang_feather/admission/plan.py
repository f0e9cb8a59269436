"""A pass planned ahead for a blind stopper: the admission's next picks, each activated as it is taken."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_feather.admission.concentration import Concentration
from sglang_feather.admission.due import due_request
from sglang_feather.admission.results import AdmissionStats
from sglang_feather.cht import Candidate, ChunkedHashTree
from sglang_feather.cht.checks import checked_max_missing
from sglang_feather.policy import AgingGuard
from sglang_feather.policy.context import is_forced_case
from sglang_feather.types import RequestId

# How it works.
#
# With a stopper that always adds without looking (`always`, the default) and an in-flight check that needs
# no engine query (answered by the cache tier, or off), a pass's picks depend only on the tree and the aging
# guard, so the admission can take them before the engine's loop reaches them. `plan_ahead(batch_size, n,
# max_missing)` takes up to n more picks (ending at the one whose missing chunks reach `max_missing`, the
# engine's prefill budget) exactly as `next_pick` would after each `accept`: each pick is activated in the
# tree before the next is taken (the next one sees it running; the last waits for the plan to go on or for
# `settle`, so a refused last pick costs nothing to undo), and its wait is fed to a copy of the guard (a
# request that falls due mid-pass, as the median of served waits drops, is served where the step-by-step path
# serves it). Picks that no due check can touch are taken in one call of the tree (`take_picks`): while no
# request reached the bound, the guard says how many admissions it takes before even the longest-waiting
# stranger could fall due, whatever their waits (`AgingGuard.num_not_due`; without strangers none can: picks
# only add coverage), and once a due request is among the picks no other is due in the pass, so a due request
# and the picks after it are one call too (`first`); the guard's copy is only made when a due check has to
# read it, and dropped once a due request is taken. The plan keeps its picks in columns (candidates, waits,
# the requests skipped while taking them), not an object per pick. With the concentration rule the plan ends
# before the first pick that could lock a new prefix (one whose group runs nowhere, or whose cached prefix
# runs deeper than running requests hold it: the only picks the rule can hold back), which the step-by-step
# path then decides with the engine's room; every planned pick joins a running group, which the rule never
# holds back and measures (`Concentration.is_measured` draws the line). The engine puts the planned requests
# where its loop reaches next and its budgets decide how many join: admissions are a prefix of the plan, since
# its loop stops at the first refusal.
# `settle(num_admitted, refused)` does for that prefix what `decide` and `accept` do one request at a time
# (consults, stats, the real guard; the admission rolls the reward window and shows the concentration rule
# the room the engine reported at each planned pick), counts the first refused pick as withdrawn when the loop
# reached it, and undoes the rest in reverse: deactivated (a deactivated request keeps its place in the
# ranking) and the requests skipped while taking them resumed and uncounted. The requests skipped while
# taking a pick stay skipped when the pick before it was admitted: the step-by-step path takes each next pick
# right after an admission, whether or not the loop then reaches it.


@dataclass
class PassPlan:
    is_aged: bool
    """A due request is among the planned picks or was admitted earlier in the pass."""
    was_aged: bool
    """A due request was admitted earlier in the pass (`is_aged` when the plan opened)."""
    batch_size: int
    """The requests running when the pass began: pick i joins a batch of `batch_size + i`."""
    guard: AgingGuard | None = None
    """The aging guard as it will be once the planned picks are admitted (made when a due check reads it; none
    once the plan is aged, since no due check follows a due pick in its pass)."""
    candidates: list[Candidate] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    skipped: list[RequestId] = field(default_factory=list)
    """Requests skipped (in flight) while taking the picks, in order."""
    skip_ends: list[int] = field(default_factory=list)
    """`len(skipped)` once each pick was taken (the later skips came after it)."""
    aged_index: int | None = None
    """The pick the aging guard chose (at most one a pass)."""
    num_activated: int = 0
    """Picks activated in the tree: all but the last (its activation would only matter to a next pick)."""
    is_exhausted: bool = False
    """Nothing was left to pick after the last planned pick."""

    def __len__(self) -> int:
        return len(self.candidates)

    def guard_now(self, guard: AgingGuard) -> AgingGuard:
        """The guard as it will be once the picks so far are admitted, to read (`guard` itself while nothing is
        planned and no copy was made)."""
        return guard if self.guard is None and not self.waits else self.guard_copy(guard)

    def guard_copy(self, guard: AgingGuard) -> AgingGuard:
        """The plan's own copy of `guard`, made on first use and fed the waits planned so far."""
        if self.guard is None:
            self.guard = guard.clone()
            self.guard.served_all(self.waits)
        return self.guard

    def took_due(self) -> None:
        """The next pick is the guard's due request: the plan is aged from it on, and its copy of the guard, which
        only due checks read, is dropped (none follows in the pass)."""
        self.aged_index = len(self.candidates)
        self.is_aged = True
        self.guard = None

    def served(self, waits: list[float]) -> None:
        """Picks with these waits were planned (their waits reach the guard's copy, if one was made)."""
        self.waits += waits
        if self.guard is not None:
            self.guard.served_all(waits)

    def skipped_after(self, num_admitted: int) -> list[RequestId]:
        """The requests skipped while taking the picks after pick `num_admitted` (and after the last one)."""
        if num_admitted >= len(self.candidates):
            return []
        return self.skipped[self.skip_ends[num_admitted] :]


@dataclass(frozen=True)
class Settlement:
    """What `Planner.settle` booked: the admitted picks, and what the admission does once for them."""

    admitted: list[Candidate]
    is_aged: bool
    """The guard's due pick was among the admitted ones."""
    rolls: bool
    """The stopper decided on an admitted or refused pick: the pass's first decision rolls the reward window."""


NOTHING_SETTLED = Settlement([], False, False)


class Planner:
    """Plans a pass ahead (`plan_ahead`, then `settle`), with the same admissions, counts and guard as the
    step-by-step path (see "how it works"); it books into the stats it is given."""

    def __init__(self, stats: AdmissionStats, *, skips_in_flight: bool, stops_at_new_prefix: bool) -> None:
        self.stats = stats
        self.skips_in_flight = skips_in_flight
        """Skip picks whose prefix runs uncached (the in-flight check, answered by the cache tier)."""
        self.stops_at_new_prefix = stops_at_new_prefix
        """End the plan before a pick that could lock a new prefix (the concentration rule decides it)."""
        self._plan: PassPlan | None = None

    @property
    def num_planned(self) -> int:
        return 0 if self._plan is None else len(self._plan)

    @property
    def is_open(self) -> bool:
        return self._plan is not None

    def plan_ahead(
        self,
        tree: ChunkedHashTree,
        guard: AgingGuard,
        now: float,
        is_aged: bool,
        batch_size: int,
        max_picks: int,
        max_missing: int | None = None,
    ) -> list[Candidate]:
        """Up to `max_picks` more picks of this pass (see `Admission.plan_ahead`); `is_aged`: the guard served
        a request earlier in the pass (read when the plan opens, as is `batch_size`)."""
        plan = self._plan
        if plan is None:
            plan = self._plan = PassPlan(is_aged, is_aged, batch_size)
        first, missing_left = len(plan), checked_max_missing(max_missing)
        while len(plan) - first < max_picks and missing_left > 0 and not plan.is_exhausted:
            if plan.num_activated < len(plan):
                tree.activate(plan.candidates[-1].request_id)
                plan.num_activated += 1
            mark, num_picks = len(plan), max_picks - (len(plan) - first)
            num_unguarded, due = self._unguarded(tree, guard, now, plan, num_picks)
            if num_unguarded:
                self._take(tree, now, plan, num_unguarded, missing_left)
            elif due is None:
                plan.is_exhausted = True
            else:
                self._take(tree, now, plan, num_picks, missing_left, due)
                if len(plan) == mark:  # the due request's prefix runs uncached: it alone was skipped
                    self._take(tree, now, plan, 1, missing_left)
            if self.stops_at_new_prefix:
                self._stop_at_new_prefix(tree, plan, mark)
            missing_left -= sum(candidate.num_missing for candidate in plan.candidates[mark:])
        return plan.candidates[first:]

    def _unguarded(
        self, tree: ChunkedHashTree, guard: AgingGuard, now: float, plan: PassPlan, limit: int
    ) -> tuple[int, RequestId | None]:
        """How many of the next picks (up to `limit`) no due check can touch, and, when none can be taken so,
        the due request that goes first (None then: nothing waits). All once a due request was planned; none
        while one is due (`due_request`, with the plan's guard); while the oldest is past the bound, as many as
        leave the guard's budget closed; else as many as the overtaken rule leaves the oldest stranger not due
        (all without strangers: picks only add coverage, so none appears in the pass; no pick moves the
        bound)."""
        if plan.is_aged:
            return limit, None
        oldest = tree.oldest()
        if oldest is None:
            return 0, None
        guard = plan.guard_now(guard)
        due = due_request(tree, guard, now, False)
        if due is not None:
            return 0, due
        if guard.reached_bound(now - tree.arrival(oldest)):
            return guard.num_until_early(limit), None  # due once the guard's budget reopens
        stranger = tree.oldest_stranger()
        if stranger is None:
            return limit, None
        return guard.num_not_due(now - tree.arrival(stranger), limit), None

    def _take(
        self,
        tree: ChunkedHashTree,
        now: float,
        plan: PassPlan,
        num_picks: int,
        max_missing: int,
        due: RequestId | None = None,
    ) -> None:
        """Up to `num_picks` picks in one call of the tree, the last the one whose missing chunks bring their
        sum to `max_missing`: the ranking's (no due check can touch them), after `due` (the guard's, which
        then makes every other pick of the pass unguarded) unless it is in flight, when it alone is skipped."""
        taken = tree.take_picks(num_picks, self.skips_in_flight, max_missing, due)
        num_skipped = len(plan.skipped)
        plan.skipped += taken.skipped
        plan.skip_ends += [num_skipped + end for end in taken.skip_ends]
        self.stats.num_deferred += len(taken.skipped)
        candidates = taken.candidates
        waits = [now - candidate.arrival for candidate in candidates]
        if due is not None and candidates:
            plan.took_due()
        plan.candidates += candidates
        plan.served(waits)
        if taken.is_exhausted:
            plan.num_activated = len(plan)
            plan.is_exhausted = True
        elif candidates:
            plan.num_activated = len(plan) - 1

    def _stop_at_new_prefix(self, tree: ChunkedHashTree, plan: PassPlan, mark: int) -> None:
        """End the plan before its first pick from `mark` on that could lock a new prefix, the first one the
        concentration rule does not measure (its group runs nowhere, or its cache hit runs deeper than running
        requests; so every planned pick is measured: `Concentration.read_points`): undo that pick and the ones
        after it as `settle` undoes unadmitted picks; the requests skipped while taking it stay skipped, as they
        would after the admission before it."""
        candidates = plan.candidates
        measured = list(map(Concentration.is_measured, candidates[mark:]))
        if all(measured):
            return
        cut = mark + measured.index(False)
        for candidate in reversed(candidates[cut : plan.num_activated]):
            tree.deactivate(candidate.request_id)
        num_kept_skips = plan.skip_ends[cut]
        for rid in plan.skipped[num_kept_skips:]:
            self._unskip(tree, rid)
        del candidates[cut:], plan.waits[cut:], plan.skip_ends[cut:], plan.skipped[num_kept_skips:]
        plan.num_activated = cut
        plan.is_exhausted = True  # the step-by-step path decides the rest of the pass
        plan.guard = None  # fed the waits of undone picks; made again from `waits` if read
        if plan.aged_index is not None and plan.aged_index >= cut:
            plan.aged_index = None
            plan.is_aged = plan.was_aged

    def settle(
        self, tree: ChunkedHashTree, guard: AgingGuard, num_admitted: int, refused: bool
    ) -> Settlement:
        """The engine admitted the first `num_admitted` planned picks (`refused`: its loop reached the next one
        and its budget refused it): books them into the stats and the guard as `decide` and `accept` would
        have, counts the refused one as withdrawn, undoes the rest (see "how it works")."""
        plan = self._plan
        num_planned = 0 if plan is None else len(plan)
        if not 0 <= num_admitted <= num_planned:
            raise ValueError(f"settle: {num_admitted} admitted of {num_planned} planned picks")
        if plan is None:
            return NOTHING_SETTLED
        self._plan = None
        candidates = plan.candidates
        for candidate in reversed(candidates[num_admitted : plan.num_activated]):
            tree.deactivate(candidate.request_id)
        for candidate in candidates[plan.num_activated : num_admitted]:
            tree.activate(candidate.request_id)
        for rid in plan.skipped_after(num_admitted):
            self._unskip(tree, rid)
        is_aged, rolls = self._book(guard, plan, num_admitted)
        if refused and num_admitted < num_planned:
            if plan.aged_index != num_admitted:  # the stopper decided on it (`Admission._count_decision`)
                rolls = True
                self._count_consult(plan.batch_size + num_admitted, candidates[num_admitted])
            self.stats.num_withdrawn += 1
        return Settlement(candidates[:num_admitted], is_aged, rolls)

    def _book(self, guard: AgingGuard, plan: PassPlan, num_admitted: int) -> tuple[bool, bool]:
        """`_count_consult` and the admission's bookkeeping for each admitted planned pick, in order, with the
        guard's served waits fed in runs (its state depends only on the waits it kept and the aged admissions).
        Returns whether the guard's pick was admitted and whether the stopper decided on any."""
        if not num_admitted:
            return False, False
        stats = self.stats
        waits = plan.waits[:num_admitted]
        aged = plan.aged_index if plan.aged_index is not None and plan.aged_index < num_admitted else None
        if aged is None:
            guard.served_all(waits)
        else:
            guard.served_all(waits[:aged])
            stats.num_aged += 1
            guard.admitted(waits[aged], plan.candidates[aged].is_stranger)
            guard.served_all(waits[aged:])
        # `_count_consult` for each decided pick, in one loop (a cold pass reads each candidate once): pick i
        # joins a batch of `batch_size + i`.
        batch_size = plan.batch_size
        num_consults = num_group_consults = sum_delta = 0
        for i, candidate in enumerate(plan.candidates[:num_admitted]):
            delta = candidate.depth_before - candidate.depth_after
            sum_delta += delta
            adds_group = candidate.depth_running == 0
            if i != aged and not is_forced_case(batch_size + i, adds_group, delta):
                num_consults += 1
                num_group_consults += adds_group
        stats.num_consults += num_consults
        stats.num_group_consults += num_group_consults
        stats.sum_delta += sum_delta
        stats.num_admitted += num_admitted  # the in-flight check reads no admissions here (`can_plan`)
        return aged is not None, num_admitted - (aged is not None) > 0

    def _count_consult(self, batch_size: int, candidate: Candidate) -> None:
        if not is_forced_case(batch_size, candidate.adds_group, candidate.delta):
            self.stats.num_consults += 1
            self.stats.num_group_consults += candidate.adds_group

    def forget(self) -> None:
        """Drop the open plan without undoing it (its requests left the tree: `forget_all`)."""
        self._plan = None

    def _unskip(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """Undo a skip taken while planning a pick the engine never reached."""
        tree.resume(request_id)
        self.stats.num_deferred -= 1
