"""Starvation guard: a request that waited too long is admitted first, whatever the ranking and stopper say."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, insort
from collections import deque

DEFAULT_MAX_WAIT_S = 300.0
"""Five minutes; see docs/policy.md ("Aging guard") for why this leaves the paper's workloads unchanged."""

LEAD_WINDOW = 16
"""Aged admissions whose delay sets the lead, and admissions whose median wait makes a request overtaken (the
guard follows changes in load within this many)."""

EARLY_EVERY = 12
"""The guard serves at most one admission in this many ahead of the ranking (by the overtaken rule or the bound).
Chosen in the simulator for the overtaken rule (docs/policy.md, "Aging guard", where 4, 8, 12 and 16 were
measured): the largest that kept every cold wait below FCFS's on three seeds of the starvation trace that keeps
up; larger ones gave more of the ranking's order back under KV pressure."""

# How it works.
#
# A request is *due* once its wait reaches `max_wait_s - lead_s` (the bound, for every request). A *stranger*
# (a request with nothing covered, neither running nor cached: the one the ranking serves last) is also due,
# with `when_overtaken` (the default), once it has waited longer than the median of the last LEAD_WINDOW
# admitted requests and none of the last EARLY_EVERY admissions was served by the guard: the ranking is
# overtaking it, and arrival order would have served it by now. A covered request is never
# overtaken in that sense: the ranking serves its group by depth and size, so it is due at the bound alone
# (serving a small group's request early only mixes another prefix into the batch; on 32 Zipf groups under a
# backlog that rule cost 6 % of the throughput and 40 % more groups per decode step, docs/policy.md). At
# most one admission in EARLY_EVERY is the guard's (`serves_early`), the bound's included: a rare cold prompt
# among hot groups, or a request past the bound, is served within a few admissions, while a queue that is
# slow for everyone (overload, a closed-loop client, where every request passes the bound and no order can
# keep it) keeps the rest of its admissions in the ranking's order instead of turning first come, first served
# (which there costs the throughput that would drain the queue: on issue 49's 16K-prefix grid cell one
# guarded admission per pass made 317 tok/s against dfs-weight's 472, and longer waits than either). The
# admission component serves at most one due request per scheduling pass before it consults the ranking, and
# defers it only while running requests are still computing the prefix it shares with them (a pass; it is
# due again in the next): the oldest request once it reached the bound, else the oldest stranger when it is
# due. The requests that share its prefix then rank first by coverage and follow it. An engine may still
# refuse a due request (its KV room is short) until running requests finish; the pass then ends there, so the
# room that frees goes to it first. The time from falling due to admission is that wait for room plus the wait
# for a pass of its own. `lead_s` is the longest such delay over the last LEAD_WINDOW aged admissions (at most
# half the bound), so a request falls due that much before the bound and its admission lands by the bound when
# the load that set the lead persists. Measured in the simulator (docs/policy.md, "Aging guard"): on traces
# where cold prompts arrive among hot groups the longest cold wait stays below FCFS's, overloaded or not.


def _median(ordered: list[float]) -> float:
    """`statistics.median` of a non-empty sorted list, without its per-call checks or sort."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class AgingGuard:
    """`is_starved(wait_s)` (a stranger: the bound or the overtaken rule) is true from `due_wait_s` on,
    `reached_bound(wait_s)` (any request) from `bound_wait_s` on (both inclusive); `max_wait_s=None` turns the
    guard off. `admitted(wait_s, stranger)` reports an aged admission, which updates the lead; `served(wait_s)`
    any admission."""

    def __init__(self, max_wait_s: float | None = DEFAULT_MAX_WAIT_S, when_overtaken: bool = True) -> None:
        if max_wait_s is not None and not (
            isinstance(max_wait_s, int | float) and math.isfinite(max_wait_s) and max_wait_s > 0
        ):
            raise ValueError(f"AgingGuard max_wait_s must be a finite number > 0 or None, got {max_wait_s!r}")
        self.max_wait_s = None if max_wait_s is None else float(max_wait_s)
        self.lead_s = 0.0
        self._delays: deque[float] = deque(maxlen=LEAD_WINDOW)
        self.when_overtaken = when_overtaken
        self._recent: deque[float] = deque(maxlen=LEAD_WINDOW)
        """Waits of the last admitted requests (any, aged or not)."""
        self._ordered: list[float] = []
        """`_recent` sorted, kept in step with it (a served wait costs a bisection, not a sort)."""
        self._num_since_early = EARLY_EVERY
        """Admissions since the guard last served one, that one included (the budget starts open)."""
        self._due_s: float | None = None
        self._update_due()

    @property
    def enabled(self) -> bool:
        return self.max_wait_s is not None

    @property
    def due_wait_s(self) -> float | None:
        """The wait from which a stranger is due: the bound, or earlier by the overtaken rule (None: off)."""
        return self._due_s

    @property
    def bound_wait_s(self) -> float | None:
        """The wait from which any request is due: the bound less the lead (None: the guard is off)."""
        return None if self.max_wait_s is None else self.max_wait_s - self.lead_s

    def _update_due(self) -> None:
        due = self.bound_wait_s
        if due is None:
            self._due_s = None
            return
        if self.when_overtaken and len(self._recent) == LEAD_WINDOW and self.serves_early:
            due = min(due, _median(self._ordered))
        self._due_s = due

    def served(self, wait_s: float) -> None:
        """Any request was admitted after waiting `wait_s` (the wait kept only for the overtaken rule)."""
        self._num_since_early += 1
        if self.when_overtaken:
            self._keep(wait_s)
            self._update_due()

    def _keep(self, wait_s: float) -> None:
        recent, ordered = self._recent, self._ordered
        if len(recent) == recent.maxlen:
            ordered.remove(recent[0])
        recent.append(wait_s)
        insort(ordered, wait_s)

    def served_all(self, waits_s: list[float]) -> None:
        """`served` for each wait, in order (the due wait is worked out once)."""
        self._num_since_early += len(waits_s)
        if self.when_overtaken and waits_s:
            if len(waits_s) == 1:
                self._keep(waits_s[0])
            else:  # sorting the window once beats a bisection and a removal per wait
                self._recent.extend(waits_s)
                self._ordered = sorted(self._recent)
            self._update_due()

    @property
    def serves_early(self) -> bool:
        """The guard may serve a request ahead of the ranking: none of the last EARLY_EVERY admissions was its."""
        return self._num_since_early >= EARLY_EVERY

    def num_until_early(self, limit: int) -> int:
        """How many of the next admissions (up to `limit`) pass before `serves_early` is true again (0: now)."""
        return min(limit, max(0, EARLY_EVERY - self._num_since_early))

    def is_starved(self, wait_s: float) -> bool:
        """A stranger that waited `wait_s` is due (`due_wait_s`); no request is due before this is true."""
        if math.isnan(wait_s):
            raise ValueError("AgingGuard.is_starved: wait_s is NaN")
        due = self._due_s
        return due is not None and wait_s >= due

    def reached_bound(self, wait_s: float) -> bool:
        """Any request that waited `wait_s` is due (`bound_wait_s`)."""
        if math.isnan(wait_s):
            raise ValueError("AgingGuard.reached_bound: wait_s is NaN")
        bound = self.bound_wait_s
        return bound is not None and wait_s >= bound

    def num_not_due(self, wait_s: float, limit: int) -> int:
        """How many of the next admissions (up to `limit`) leave a stranger that waited `wait_s` not due when
        each is chosen (after the ones before it were `served`), whatever their waits: what a planned pass may
        take without a due check when `wait_s` is the longest wait of a stranger in the queue and no request
        reached the bound (which no `served` moves). The due wait only changes
        through `served` where the overtaken rule is open (the window is full and the rule's budget is
        spent), and it falls fastest when every wait served is shorter than all the guard kept: so the count
        is where that case would make `wait_s` due."""
        due, bound = self._due_s, self.bound_wait_s
        if due is None or bound is None:
            return limit
        if wait_s >= due:
            return 0
        if not self.when_overtaken:
            return limit
        recent = self._recent
        mid = LEAD_WINDOW // 2
        first_open = max(1, LEAD_WINDOW - len(recent), EARLY_EVERY - self._num_since_early)
        kept = self._ordered.copy()
        num_dropped = 0
        for num_served in range(first_open, min(limit, mid)):
            # The window then holds num_served new waits (all below `kept`) and the newest of the old ones.
            for old in itertools.islice(recent, num_dropped, len(recent) + num_served - LEAD_WINDOW):
                del kept[bisect_left(kept, old)]
                num_dropped += 1
            median = (kept[mid - 1 - num_served] + kept[mid - num_served]) / 2
            if wait_s >= min(bound, median):
                return num_served
        # From `mid` new waits on, the median's lower half would be all new, shorter waits: it could be due.
        return min(limit, max(first_open, mid))

    def admitted(self, wait_s: float, stranger: bool = True) -> None:
        """A due request was admitted after waiting `wait_s`: the delay since it fell due (a `stranger` by
        `due_wait_s`, any other by `bound_wait_s`) sets the lead, and the guard serves no other request for
        EARLY_EVERY admissions (this one included). Report it before `served`."""
        due = self.due_wait_s if stranger else self.bound_wait_s
        max_wait_s = self.max_wait_s
        if due is None or max_wait_s is None or math.isnan(wait_s):
            return
        self._num_since_early = 0
        self._delays.append(max(0.0, wait_s - due))
        self.lead_s = min(max(self._delays), max_wait_s / 2)
        self._update_due()

    def clone(self) -> AgingGuard:
        """An independent guard in the same state (a planned pass feeds it the waits it expects to serve)."""
        twin = AgingGuard.__new__(AgingGuard)  # no __init__ checks, no copy module: a planned pass makes one
        twin.__dict__.update(self.__dict__)
        twin._delays = self._delays.copy()
        twin._recent = self._recent.copy()
        twin._ordered = self._ordered.copy()
        return twin

    def __repr__(self) -> str:
        return f"AgingGuard(max_wait_s={self.max_wait_s!r}, lead_s={self.lead_s:.3g})"
