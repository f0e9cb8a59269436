"""Passes planned ahead through SGLang's adder: a block of picks placed at once, booked at the first refusal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_feather.admission import Admission
from sglang_feather.cht import Candidate
from sglang_feather.sglang.slots import QueueSlots

# How it works.
#
# With a stopper that adds without looking (`always`, the default) and the cache tier fed, passes are planned
# ahead instead (`admission/plan.py`): `begin_pass` takes a block of picks at once (one more than SGLang
# admitted in the last pass) and moves them to the head of the queue in order. The adder only reads whether
# the request its loop reached is the plan's next one (`planned[k]`, k the plan's admissions so far, which are
# a prefix of it) and runs SGLang's own `add_one_req`; Feather hears of the plan's first request
# (`plan_reached`: where the loop's admissions start), of a refusal (`planned_refused`) and of the block's last
# admission (`planned_all_added`: a block twice as long follows), never of each admission, which it counts
# from SGLang's `can_run_list`. At the first refusal, when nothing is left to plan, when the loop passes over a
# planned request, or else at the step end, `settle` books what SGLang admitted and undoes the rest; a pass
# that goes on after it steps: when the plan ended before a pick the concentration rule decides (or planned
# nothing), that pick is offered where the loop reaches next, as the step path would, and once the step path
# admitted it the rest of the pass is planned again (unless a hold or a STOP closed it). With the rule on, the
# adder also reports SGLang's KV room before the planned requests where the rule reads it (`room_reads`,
# `Concentration.read_points`) and after a refusal (`room`), which `settle` shows the rule. The admissions are
# the same as the step path's (tests/sglang/test_planned_pass.py).


@dataclass(frozen=True, slots=True)
class Settled:
    """What settling a plan booked, for the metrics: the admitted picks and the stopper's consults it counted
    (those on a pick that adds a prefix group, and the others)."""

    admitted: list[Candidate]
    num_group_consults: int
    num_other_consults: int


class PlannedPasses:
    """The planned pass's state and the adder's steps into it (see "how it works"). It owns the plan and
    receives the admission component that plans and books it and the queue slots that place its requests; the
    runtime times its calls, records what a settle booked (`Settled`) and turns an exception into an FCFS
    pass."""

    def __init__(
        self, admission: Admission, slots: QueueSlots, prefill_budget_tokens: int | None, chunk_size: int
    ) -> None:
        """`prefill_budget_tokens`: the prompt tokens one prefill batch may compute (None: unknown); it sizes
        planned blocks."""
        self.admission = admission
        self.slots = slots
        self.num_planned_passes = 0
        """Passes planned ahead so far (the others stepped)."""
        self.planned: list[Any] | None = None
        """This pass's planned requests in queue order (None: the pass goes step by step). The adder treats the
        request its loop reaches as planned when it is `planned[k]`, k the plan's admissions so far (`planned[0]`
        before `reached`): a list read, with no call into Feather. Once it admits `planned[-1]`, `all_added`
        plans the next block."""
        self.picks: list[Candidate] = []
        """The plan's picks, in order (`planned`'s requests)."""
        self.planned_can_run: list[Any] | None = None
        """SGLang's adder's `can_run_list` once its loop reached the plan (`reached`), and its length then
        (`planned_mark`): what it gained since are the plan's admitted requests, in order."""
        self.planned_mark = 0
        self._moved_mark = 0
        """Where this plan's placed requests start in the slots' moved requests (its admitted ones leave them at
        settle)."""
        self._refused = False
        self._block = 1
        self._block_missing: int | None = None
        """The planned block's budget of missing chunks (None: no budget known, the block's size alone)."""
        self._budget_chunks = (
            None
            if prefill_budget_tokens is None or prefill_budget_tokens <= 0
            else -(-prefill_budget_tokens // chunk_size)
        )
        self.last_num_admitted = 0
        """Requests the last pass admitted: the next pass plans one more at first."""
        self.plan_slot = 0
        """Where this plan's requests start in the queue (0 but for a plan of the rest of a pass)."""
        self.resume_slot = 0
        """Where the step path goes on after a plan that settled with nothing left to plan."""
        self.room_reads: list[bool] | None = None
        """Whether the adder reads SGLang's KV room before `planned[k]`, for the concentration rule (None: no
        plan, or the rule is off)."""
        self.planned_rooms: dict[int, int | None] = {}
        """The rooms read (tokens), by plan index: before `planned[k]`, or after a refusal at k."""

    def begin(self, batch_size: int, slot: int = 0) -> Settled | None:
        """Plan the pass's first block from `queue[slot]` on (0: its start; later, after a request the step path
        admitted). When nothing could be planned (nothing left, or the first pick is the concentration rule's to
        decide) the plan settles at once (returned) and the step path goes on from `slot`."""
        self.num_planned_passes += slot == 0
        self.plan_slot = slot
        planned: list[Any] = []
        self.planned, self.picks, self.planned_can_run = planned, [], None
        self._moved_mark = self.slots.num_moved
        self._refused = False
        if self._budget_chunks is None:
            self._block = self.last_num_admitted + 1
        else:  # the budget ends the block; twice the last pass's admissions bound it where picks are cheap
            self._block = 2 * (self.last_num_admitted + 1)
        self._block_missing = self._budget_chunks
        self.room_reads = [] if self.admission.concentration is not None else None
        self.planned_rooms = {}
        self._plan_block(batch_size, planned)
        if not planned:
            return self.settle()
        return None

    def _plan_block(self, batch_size: int, planned: list[Any]) -> None:
        """Plan the next block and move its requests into the slots SGLang's loop reaches next (after
        `planned`, the plan's requests so far)."""
        picks = self.admission.plan_ahead(batch_size, self._block, self._block_missing)
        self._block *= 2
        if self._block_missing is not None:
            self._block_missing *= 2
        rule = self.admission.concentration
        if self.room_reads is not None and rule is not None:
            self.room_reads += rule.read_points(len(self.picks), len(picks))
        self.picks += picks
        planned += self.slots.place(picks, self.plan_slot + len(planned))

    @property
    def num_planned_admitted(self) -> int:
        """The plan's requests SGLang's adder admitted so far (a prefix of the plan)."""
        return 0 if self.planned_can_run is None else len(self.planned_can_run) - self.planned_mark

    def reached(self, can_run: list[Any]) -> None:
        """SGLang's loop reached the plan's first request: its adder's admissions from here on are the plan's."""
        self.planned_can_run, self.planned_mark = can_run, len(can_run)

    def all_added(self) -> Settled | None:
        """SGLang's adder admitted the plan's last request: a block twice as long follows (or, with nothing
        left to plan, the plan settles and the step path goes on from `resume_slot`)."""
        planned = self.planned
        assert planned is not None, "a plan is open: the adder admitted its last request"
        num_placed = len(planned)
        self._plan_block(0, planned)
        if self.num_planned_admitted == len(planned):
            self.resume_slot = (
                self.plan_slot + num_placed
            )  # the step path's next pick, if the plan ended early
            return self.settle()
        return None

    def room(self, k: int, num_free_tokens: int | None) -> None:
        """SGLang had `num_free_tokens` of KV room before `planned[k]` (or after refusing it: the same room), for
        the concentration rule (`planned_rooms`)."""
        self.planned_rooms[k] = num_free_tokens

    def refused(self) -> Settled | None:
        """SGLang's budget refused the planned request its loop reached: the plan settles (the pass ends there,
        or goes on past the refusal step by step)."""
        self._refused = True
        return self.settle()

    def passed_over(self) -> Settled | None:
        """SGLang's loop passed over a planned request: the plan settles, and the request it passed over is
        skipped for this pass."""
        passed_over = self.num_planned_admitted  # an open plan was refused nothing: all it reached joined
        settled = self.settle()
        if passed_over < len(self.picks):
            self.admission.skip(self.picks[passed_over])
        return settled

    def settle(self) -> Settled | None:
        """Book what SGLang admitted of the plan and undo the rest (None: no plan is open); the pass (if it goes
        on) steps."""
        if self.planned is None:
            return None
        can_run = self.planned_can_run
        num_admitted = 0 if can_run is None else len(can_run) - self.planned_mark  # `num_planned_admitted`
        self.close()
        mark = self._moved_mark
        self.slots.drop_moved(mark, num_admitted)
        stats = self.admission.stats
        num_consults, num_group = stats.num_consults, stats.num_group_consults
        rooms, self.planned_rooms = self.planned_rooms, {}
        admitted = self.admission.settle(num_admitted, self._refused, rooms)
        num_new_group = stats.num_group_consults - num_group
        return Settled(
            admitted,
            num_new_group,
            stats.num_consults - num_consults - num_new_group,
        )

    def close(self) -> None:
        """Drop the plan (settled, or abandoned after an exception)."""
        self.planned = self.planned_can_run = self.room_reads = None
