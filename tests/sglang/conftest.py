"""Real SGLang 0.5.23 objects without a server: published config, RadixCache, token allocator, Req, batches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

from sglang_feather.admission import AdmissionConfig
from sglang_feather.offline.sglang_objects import (
    make_allocator,
    make_radix_cache,
    make_req,
    publish_cpu_context,
)
from sglang_feather.sglang.options import FeatherOptions
from sglang_feather.sglang.policy import FeatherSchedulePolicy

__all__ = ["make_allocator", "make_req"]


def sglang_schedule_policy() -> type:
    """SGLang's own class, looked up at call time: a plugin applied in this process would rebind names."""
    return FeatherSchedulePolicy.__bases__[0]


@pytest.fixture(scope="session", autouse=True)
def sglang_config():
    """SGLang's policies read published config namespaces (disagg, memory); publish a CPU server's."""
    publish_cpu_context(role="test", fresh=True)


class FakeClock:
    """The admission clock, advanced by hand (time only matters for aging and reward windows)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_cache(allocator=None, cached: tuple = ()):
    return make_radix_cache(cached, allocator=allocator)


def batch(reqs=()) -> ScheduleBatch:
    return ScheduleBatch(reqs=list(reqs), batch_is_full=False)


def feather_policy(
    cache, options: FeatherOptions | None = None, clock: FakeClock | None = None, metrics=None
):
    policy = FeatherSchedulePolicy("feather", cache, False, False, False)
    policy.configure(
        options or FeatherOptions(AdmissionConfig(stopper="always")), metrics, clock or FakeClock()
    )
    return policy


def adder_pass(policy, cache, allocator, waiting: list, running: ScheduleBatch) -> list:
    """One prefill pass as SGLang's `get_new_batch_prefill` runs it: the policy orders the queue, then SGLang's
    real `PrefillAdder` (through the policy's adder class) takes requests until it says stop; returns them."""
    policy.calc_priority(waiting, running)
    adder = policy.prefill_adder_class(PrefillAdder)(1, cache, allocator, running, 0.0, 1 << 20, None)
    for req in waiting:
        req.init_next_round_input(cache)
        if adder.add_one_req(req, False, None) is not AddReqResult.CONTINUE:
            break
    return list(adder.can_run_list)


def decode_plan(running: ScheduleBatch) -> SimpleNamespace:
    """What `get_next_batch_to_run` returns for a decode step (the running batch itself runs)."""
    running.forward_mode = SimpleNamespace(is_decode=lambda: True)
    return SimpleNamespace(batch_to_run=running, running_batch=running)


def prefill_plan(running: ScheduleBatch, reqs: list) -> SimpleNamespace:
    """What `get_next_batch_to_run` returns for a prefill step: a new batch of `reqs`, `running` beside it."""
    launched = ScheduleBatch(reqs=list(reqs), batch_is_full=False)
    launched.forward_mode = SimpleNamespace(is_decode=lambda: False)
    return SimpleNamespace(batch_to_run=launched, running_batch=running)


def idle_plan(running: ScheduleBatch) -> SimpleNamespace:
    return SimpleNamespace(batch_to_run=None, running_batch=running)


def scheduler_view(policy, waiting, chunked_req=None) -> SimpleNamespace:
    """The attributes of SGLang's Scheduler that Feather's step hook reads."""
    return SimpleNamespace(policy=policy, waiting_queue=waiting, chunked_req=chunked_req)


def group_prompt(group: int, prefix_len: int, suffix_len: int, salt: int) -> list[int]:
    prefix = [group * 10_000 + t + 1 for t in range(prefix_len)]
    return prefix + [500_000 + salt * 100 + t for t in range(suffix_len)]
