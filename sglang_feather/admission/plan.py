"""A pass planned ahead for a blind stopper: the admission's next picks, each activated as it is taken."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_feather.cht import Candidate
from sglang_feather.policy import AgingGuard
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
# serves it). Picks that no due check can touch are taken in one call of the tree (`take_picks`, compiled in
# the native core): while no request reached the bound, the guard says how many admissions it takes before even
# the longest-waiting stranger could fall due, whatever their waits (`AgingGuard.num_not_due`; without strangers
# none can: picks only add coverage), and once a due request is among the picks no
# other is due in the pass, so a due request and the picks after it are one call too (`first`); the guard's
# copy is only made when a due check has to read it, and dropped once a due request is taken. The plan keeps
# its picks in columns (candidates, waits, the requests skipped while taking them), not an object per pick.
# The engine puts the planned requests where its loop reaches next and its budgets decide how many join:
# admissions are a prefix of the plan, since its loop stops at the first refusal. `settle(num_admitted,
# refused)` does for that prefix what `decide` and `accept` do one request at a time (the reward window's
# roll, consults, stats, the real guard; a blind stopper keeps no footprint), counts the first refused pick as
# withdrawn when the loop reached it, and undoes the rest in reverse: deactivated (a deactivated request keeps
# its place in the ranking) and the requests skipped while taking them resumed and uncounted. The requests
# skipped while taking a pick stay skipped when the pick before it was admitted: the step-by-step path takes
# each next pick right after an admission, whether or not the loop then reaches it.


@dataclass
class PassPlan:
    is_aged: bool
    """A due request is among the planned picks or was admitted earlier in the pass."""
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
