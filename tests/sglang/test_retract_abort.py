"""SGLang's `retract_decode` aborts a request out of KV even alone: Feather hears of it, no drift, no leak."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from conftest import FakeClock, adder_pass, batch, feather_policy, group_prompt, make_allocator, make_req
from sglang.srt.managers import schedule_batch, schedule_policy
from sglang.srt.managers.schedule_batch import FINISH_ABORT, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler, _make_abort_req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_feather.admission import AdmissionConfig
from sglang_feather.offline.sglang_objects import make_radix_cache
from sglang_feather.sglang import plugin
from sglang_feather.sglang.options import FeatherOptions

OPTIONS = FeatherOptions(
    AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"), self_check_interval_s=0.0
)
"""Every step end reconciles the CHT with the queues (`--feather-self-check-interval-s 0`): a missed event
shows as drift at once."""
PROMPT_LEN = 24
MAX_NEW_TOKENS = 64
TOKEN = 7
VOCAB_SIZE = 1000


def _with_plugin_hooks(target: str, fn):
    """`fn` with the AFTER hooks `plugin.HOOKS` registers on `target`, called as SGLang's HookRegistry calls
    them (`hook(result, *args, **kwargs)`); `fn` itself if the plugin registers none."""
    hooks = [hook for name, (hook, _params) in plugin.HOOKS.items() if name == target]
    if not hooks:
        return fn

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        result = fn(*args, **kwargs)
        for hook in hooks:
            hook(result, *args, **kwargs)
        return result

    return wrapped


@pytest.fixture
def overcommit(monkeypatch):
    """`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=8`: admission reserves 8 output tokens a request, so requests
    that decode longer run the pool out and `update_running_batch` retracts (SGLang reads it at import)."""
    monkeypatch.setattr(schedule_policy, "CLIP_MAX_NEW_TOKENS", 8)


@pytest.fixture
def hooked_release_kv_cache(monkeypatch):
    """The plugin's hook on `release_kv_cache`, rebound where `retract_decode`'s `release_req` looks it up
    (what HookRegistry's `_propagate_patch` does to every `from ... import release_kv_cache`)."""
    target = "sglang.srt.mem_cache.common.release_kv_cache"
    monkeypatch.setattr(
        schedule_batch, "release_kv_cache", _with_plugin_hooks(target, schedule_batch.release_kv_cache)
    )


class RetractScheduler:
    """The parts of SGLang's `Scheduler` that the decode-retraction path runs, around real objects.

    Real: the policy, `PrefillAdder`, `Req`, `ReqToTokenPool`, the CPU token allocator, `RadixCache`,
    `ScheduleBatch` with its `SamplingBatchInfo`, `ScheduleBatch.retract_decode` and `Scheduler.send_abort_output`
    (with the plugin's hooks applied as HookRegistry applies them). Stand-ins, because no model runs on this
    CPU: the prefill and the decode steps before the retraction write their KV by hand (a row and its slots,
    committed, and one fixed output token per slot past the prompt), the model config says
    "not encoder-decoder", and the tokenizer's IPC channel records what the scheduler sends.
    `decode_step()` is `update_running_batch`'s retraction branch: `retract_decode`, `send_abort_output` for
    each aborted request, `_add_request_to_queue` for each retracted one, then Feather's step-end hook.
    """

    schedule_policy = "feather"
    rust_server = None

    def __init__(self, num_kv_tokens: int) -> None:
        self.req_to_token_pool = ReqToTokenPool(8, 256, "cpu", False)
        self.allocator = make_allocator(num_kv_tokens)
        self.cache = make_radix_cache(allocator=self.allocator, req_to_token_pool=self.req_to_token_pool)
        self.policy = feather_policy(self.cache, OPTIONS, FakeClock())
        self.waiting_queue: list = []
        self.running_batch = batch()
        self.chunked_req = None
        self.sent: list = []
        self.ipc_channels = SimpleNamespace(
            send_to_tokenizer=SimpleNamespace(send_output=lambda output, req: self.sent.append(output))
        )

    @property
    def runtime(self):
        return self.policy.feather

    send_abort_output = _with_plugin_hooks(
        f"{plugin.SCHEDULER}.send_abort_output", Scheduler.send_abort_output
    )

    def add(self, req) -> None:
        self.waiting_queue.append(req)
        plugin._after_add_request_to_queue(None, self, req)

    def prefill(self) -> None:
        """A prefill pass admits the waiting requests, which then decode until they hold the whole KV pool."""
        admitted = adder_pass(self.policy, self.cache, self.allocator, self.waiting_queue, self.running_batch)
        self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]
        num_tokens = self.allocator.available_size() // max(len(admitted), 1)
        for req in admitted:
            (row,) = self.req_to_token_pool.alloc([req])
            self.req_to_token_pool.write((row, slice(0, num_tokens)), self.allocator.alloc(num_tokens))
            req.output_ids.extend([TOKEN] * (num_tokens - PROMPT_LEN))
            req.kv.kv_committed_len = req.kv.kv_allocated_len = num_tokens
        self.running_batch = self._decode_batch(self.running_batch.reqs + admitted)
        self._step_end(self.running_batch)

    def decode_step(self) -> tuple[list, list]:
        running = self.running_batch
        assert not running.check_decode_mem(), "the pool has room: retract_decode would not run"
        retracted, _ratio, aborted = running.retract_decode()
        for req in aborted:
            self.send_abort_output(_make_abort_req(req, finished_reason=req.to_finish.to_json()), req)
        for req in retracted:
            self.add(req)
        self._step_end(running if running.reqs else None)
        return retracted, aborted

    def _decode_batch(self, reqs: list) -> ScheduleBatch:
        decode = ScheduleBatch(
            reqs=reqs,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            tree_cache=self.cache,
            model_config=SimpleNamespace(is_encoder_decoder=False),
            device="cpu",
            spec_algorithm=SpeculativeAlgorithm.NONE,
        )
        decode.req_pool_indices = torch.tensor([r.kv.req_pool_idx for r in reqs], dtype=torch.int64)
        decode.req_pool_indices_cpu = decode.req_pool_indices.clone()
        decode.seq_lens = torch.tensor([r.kv.kv_committed_len for r in reqs], dtype=torch.int64)
        decode.seq_lens_cpu = decode.seq_lens.clone()
        decode.orig_seq_lens = decode.seq_lens.clone()
        decode.sampling_info = SamplingBatchInfo.from_schedule_batch(decode, VOCAB_SIZE)
        return decode

    def _step_end(self, batch_to_run: ScheduleBatch | None) -> None:
        if batch_to_run is not None:
            batch_to_run.forward_mode = SimpleNamespace(is_decode=lambda: True)
        plan = SimpleNamespace(batch_to_run=batch_to_run, running_batch=self.running_batch)
        plugin._after_get_next_batch_to_run(plan, self, self.running_batch, None)


def _requests(num: int) -> list:
    reqs = [
        make_req(f"r{i}", group_prompt(i, 16, PROMPT_LEN - 16, salt=i), max_new_tokens=MAX_NEW_TOKENS)
        for i in range(num)
    ]
    for req in reqs:
        req.sampling_params.normalize(None)  # what SGLang's tokenizer manager does before the scheduler
    return reqs


@pytest.mark.usefixtures("overcommit", "hooked_release_kv_cache")
@pytest.mark.parametrize("num_reqs", [1, 2])
def test_request_retract_decode_aborts_for_lack_of_kv_is_reported_once_and_not_drift(num_reqs):
    """The running requests decoded until they hold the whole KV pool: the next token does not fit. With one
    request, SGLang aborts it (the last request); with two, it retracts one to the queue, which frees enough
    for the other to stay. Either way Feather's tree ends equal to SGLang's queues with no drift."""
    sched = RetractScheduler(num_kv_tokens=num_reqs * 2 * PROMPT_LEN)
    reqs = _requests(num_reqs)
    for req in reqs:
        sched.add(req)
    sched.prefill()
    assert [r.rid for r in sched.running_batch.reqs] == [r.rid for r in reqs]
    assert sched.runtime.num_drift == 0 and set(sched.runtime.mirror.tracked()) == {r.rid for r in reqs}

    retracted, aborted = sched.decode_step()

    if num_reqs == 1:
        assert aborted == reqs and not retracted, "SGLang did not abort the last request: nothing was tested"
        (req,) = aborted
        assert isinstance(req.to_finish, FINISH_ABORT) and not req.finished()
        assert [out.rid for out in sched.sent] == [req.rid]
    else:
        assert len(retracted) == 1 and not aborted
        assert [r.rid for r in sched.waiting_queue] == [retracted[0].rid]
    assert sched.runtime.num_drift == 0, "retract_decode's abort reached Feather only through the self-check"
    live = {r.rid for r in sched.waiting_queue} | {r.rid for r in sched.running_batch.reqs}
    assert set(sched.runtime.mirror.tracked()) == live
    assert set(sched.runtime.admission.tree.waiting_ids()) == {r.rid for r in sched.waiting_queue}
    sched.runtime.admission.tree.check_invariants()


@pytest.mark.usefixtures("hooked_release_kv_cache")
def test_abort_reported_twice_counts_once():
    """A request SGLang reports through two hooks (`_release_aborted_request`, then `send_abort_output`, as
    `abort_request` does for a queued request) leaves Feather once; an abort of an untracked request (one
    rejected before it was queued) changes nothing."""
    sched = RetractScheduler(num_kv_tokens=4 * PROMPT_LEN)
    first, second = _requests(2)
    sched.add(first)
    sched.add(second)
    sched.waiting_queue.remove(first)
    plugin._after_release_aborted_request(None, sched, first)
    sched.send_abort_output(_make_abort_req(first), first)
    rejected = make_req("rejected", [1, 2, 3])
    sched.send_abort_output(_make_abort_req(rejected), rejected)
    sched._step_end(None)
    assert sched.runtime.num_drift == 0
    assert set(sched.runtime.mirror.tracked()) == {second.rid}
    assert set(sched.runtime.admission.tree.waiting_ids()) == {second.rid}
    sched.runtime.admission.tree.check_invariants()
