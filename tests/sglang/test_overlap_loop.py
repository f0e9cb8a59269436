"""SGLang's overlap loop: requests its in-flight batch will finish are still tracked; the self-check finds no drift."""

from __future__ import annotations

import random
from collections import deque
from types import SimpleNamespace

import pytest
from conftest import (
    FakeClock,
    adder_pass,
    batch,
    feather_policy,
    group_prompt,
    make_allocator,
    make_cache,
    make_req,
)
from sglang.srt.managers.schedule_batch import FINISH_ABORT, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sglang import plugin
from sglang_feather.sglang.options import FeatherOptions

OPTIONS = FeatherOptions(
    AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"), self_check_interval_s=0.0
)
"""Every step end reconciles the CHT with the full picture (`--feather-self-check-interval-s 0`)."""
TOKEN = 7


class OverlapScheduler:
    """`Scheduler.event_loop_overlap`'s order of events around the real policy, adder, `Req` and batches.

    One `iteration()` is one turn of SGLang's loop: `get_next_batch_to_run` (merge the last prefill batch,
    drop finished requests, a prefill pass, else a decode step of the running batch without the requests the
    queued result finishes by length, decided by SGLang's own `Scheduler._reqs_finishing_inflight`, and maybe
    one retracted back to the queue through `_add_request_to_queue`, as `update_running_batch` does), Feather's
    step-end hook, the launch (a `batch.copy()` into `result_queue`), then the previous batch's result: one token
    per request and SGLang's `Req.update_finish_state`, a finished request reported through the
    `release_kv_cache` hook. No model runs (CPU): a result is one fixed token per request.
    """

    enable_skip_finishing_decode = True
    """Set by `event_loop_overlap`; `_reqs_finishing_inflight` reads it."""

    def __init__(self) -> None:
        self.allocator = make_allocator(1 << 20)
        self.cache = make_cache(self.allocator)
        self.policy = feather_policy(self.cache, OPTIONS, FakeClock())
        self.waiting_queue: list = []
        self.running_batch = batch()
        self.chunked_req = None
        self.last_batch: ScheduleBatch | None = None
        self.result_queue: deque = deque()
        self.num_excluded = 0
        """Requests `_reqs_finishing_inflight` dropped from the running batch before their result."""
        self.to_retract = None
        self.num_retracted = 0
        """Requests retracted while their last decode was in flight."""

    @property
    def runtime(self):
        return self.policy.feather

    def add(self, req) -> None:
        self.waiting_queue.append(req)
        plugin._after_add_request_to_queue(None, self, req)

    def abort_waiting(self, req) -> None:
        self.waiting_queue.remove(req)
        plugin._after_release_aborted_request(None, self, req)

    def abort_running(self, req) -> None:
        """`Scheduler.abort_request` for an in-flight request: `to_finish`, finished by its next result."""
        req.to_finish = FINISH_ABORT()

    def retract_at_next_decode(self, req) -> None:
        """`update_running_batch` will retract `req` (out of KV) if the next step decodes and `req` is in it."""
        self.to_retract = req

    def iteration(self) -> None:
        plan = self._get_next_batch_to_run()
        plugin._after_get_next_batch_to_run(plan, self, self.running_batch, self.last_batch)
        self.running_batch = plan.running_batch
        launched = plan.batch_to_run
        if launched is not None:
            self.result_queue.append((launched.copy(), None))
        if self.last_batch is not None:
            self._process_result(*self.result_queue.popleft())
        self.last_batch = launched

    def _get_next_batch_to_run(self) -> SimpleNamespace:
        running, last = self.running_batch, self.last_batch
        if last is not None and last.forward_mode.is_extend():
            running.reqs.extend(r for r in last.reqs if not r.finished())
        running.reqs = [r for r in running.reqs if not r.finished()]
        prefill = self._prefill_pass(running)
        if prefill is not None:
            return SimpleNamespace(batch_to_run=prefill, running_batch=running)
        finishing = Scheduler._reqs_finishing_inflight(self, running)
        self.num_excluded += len(finishing)
        running.reqs = [r for r in running.reqs if r not in finishing]
        retracted, self.to_retract = self.to_retract, None
        if retracted in running.reqs:
            running.reqs.remove(retracted)
            retracted.reset_for_retract()
            self.add(retracted)
            self.num_retracted += int(any(retracted in b.reqs for b, _result in self.result_queue))
        running.forward_mode = ForwardMode.DECODE
        return SimpleNamespace(batch_to_run=running if running.reqs else None, running_batch=running)

    def _prefill_pass(self, running: ScheduleBatch) -> ScheduleBatch | None:
        if not self.waiting_queue:
            return None
        admitted = adder_pass(self.policy, self.cache, self.allocator, self.waiting_queue, running)
        if not admitted:
            return None
        for req in admitted:
            req.is_retracted = False  # `ScheduleBatch.prepare_for_extend`
        self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]
        prefill = batch(admitted)
        prefill.forward_mode = ForwardMode.EXTEND
        return prefill

    def _process_result(self, launched: ScheduleBatch, _result) -> None:
        for req in launched.reqs:
            if req.finished() or req.is_retracted:
                continue
            req.output_ids.append(TOKEN)
            req.update_finish_state()
            if req.finished():
                plugin._after_release_kv_cache(None, req, self.cache, checkpoint=True)

    def assert_tracks_every_live_request(self) -> None:
        """The CHT holds exactly the waiting requests and the unfinished ones in a batch or in flight."""
        live = {r.rid for r in self.waiting_queue}
        for reqs in (self.running_batch.reqs, *(launched.reqs for launched, _result in self.result_queue)):
            live |= {r.rid for r in reqs if not r.finished() and not r.is_retracted}
        assert set(self.runtime.mirror.tracked()) == live
        assert set(self.runtime.admission.tree.waiting_ids()) == {r.rid for r in self.waiting_queue}
        self.runtime.admission.tree.check_invariants()


def _requests(num: int, rng: random.Random, first_id: int = 0) -> list:
    reqs = [
        make_req(
            f"r{first_id + i}",
            group_prompt(i % 3, 32, rng.randrange(1, 12), salt=first_id + i),
            max_new_tokens=rng.randrange(1, 6),
            ignore_eos=True,
        )
        for i in range(num)
    ]
    for req in reqs:
        req.sampling_params.normalize(None)  # what SGLang's tokenizer manager does before the scheduler
    return reqs


def test_requests_finishing_in_the_inflight_batch_are_no_drift():
    sched = OverlapScheduler()
    for req in _requests(12, random.Random(1)):
        sched.add(req)
    for _ in range(12):
        sched.iteration()
        assert sched.runtime.num_drift == 0, "a request the in-flight result finishes is not a missed event"
        sched.assert_tracks_every_live_request()
    assert sched.num_excluded > 0, "SGLang never dropped a finishing request early: the test checked nothing"
    assert not sched.waiting_queue and not sched.running_batch.reqs and not sched.result_queue
    assert len(sched.runtime.admission.tree) == 0 and len(sched.runtime.mirror) == 0


@pytest.mark.parametrize("seed", [3, 4])
def test_overlap_loop_with_arrivals_aborts_and_retractions_has_no_drift_and_no_leak(seed):
    rng = random.Random(seed)
    sched = OverlapScheduler()
    next_id = 0
    for _ in range(300):
        arrivals = _requests(rng.randrange(1, 5) if rng.random() < 0.3 else 0, rng, first_id=next_id)
        next_id += len(arrivals)
        for req in arrivals:
            sched.add(req)
        event = rng.random()
        running = [r for r in sched.running_batch.reqs if not r.finished()]
        if event < 0.1 and sched.waiting_queue:
            sched.abort_waiting(rng.choice(sched.waiting_queue))
        elif event < 0.2 and running:
            sched.abort_running(rng.choice(running))
        elif event < 0.4 and running:
            sched.retract_at_next_decode(rng.choice(running))
        sched.iteration()
        assert sched.runtime.num_drift == 0
        sched.assert_tracks_every_live_request()
    assert sched.num_excluded > 10 and sched.num_retracted > 5, (sched.num_excluded, sched.num_retracted)
    for req in list(sched.waiting_queue):
        sched.abort_waiting(req)
    for _ in range(8):
        sched.iteration()
    assert not sched.running_batch.reqs and not sched.result_queue
    assert len(sched.runtime.admission.tree) == 0 and len(sched.runtime.mirror) == 0
    assert sched.runtime.num_drift == 0 and sched.runtime.num_errors == 0
