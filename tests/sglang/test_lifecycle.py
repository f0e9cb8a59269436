"""The CHT mirrors SGLang's queues through retraction, aborts, chunked prefill and prompt growth; no leaks."""

from __future__ import annotations

import random

from conftest import (
    FakeClock,
    adder_pass,
    batch,
    decode_plan,
    feather_policy,
    group_prompt,
    idle_plan,
    make_allocator,
    make_cache,
    make_req,
    scheduler_view,
)
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH

from sglang_feather.admission import AdmissionConfig
from sglang_feather.cht import RequestState
from sglang_feather.sglang.options import FeatherOptions
from sglang_feather.sglang.scheduler_hooks import on_aborted, on_kv_released, on_queued, on_step_end

OPTIONS = FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"))
STRICT = {"max_chunk_loss": 0, "max_chunk_loss_lenient": 0, "min_floor": 1, "max_floor": 1}
"""`static` that stops at the first candidate costing any shared chunk once the batch is non-empty."""


class MiniScheduler:
    """SGLang's scheduler bookkeeping around the real policy, PrefillAdder, Req and batches (no model).

    `step()` does what `get_next_batch_to_run` does to the queues: drop finished requests from the running
    batch (releasing their KV, SGLang's `release_kv_cache` event), run one prefill pass (calc_priority, then the
    adder loop that stops at the first refusal), move admitted requests out of the waiting queue, and end with
    Feather's step hook. `add`, `abort_waiting` and `retract` raise the events SGLang's scheduler raises.
    """

    def __init__(self, options: FeatherOptions = OPTIONS, clock: FakeClock | None = None) -> None:
        self.allocator = make_allocator(1 << 20)
        self.cache = make_cache(self.allocator)
        self.policy = feather_policy(self.cache, options, clock)
        self.waiting_queue: list = []
        self.running = batch()
        self.chunked_req = None

    @property
    def tree(self):
        return self.policy.feather.admission.tree

    def view(self):
        return scheduler_view(self.policy, self.waiting_queue, self.chunked_req)

    def add(self, req) -> None:
        self.waiting_queue.append(req)
        on_queued(self.view(), req)

    def abort_waiting(self, req) -> None:
        self.waiting_queue.remove(req)
        on_aborted(self.view(), req)

    def step(self, decode: bool = False) -> list:
        for req in self.running.reqs:
            if req.finished():
                on_kv_released(req, self.cache)
        self.running.reqs = [r for r in self.running.reqs if not r.finished()]
        admitted = []
        if self.waiting_queue:
            admitted = adder_pass(self.policy, self.cache, self.allocator, self.waiting_queue, self.running)
            self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]
            self.running.reqs.extend(admitted)
        plan = decode_plan(self.running) if decode and not admitted else idle_plan(self.running)
        on_step_end(self.view(), plan)
        return admitted

    def retract(self, req, num_output: int = 0) -> None:
        req.output_ids.extend(range(900_000, 900_000 + num_output))
        self.running.reqs.remove(req)
        req.reset_for_retract()
        self.add(req)

    def assert_mirrors(self) -> None:
        tree = self.tree
        tree.check_invariants()
        waiting = {r.rid for r in self.waiting_queue}
        active = {r.rid for r in self.running.reqs} | ({self.chunked_req.rid} if self.chunked_req else set())
        assert set(tree.waiting_ids()) == waiting
        assert set(tree.active_ids()) == active
        assert set(self.policy.feather.mirror.tracked()) == waiting | active


def test_admitted_requests_become_active_and_finished_ones_leave():
    sched = MiniScheduler()
    reqs = [make_req(f"r{i}", group_prompt(i % 2, 32, 8, salt=i)) for i in range(4)]
    for req in reqs:
        sched.add(req)
    assert sched.step() == [reqs[0], reqs[2], reqs[1], reqs[3]]
    sched.assert_mirrors()
    assert sched.tree.num_active == 4
    reqs[2].finished_reason = FINISH_LENGTH(length=16)
    sched.step(decode=True)
    sched.assert_mirrors()
    assert "r2" not in sched.tree
    for r in reqs:
        r.finished_reason = FINISH_LENGTH(length=16)
    sched.step()
    assert len(sched.tree) == 0 and len(sched.policy.feather.mirror) == 0


def test_retraction_returns_a_request_to_waiting_with_its_output():
    sched = MiniScheduler()
    a, b = make_req("a", group_prompt(0, 32, 8, salt=1)), make_req("b", group_prompt(0, 32, 8, salt=2))
    sched.add(a)
    sched.add(b)
    sched.step()
    assert sched.tree.state("a") is RequestState.ACTIVE
    sched.retract(a, num_output=0)
    sched.step(decode=True)
    # re-admitted in the next pass (always stopper), so it must be active again and not duplicated
    sched.assert_mirrors()
    assert sched.tree.num_chunks("b") == 3  # 40 prompt tokens in chunks of 16
    sched.retract(b, num_output=40)
    assert sched.tree.state("b") is RequestState.WAITING
    assert sched.tree.num_chunks("b") == 5, "prompt + kept output (80 tokens) is what must be recomputed"
    sched.step()
    sched.assert_mirrors()
    assert sched.tree.state("b") is RequestState.ACTIVE


def test_aborts_while_waiting_and_while_running_leave_no_entry():
    sched = MiniScheduler(
        FeatherOptions(
            AdmissionConfig(
                chunk_size=16, defer_uncached_prefix=False, stopper="static", stopper_options=STRICT
            )
        )
    )
    reqs = [make_req(f"r{i}", group_prompt(0 if i < 2 else i, 32, 8, salt=i)) for i in range(6)]
    for req in reqs:
        sched.add(req)
    admitted = sched.step()
    waiting = [r for r in reqs if r not in admitted]
    assert admitted == reqs[:2], "the group pair shares a prefix; the static stopper refuses to dilute it"
    victim = waiting[0]
    sched.abort_waiting(victim)
    assert victim.rid not in sched.tree
    sched.step(decode=True)
    sched.assert_mirrors()
    running_victim = admitted[0]
    running_victim.finished_reason = FINISH_ABORT()
    sched.step()
    assert running_victim.rid not in sched.tree, "a finished (aborted) request leaves when its KV is released"
    sched.assert_mirrors()
    assert sched.policy.feather.num_drift == 0


def test_chunked_request_stays_active_between_passes():
    sched = MiniScheduler()
    long_req = make_req("long", group_prompt(0, 256, 32, salt=1))
    sched.add(long_req)
    sched.step()
    # SGLang keeps a chunked request out of both the running batch and the waiting queue between chunks.
    sched.running.reqs.remove(long_req)
    sched.chunked_req = long_req
    newcomer = make_req("new", group_prompt(0, 256, 8, salt=2))
    sched.add(newcomer)
    assert sched.tree.num_missing("new") == 1, "the in-flight chunked request's prefix still counts"
    sched.policy.calc_priority(sched.waiting_queue, sched.running)
    assert sched.tree.state("long") is RequestState.ACTIVE
    on_step_end(scheduler_view(sched.policy, sched.waiting_queue, long_req), idle_plan(sched.running))
    sched.assert_mirrors()
    # the last chunk is done: it joins the running batch
    sched.chunked_req = None
    sched.running.reqs.append(long_req)
    sched.step()
    sched.assert_mirrors()
    # a request that vanished from everywhere without an event is dropped by the periodic self-check
    sched.running.reqs.remove(long_req)
    sched.step()
    assert "long" in sched.tree
    sched.policy.feather.clock.now += 10.0
    sched.step()
    assert "long" not in sched.tree
    sched.assert_mirrors()
    assert sched.policy.feather.num_drift == 1


def test_prompt_growth_reenqueues_and_keeps_arrival_time():
    clock = FakeClock()
    sched = MiniScheduler(
        FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always")), clock
    )
    first = make_req("chat", group_prompt(0, 32, 8, salt=1))
    sched.add(first)
    sched.waiting_queue.remove(first)  # replaced below by its grown self, as a new turn does
    clock.now += 5.0
    admission = sched.policy.feather.admission
    assert admission.wait_s("chat") == 5.0
    grown = make_req("chat", list(first.origin_input_ids) + list(range(70_000, 70_040)))
    sched.add(grown)
    assert sched.tree.num_chunks("chat") == 5
    assert admission.wait_s("chat") == 5.0
    assert sched.policy.feather.mirror.request("chat") is grown
    sched.step()
    sched.assert_mirrors()
    # same rid, next turn, while the previous turn is still marked running (new Req object)
    turn3 = make_req("chat", list(grown.origin_input_ids) + [5] * 20)
    sched.running.reqs.remove(grown)
    sched.add(turn3)
    sched.step()
    sched.assert_mirrors()
    assert sched.policy.feather.mirror.request("chat") is turn3


def test_random_event_sequences_never_leak():
    rng = random.Random(2024)
    sched = MiniScheduler(
        FeatherOptions(
            AdmissionConfig(
                chunk_size=8, defer_uncached_prefix=False, stopper="static", stopper_options=STRICT
            )
        )
    )
    next_id = 0
    for step in range(300):
        for _ in range(rng.randrange(0, 4)):
            sched.add(
                make_req(
                    f"q{next_id}",
                    group_prompt(rng.randrange(4), rng.randrange(1, 40), rng.randrange(0, 20), next_id),
                )
            )
            next_id += 1
        event = rng.random()
        if event < 0.15 and sched.waiting_queue:
            sched.abort_waiting(rng.choice(sched.waiting_queue))
        elif event < 0.3 and sched.running.reqs:
            sched.retract(rng.choice(sched.running.reqs), num_output=rng.randrange(0, 12))
        elif event < 0.6 and sched.running.reqs:
            victim = rng.choice(sched.running.reqs)
            victim.finished_reason = FINISH_ABORT() if event < 0.4 else FINISH_LENGTH(length=4)
        elif event < 0.7 and sched.chunked_req is None and sched.running.reqs:
            sched.chunked_req = sched.running.reqs.pop(rng.randrange(len(sched.running.reqs)))
        elif event < 0.8 and sched.chunked_req is not None:
            sched.running.reqs.append(sched.chunked_req)
            sched.chunked_req = None
        sched.policy.feather.clock.now += 10.0  # every step end runs the full self-check
        sched.step(decode=step % 2 == 0)
        sched.assert_mirrors()
    stats = sched.policy.feather.admission.stats
    assert stats.num_admitted > 100 and stats.num_stops > 5, stats
    assert sched.policy.feather.num_drift == 0, "every change came through an event"
    for req in list(sched.waiting_queue):
        sched.abort_waiting(req)
    if sched.chunked_req is not None:
        sched.running.reqs.append(sched.chunked_req)
        sched.chunked_req = None
    for req in sched.running.reqs:
        req.finished_reason = FINISH_LENGTH(length=4)
    sched.step()
    assert len(sched.tree) == 0 and len(sched.policy.feather.mirror) == 0
    assert sched.tree.num_nodes == 0
