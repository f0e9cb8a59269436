"""Which waiting request the aging guard serves now: the guard's rule (policy/aging.py) applied to the CHT."""

from __future__ import annotations

from sglang_feather.cht import Candidate, ChunkedHashTree
from sglang_feather.policy import AgingGuard
from sglang_feather.types import RequestId

# How it works. The guard is *closed* (serves nothing now) once it served a request in this pass, once the
# concentration rule held its pick back in this pass, or while it served one of the last EARLY_EVERY
# admissions (`AgingGuard.serves_early`). Otherwise it serves the oldest stranger once that one is due (the
# ranking serves strangers last), else the oldest request once it reached the bound. A request the engine
# names is due when the guard is open and it is due itself: a stranger by the bound or the overtaken rule,
# any other by the bound. `now` is the admission's clock; a pass planned ahead asks with its own copy of the
# guard, as it will be once its picks so far are admitted.


def is_closed(guard: AgingGuard, is_closed_in_pass: bool) -> bool:
    """No request is due now: the pass closed the guard (`is_closed_in_pass`) or its budget is spent."""
    return is_closed_in_pass or not guard.serves_early


def due_request(
    tree: ChunkedHashTree, guard: AgingGuard, now: float, is_closed_in_pass: bool
) -> RequestId | None:
    """The waiting request `guard` serves now (None: none, or the guard is closed)."""
    if is_closed(guard, is_closed_in_pass):
        return None
    oldest = tree.oldest()
    if oldest is None:
        return None
    oldest_wait_s = now - tree.arrival(oldest)
    if not guard.is_starved(oldest_wait_s):
        return None  # no stranger waited that long, and the bound is no earlier than a stranger's due
    stranger = tree.oldest_stranger()
    if stranger is not None and guard.is_starved(now - tree.arrival(stranger)):
        return stranger
    return oldest if guard.reached_bound(oldest_wait_s) else None


def is_due(candidate: Candidate, guard: AgingGuard, now: float, is_closed_in_pass: bool) -> bool:
    """`guard` serves this request now (see "how it works")."""
    if is_closed(guard, is_closed_in_pass):
        return False
    wait_s = now - candidate.arrival
    return guard.is_starved(wait_s) if candidate.is_stranger else guard.reached_bound(wait_s)
