"""The planned pass in the compiled core: `Planning`'s API, with the guard, picks and booking in core.cpp."""

from __future__ import annotations

import sys

from sglang_feather.admission.core import Admission
from sglang_feather.admission.costs import NoFootprint
from sglang_feather.admission.plan import Planning
from sglang_feather.cht import Candidate
from sglang_feather.cht._native._core import AgingGuard as CompiledGuard
from sglang_feather.cht.native import NativeTree

# How it works. `Planning` (plan.py) is the algorithm and the reference model; here the compiled tree runs it:
# `_plan_ahead` takes the picks with the due checks of a compiled copy of the guard and keeps the plan's
# columns, `_settle_plan` undoes what the engine did not admit, feeds the admission's (compiled) guard and
# returns the counts this mixin adds to the stats. One call into the core each, no Python frame per pick, due
# check or booked admission. The admission's guard must be the compiled one (`CompiledGuard`, guard.h: the
# Python `AgingGuard`'s state and results, tests/cht/test_compiled_guard.py), which the step path reads too.

__all__ = ["CompiledAdmission", "CompiledGuard", "CompiledPlanning"]

NO_LIMIT = sys.maxsize
"""`max_missing` None: no budget (as `checked_max_missing` reads it)."""


class CompiledPlanning(Planning):
    """`Planning` on the compiled tree and guard; same picks, counts and guard state (tests/core/test_pass_plan.py)."""

    def plan_ahead(self, batch_size: int, max_picks: int, max_missing: int | None = None) -> list[Candidate]:
        if not self.can_plan:
            raise ValueError("plan_ahead needs a stopper that adds without looking and no engine-asked check")
        if self._groups_closed:
            raise RuntimeError("a planned pass was closed to new prefix groups (only a STOP closes one)")
        picks, num_skipped = self.tree._plan_ahead(
            self.guard,
            self._aged_this_pass,
            batch_size,
            max_picks,
            NO_LIMIT if max_missing is None else max_missing,  # the core refuses a non-integer or one below 1
            self._in_flight.enabled,
            self.clock(),
        )
        self.stats.num_deferred += num_skipped
        return picks

    @property
    def num_planned(self) -> int:
        return self.tree._num_planned

    def settle(self, num_admitted: int, refused: bool) -> list[Candidate]:
        admitted, num_resumed, num_consults, num_group_consults, sum_delta, aged, rolls, withdrawn = (
            self.tree._settle_plan(self.guard, num_admitted, refused)
        )
        stats = self.stats
        stats.num_deferred -= num_resumed
        stats.num_consults += num_consults
        stats.num_group_consults += num_group_consults
        stats.sum_delta += sum_delta
        stats.num_admitted += num_admitted
        stats.num_withdrawn += withdrawn
        if aged:
            stats.num_aged += 1
            self._aged_this_pass = True
        if rolls:
            self._roll_window_once()
        if num_admitted and not isinstance(self.footprint, NoFootprint):
            self.footprint = NoFootprint()  # a blind stopper's pass keeps none (`Planning._book`)
        return admitted

    def _drop_plan(self) -> None:
        if self.tree._plan_open:
            self.settle(0, False)

    def _forget_plan(self) -> None:
        self.tree._forget_plan()


class CompiledAdmission(CompiledPlanning, Admission):
    """`Admission` with the compiled planned pass; needs the compiled tree and guard."""

    def __init__(self, tree, stopper, guard, *args, **kwargs) -> None:
        if not isinstance(guard, CompiledGuard) or not isinstance(tree, NativeTree):
            raise TypeError(
                "CompiledAdmission needs the compiled tree (NativeTree) and guard (CompiledGuard)"
            )
        super().__init__(tree, stopper, guard, *args, **kwargs)
