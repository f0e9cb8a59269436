"""The mirror's sorted part against SGLang's own waiting queue, under any sequence of the scheduler's events."""

from __future__ import annotations

import os

import pytest
from conftest import group_prompt
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sglang_feather.admission import AdmissionConfig
from sglang_feather.offline.adapter_harness import AdapterHarness
from sglang_feather.offline.sglang_objects import make_req
from sglang_feather.sglang.options import FEATHER, FeatherOptions

CHUNK = 16


class QueueOrderMachine(RuleBasedStateMachine):
    """Real SGLang objects through the plugin's hooks (`AdapterHarness`); the reference is SGLang's queue
    itself. After every event: the mirror's sorted part is the queue less Feather's moved head (while kept), the
    tree holds exactly the waiting and running requests, and no pick needed a bisection or a scan unless
    SGLang's loop passed over a request (which leaves one before the slot the sorted part does not count)."""

    plans_ahead = True

    def __init__(self) -> None:
        super().__init__()
        self.harness = AdapterHarness(
            FEATHER,
            options=FeatherOptions(AdmissionConfig(chunk_size=CHUNK, stopper="always")),
            allocator_size=3000,
        )
        self.runtime = self.harness.runtime
        self.runtime.plans_ahead = self.plans_ahead
        self.runtime.plan_from = 0  # every pass planned, however few the last one admitted
        self.num_arrived = 0
        self.passed_over = False

    @rule(group=st.integers(0, 5), suffix=st.integers(1, 200), count=st.integers(1, 40))
    def arrive(self, group: int, suffix: int, count: int) -> None:
        for _ in range(count):
            prompt = group_prompt(group, 128, suffix, salt=self.num_arrived)
            self.harness.arrive(make_req(f"r{self.num_arrived}", prompt, max_new_tokens=4))
            self.num_arrived += 1

    @rule(pass_over=st.integers(0, 3), index=st.integers(0, 10_000))
    def prefill(self, pass_over: int, index: int) -> None:
        """A pass (its admissions join the running batch); with `pass_over` 0 SGLang's loop passes over one
        waiting request, as for a LoRA adapter it cannot load."""
        waiting = self.harness.waiting
        skipped = {waiting[index % len(waiting)].rid} if waiting and pass_over == 0 else set()
        self.passed_over |= bool(skipped)
        self.harness.merge(self.harness.prefill_pass(passes_over=skipped).admitted)

    @precondition(lambda self: self.harness.running)
    @rule(index=st.integers(0, 10_000), retract=st.booleans())
    def leave_running(self, index: int, retract: bool) -> None:
        running = self.harness.running
        req = running[index % len(running)]
        (self.harness.retract if retract else self.harness.finish)(req)

    @precondition(lambda self: self.harness.waiting)
    @rule(index=st.integers(0, 10_000))
    def abort_waiting(self, index: int) -> None:
        waiting = self.harness.waiting
        self.harness.abort_waiting(waiting[index % len(waiting)])

    @rule()
    def self_check(self) -> None:
        self.harness.self_check()

    @invariant()
    def sorted_part_follows_the_queue(self) -> None:
        self.runtime.check_queue_order(self.harness.waiting)

    @invariant()
    def tree_holds_the_queues(self) -> None:
        tree = self.runtime.admission.tree
        assert sorted(tree.waiting_ids()) == sorted(req.rid for req in self.harness.waiting)
        assert sorted(tree.active_ids()) == sorted(req.rid for req in self.harness.running)
        assert self.runtime.num_errors == 0 and self.runtime.num_drift == 0

    @invariant()
    def picks_are_where_their_rank_says(self) -> None:
        if not self.passed_over:
            assert self.runtime.num_misses == 0 and self.runtime.num_scans == 0

    def teardown(self) -> None:
        self.harness.close()


SETTINGS = settings(
    max_examples=25 if os.environ.get("FEATHER_TEST_FAST") == "1" else 60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("plans_ahead", [True, False], ids=["planned", "step"])
def test_the_sorted_part_follows_sglangs_queue(plans_ahead):
    machine = type(f"QueueOrder{plans_ahead}", (QueueOrderMachine,), {"plans_ahead": plans_ahead})
    run_state_machine_as_test(machine, settings=SETTINGS)
