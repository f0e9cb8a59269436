"""A pass planned ahead for a blind stopper: the admission's next picks, each activated as it is taken."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_feather.admission.results import Pick
from sglang_feather.policy import AgingGuard
from sglang_feather.types import ChunkHash, RequestId

# How it works.
#
# With a stopper that always adds without looking (`always`, the default) and an in-flight check that needs
# no engine query (answered by the cache tier, or off), a pass's picks depend only on the tree and the aging
# guard, so the admission can take them before the engine's loop reaches them. `plan_ahead(batch_size, n)`
# takes up to n more picks exactly as `next_pick` would after each `accept`: each pick is activated in the
# tree before the next is taken (the next one sees it running; the last waits for the plan to go on or for
# `settle`, so a refused last pick costs nothing to undo), and its wait goes to a copy of the guard (a request that
# falls due mid-pass, as the median of served waits drops, is served where the step-by-step path serves it).
# The engine puts the planned requests where its loop reaches next and its budgets decide how many join:
# admissions are a prefix of the plan, since its loop stops at the first refusal. `settle(num_admitted,
# refused)` does for that prefix what `decide` and `accept` do one request at a time (the reward window's
# roll, consults, stats, footprint, the real guard), counts the first refused pick as withdrawn when the loop
# reached it, and undoes the rest in reverse: deactivated (a deactivated request keeps its place in the
# ranking) and the requests skipped while taking them resumed and uncounted. The requests skipped while taking
# a pick stay skipped when the pick before it was admitted: the step-by-step path takes each next pick right
# after an admission, whether or not the loop then reaches it.


@dataclass(frozen=True, slots=True)
class PlannedPick:
    pick: Pick
    batch_size: int
    """The batch it joins: the requests running when the pass began plus the picks planned before it."""
    group: ChunkHash
    num_new_chunks: int
    """Chunks it adds to the working set (the footprint's count)."""
    wait_s: float
    skipped: tuple[RequestId, ...]
    """Requests skipped (in flight) while this pick was taken, after the previous one."""

    @property
    def request_id(self) -> RequestId:
        return self.pick.request_id


@dataclass
class PassPlan:
    guard: AgingGuard
    """The aging guard as it will be once the planned picks are admitted."""
    is_aged: bool
    """A due request is among the planned picks or was admitted earlier in the pass."""
    batch_size: int
    picks: list[PlannedPick] = field(default_factory=list)
    num_activated: int = 0
    """Picks activated in the tree: all but the last (its activation would only matter to a next pick)."""
    tail_skipped: tuple[RequestId, ...] = ()
    """Requests skipped while looking for a pick after the last one, when none was left."""
    is_exhausted: bool = False
    """Nothing was left to pick after the last planned pick."""
