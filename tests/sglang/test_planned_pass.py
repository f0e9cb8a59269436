"""The planned pass (Feather's default path) admits, counts and keeps the queue exactly as the step path, on real
SGLang objects: `Req`s, the server's `UnifiedRadixCache` with its KV events, SGLang's `PrefillAdder` budgets."""

from __future__ import annotations

import dataclasses
import random

import pytest
from conftest import group_prompt
from prometheus_client import CollectorRegistry
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from sglang_feather.admission import AdmissionConfig
from sglang_feather.offline.adapter_harness import AdapterHarness
from sglang_feather.offline.sglang_objects import cache_prompt
from sglang_feather.offline.sglang_objects import make_req as make_sglang_req
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import FEATHER, FeatherOptions


def options(concentrate: bool) -> FeatherOptions:
    return FeatherOptions(
        AdmissionConfig(chunk_size=16, stopper="always", max_wait_s=2.0, concentrate=concentrate)
    )


OPTIONS = options(concentrate=False)
GROUPS_SUM = ("sglang:feather_prefix_groups_sum", (("model_name", "tiny"),))


def harness(plans_ahead: bool, cached: tuple, concentrate: bool = False) -> AdapterHarness:
    side = AdapterHarness(FEATHER, options=options(concentrate), cached=cached, allocator_size=4_000)
    assert side.runtime.events is not None, "the cache tier is fed from the tree cache's events"
    side.runtime.plans_ahead = plans_ahead
    side.runtime.plan_from = 0  # every pass planned, however few the last one admitted
    side.runtime.metrics = FeatherMetrics({"model_name": "tiny"}, registry=CollectorRegistry())
    return side


def series(side: AdapterHarness) -> dict:
    """Feather's Prometheus samples (the step times and the reward, timed by the real clock, left out)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in side.runtime.metrics.registry.collect()
        for sample in metric.samples
        if "step_seconds" not in sample.name
        and sample.name != "sglang:feather_reward_total"
        and not sample.name.endswith("_created")
    }


def snapshot(side: AdapterHarness) -> tuple:
    runtime, admission = side.runtime, side.runtime.admission
    tree = admission.tree
    stats = dataclasses.asdict(admission.stats)
    del stats["last_reward"], stats["sum_reward"]  # decode rates timed by the real clock: never equal
    return (
        sorted(tree.waiting_ids()),
        sorted(tree.active_ids()),
        stats,
        (admission.guard.due_wait_s, admission.guard.lead_s),
        type(admission.footprint).__name__,
        (runtime.num_drift, runtime.num_errors),
        admission.num_waiting_running,
        None
        if admission.concentration is None
        else (
            admission.concentration.mean_cost_tokens,
            admission.concentration.promise_tokens,
        ),
    )


@pytest.mark.parametrize("concentrate", [False, True], ids=["plain", "concentrate"])
@pytest.mark.parametrize("seed", range(4))
def test_the_planned_pass_admits_as_the_step_path(seed, concentrate):
    """With the concentration rule on, a plan ends before a pick the rule could hold back, SGLang's adder
    reports its KV room at each planned request, and the rule measures and holds exactly as on the step path."""
    rng = random.Random(seed)
    cached = tuple(group_prompt(g, 256, 0, salt=g) for g in range(2))
    planned, steps = harness(True, cached, concentrate), harness(False, cached, concentrate)
    clock = [0.0]
    for side in (planned, steps):
        side.runtime.admission.clock = lambda: clock[0]
    num_admitted = num_aged = 0
    for step in range(50):
        clock[0] += rng.choice((0.05, 0.2, 0.6))
        for i in range(rng.randint(1, 10)):
            group = rng.randrange(6)
            prompt = group_prompt(group, 256, rng.randint(8, 400), salt=step * 10 + i)
            for side in (planned, steps):
                side.arrive(make_sglang_req(f"s{step}-{i}", prompt))
        groups_before = series(planned).get(GROUPS_SUM, 0.0)
        results = [side.prefill_pass() for side in (planned, steps)]
        admitted = [r.rid for r in results[0].admitted]
        assert admitted == [r.rid for r in results[1].admitted], f"step {step}"
        if admitted:  # the prefill batch launched: its groups and the running batch's, counted by first chunk
            runs = [*planned.running, *results[0].admitted]
            num_groups = len({tuple(req.origin_input_ids[: OPTIONS.admission.chunk_size]) for req in runs})
            assert series(planned)[GROUPS_SUM] - groups_before == num_groups, f"step {step}"
        num_admitted += len(admitted)
        for side, result in zip((planned, steps), results, strict=True):
            side.merge(result.admitted)
        if admitted and rng.random() < 0.5:  # a prefill finished: its prompt's KV is in the tree cache
            prompt = [int(t) for t in results[0].admitted[0].origin_input_ids]
            for side in (planned, steps):
                side.cache.evict(EvictParams(num_tokens=len(prompt)))  # room for it in the small pool
                cache_prompt(side.cache, prompt)
        if rng.random() < 0.2:
            num_tokens = rng.randint(100, 2000)
            for side in (planned, steps):
                side.cache.evict(EvictParams(num_tokens=num_tokens))
        for side in (planned, steps):
            side.step_end_hook()
        finished = [i for i, _ in enumerate(planned.running) if rng.random() < 0.2]
        retracted = {i for i in finished if rng.random() < 0.25}
        for side in (planned, steps):
            reqs = list(side.running)
            for i in finished:
                (side.retract if i in retracted else side.finish)(reqs[i])
        assert snapshot(planned) == snapshot(steps), f"step {step}"
        for side in (planned, steps):
            side.runtime.check_queue_order(side.waiting)
        assert series(planned) == series(steps), (
            f"step {step}: the planned pass's metrics are the step path's"
        )
        num_aged = planned.runtime.admission.stats.num_aged
    stats = planned.runtime.admission.stats
    if concentrate:  # the small pool binds: the rule holds new prefixes back and the guard's picks with them
        assert num_admitted > 100 and stats.num_concentrated > 20, "the rule held picks back"
        assert planned.runtime.admission.concentration.mean_cost_tokens is not None, (
            "the rule measured p from the rooms SGLang's adder reported"
        )
    else:
        assert num_admitted > 200 and stats.num_withdrawn > 5, "SGLang refused picks"
        assert num_aged > 0, "due requests were served"
    assert planned.runtime.num_errors == 0
    if not concentrate:  # a held-back pick is passed over where it was moved: later ranks miss (both paths)
        assert (planned.runtime.num_scans, steps.runtime.num_scans) == (0, 0)
        assert planned.runtime.num_misses == 0 and steps.runtime.num_misses == 0, (
            "picks were where their rank said"
        )
    assert planned.runtime.num_planned_passes == 50 and steps.runtime.num_planned_passes == 0
    planned.close()
    steps.close()


@pytest.mark.parametrize("plans_ahead", [True, False], ids=["planned", "step"])
def test_a_loop_that_passes_over_requests_loses_none(plans_ahead):
    """SGLang's loop passes over about one waiting request in eight without asking the adder (a LoRA adapter
    that cannot load, a storage prefetch still running), planned ones among them. The request it reaches next
    is proposed as it is and the pass goes on step by step (so the two paths may admit different requests
    from there), and the admission keeps SGLang's queues exactly: none passed over is admitted in that pass,
    each admitted once, the tree's waiting and running sets equal to SGLang's."""
    rng = random.Random(7)
    side = harness(plans_ahead, tuple(group_prompt(g, 256, 0, salt=g) for g in range(2)))
    clock = [0.0]
    side.runtime.admission.clock = lambda: clock[0]
    admitted_ever: set[str] = set()
    num_passed_over = 0
    for step in range(60):
        clock[0] += rng.choice((0.05, 0.2, 0.6))
        for i in range(rng.randint(1, 10)):
            prompt = group_prompt(rng.randrange(6), 256, rng.randint(8, 400), salt=step * 10 + i)
            side.arrive(make_sglang_req(f"s{step}-{i}", prompt))
        passes_over = {req.rid for req in side.waiting if rng.random() < 0.125}
        result = side.prefill_pass(passes_over)
        admitted = {r.rid for r in result.admitted}
        assert not admitted & passes_over, f"step {step}: a request the loop passed over was admitted"
        assert not admitted & admitted_ever, f"step {step}: a request was admitted twice"
        admitted_ever |= admitted
        num_passed_over += len(passes_over)
        side.merge(result.admitted)
        side.step_end_hook()
        for req in [req for req in side.running if rng.random() < 0.2]:
            side.finish(req)
        tree = side.runtime.admission.tree
        assert sorted(tree.waiting_ids()) == sorted(req.rid for req in side.waiting), f"step {step}"
        assert sorted(tree.active_ids()) == sorted(req.rid for req in side.running), f"step {step}"
        tree.check_invariants()
    runtime = side.runtime
    assert len(admitted_ever) > 140 and num_passed_over > 50, "the run exercised both (150 and 613 here)"
    assert runtime.num_errors == 0 and runtime.num_drift == 0
    assert runtime.num_planned_passes == (60 if plans_ahead else 0)
    side.close()
