"""Feather's PrefillAdder: the stopper ends a pass, SGLang's budgets still refuse, rewards and metrics flow."""

from __future__ import annotations

import json

from conftest import (
    FakeClock,
    batch,
    decode_plan,
    feather_policy,
    group_prompt,
    idle_plan,
    make_allocator,
    make_cache,
    make_req,
    prefill_plan,
    scheduler_view,
)
from prometheus_client import CollectorRegistry
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

from sglang_feather.admission import AdmissionConfig
from sglang_feather.cht import RequestState
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import FeatherOptions
from sglang_feather.sglang.scheduler_hooks import on_kv_released, on_step_end, prefill_adder_class

STRICT = {"max_chunk_loss": 1, "max_chunk_loss_lenient": 1, "min_floor": 1, "max_floor": 1}
"""`static` that admits a candidate costing at most one shared chunk (a peer's own suffix), else stops."""
LABELS = {"model_name": "tiny", "engine_type": "unified", "tp_rank": 0}


def _pass(policy, cache, allocator, waiting, running, *, rem_input_tokens=1 << 20, ratio=0.0):
    """One prefill pass as SGLang's `_get_new_batch_prefill_raw` runs it; returns (admitted, last result)."""
    policy.calc_priority(waiting, running)
    adder = policy.prefill_adder_class(PrefillAdder)(
        1, cache, allocator, running, ratio, rem_input_tokens, None
    )
    result = None
    for req in waiting:
        req.init_next_round_input(cache)
        result = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if result is not AddReqResult.CONTINUE:
            break
    return list(adder.can_run_list), result


def _groups_queue():
    # arrival order interleaves three prefix groups
    return [make_req(f"g{i % 3}-{i}", group_prompt(i % 3, 48, 8, salt=i)) for i in range(9)]


def test_admission_walks_the_tree_best_first_within_a_pass():
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache, FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"))
    )
    waiting = _groups_queue()
    admitted, _ = _pass(policy, cache, allocator, waiting, batch())
    # after g0-0 joins, its group misses only a suffix chunk, so the rest of g0 comes before g1 and g2
    assert [r.rid for r in admitted] == [
        "g0-0",
        "g0-3",
        "g0-6",
        "g1-1",
        "g1-4",
        "g1-7",
        "g2-2",
        "g2-5",
        "g2-8",
    ]


def test_cold_group_prefix_is_prefilled_once_by_default():
    """With the default options each cold group sends its leader; the followers are skipped (not stopped at)
    until the leader's prefix is cached, so the other groups' leaders join the same pass."""
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(cache, FeatherOptions(AdmissionConfig(chunk_size=16, stopper="always")))
    waiting = _groups_queue()
    admitted, result = _pass(policy, cache, allocator, waiting, batch())
    assert [r.rid for r in admitted] == ["g0-0", "g1-1", "g2-2"] and result is AddReqResult.OTHER
    assert policy.feather.admission.stats.num_deferred == 6


def test_stopper_ends_the_pass_and_the_rest_keeps_waiting():
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache,
        FeatherOptions(
            AdmissionConfig(
                chunk_size=16, defer_uncached_prefix=False, stopper="static", stopper_options=STRICT
            )
        ),
    )
    waiting = _groups_queue()
    admitted, result = _pass(policy, cache, allocator, waiting, batch())
    assert result is AddReqResult.OTHER
    assert [r.rid for r in admitted] == ["g0-0", "g0-3", "g0-6"]
    admission = policy.feather.admission
    assert admission.stats.num_stops == 1 and admission.stats.num_admitted == 3
    assert {rid for rid in policy.feather.admission.tree.waiting_ids()} == {
        r.rid for r in waiting if r not in admitted
    }


def test_sglang_token_budget_still_refuses_and_nothing_is_learned_from_it():
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache, FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"))
    )
    waiting = _groups_queue()
    # 60 input tokens per pass: the first request (56 tokens) is admitted, the second exceeds the budget
    admitted, result = _pass(policy, cache, allocator, waiting, batch(), rem_input_tokens=60)
    assert len(admitted) == 1
    assert result is not AddReqResult.CONTINUE
    stats = policy.feather.admission.stats
    assert (stats.num_admitted, stats.num_withdrawn, stats.num_stops) == (1, 1, 0)
    assert policy.feather.admission.tree.num_active == 1
    assert all(
        policy.feather.admission.tree.state(r.rid) is RequestState.WAITING
        for r in waiting
        if r not in admitted
    )


def test_kv_budget_refusal_withdraws_the_proposal():
    allocator = make_allocator(num_tokens=70)
    cache = make_cache(allocator)
    policy = feather_policy(
        cache, FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"))
    )
    waiting = [
        make_req("big", group_prompt(0, 200, 0, salt=0)),
        make_req("small", group_prompt(1, 8, 0, salt=1)),
    ]
    admitted, result = _pass(policy, cache, allocator, waiting, batch())
    assert result is AddReqResult.NO_TOKEN, "strangers go in arrival order; SGLang stops at the first misfit"
    assert admitted == []
    assert policy.feather.admission.stats.num_withdrawn == 1
    assert policy.feather.admission.tree.state("big") is RequestState.WAITING


def test_other_policies_get_sglangs_adder():
    cache = make_cache()
    policy = feather_policy(cache)
    assert issubclass(prefill_adder_class(scheduler_view(policy, []), PrefillAdder), PrefillAdder)
    assert prefill_adder_class(scheduler_view(policy, []), PrefillAdder) is not PrefillAdder
    from sglang_feather.sglang.policy import FeatherSchedulePolicy

    lpm = FeatherSchedulePolicy("lpm", cache, False, False, False)
    assert prefill_adder_class(scheduler_view(lpm, []), PrefillAdder) is PrefillAdder


def test_decode_throughput_of_a_window_reaches_the_stopper():
    clock = FakeClock()
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache,
        FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="ucb")),
        clock,
    )
    stopper = policy.feather.admission.stopper
    before = json.dumps(stopper.state_dict(), sort_keys=True, default=str)
    running = batch()
    waiting = _groups_queue()[:4]
    admitted, _ = _pass(policy, cache, allocator, waiting, running)
    assert admitted
    running.reqs.extend(admitted)
    waiting[:] = [r for r in waiting if r not in admitted]
    on_step_end(scheduler_view(policy, waiting), idle_plan(running))
    for _ in range(5):
        clock.now += 0.5
        on_step_end(scheduler_view(policy, waiting), decode_plan(running))
    waiting.append(make_req("late", group_prompt(0, 48, 8, salt=99)))
    _pass(policy, cache, allocator, waiting, running)
    admission = policy.feather.admission
    assert admission.stats.num_windows == 1
    assert admission.stats.last_reward is not None
    assert json.dumps(stopper.state_dict(), sort_keys=True, default=str) != before


def test_a_stopper_that_learns_from_steps_is_shown_sglangs_decode_steps():
    """SGLang's step hook reaches `step-model` through the admission: each decode step with its time and the
    running batch's footprint, a prefill step not at all."""
    clock = FakeClock()
    allocator = make_allocator()
    cache = make_cache(allocator)
    options = FeatherOptions(
        AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="step-model")
    )
    policy = feather_policy(cache, options, clock)
    running = batch()
    waiting = _groups_queue()[:4]
    admitted, _ = _pass(policy, cache, allocator, waiting, running)
    running.reqs.extend(admitted)
    waiting[:] = [r for r in waiting if r not in admitted]
    model = policy.feather.admission.stopper.model
    clock.now += 0.5
    on_step_end(scheduler_view(policy, waiting), prefill_plan(running, admitted))
    assert model.num_samples == 0
    for _ in range(4):
        clock.now += 0.25
        on_step_end(scheduler_view(policy, waiting), decode_plan(running))
    assert model.num_samples == 3, (
        "a launched step is reported at the next step's end: the prefill, then 3 decodes"
    )
    footprint = policy.feather.admission.footprint
    assert footprint.num_groups == len({r.rid.split("-")[0] for r in admitted})
    assert model.moment[0] > 0, "the steps' 0.25 s reached the fit"


def test_learned_state_is_saved_and_loaded(tmp_path):
    path = tmp_path / "ucb.json"
    clock = FakeClock()
    options = FeatherOptions(
        AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="ucb", state_path=str(path))
    )
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(cache, options, clock)
    running = batch()
    waiting = _groups_queue()
    for _ in range(3):
        admitted, _ = _pass(policy, cache, allocator, waiting, running)
        running.reqs.extend(admitted)
        waiting[:] = [r for r in waiting if r not in admitted]
        clock.now += 1.0
        on_step_end(scheduler_view(policy, waiting), decode_plan(running))
        waiting.append(make_req(f"more-{clock.now}", group_prompt(1, 48, 8, salt=int(clock.now))))
    assert policy.feather.admission.stats.num_windows >= 1
    assert not path.exists(), "saved at most every 30 s"
    clock.now += 31.0
    on_step_end(scheduler_view(policy, waiting), decode_plan(running))
    assert path.exists(), "saved while serving, without waiting for shutdown"
    path.unlink()
    learned = json.dumps(policy.feather.admission.stopper.state_dict(), sort_keys=True, default=str)
    policy.feather.close()
    assert path.exists()
    restored = feather_policy(make_cache(), options, FakeClock())
    assert json.dumps(restored.feather.admission.stopper.state_dict(), sort_keys=True, default=str) == learned


def test_prometheus_counters():
    registry = CollectorRegistry()
    metrics = FeatherMetrics(LABELS, registry=registry)
    allocator = make_allocator()
    cache = make_cache(allocator)
    options = FeatherOptions(
        AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="static", stopper_options=STRICT)
    )
    policy = feather_policy(cache, options, metrics=metrics)
    running = batch()
    waiting = _groups_queue()
    admitted, _ = _pass(policy, cache, allocator, waiting, running)
    waiting[:] = [r for r in waiting if r not in admitted]
    on_step_end(scheduler_view(policy, waiting), prefill_plan(running, admitted))
    running.reqs.extend(admitted)
    running.reqs.append(make_req("other-group", group_prompt(2, 48, 8, salt=50)))
    on_step_end(scheduler_view(policy, waiting), decode_plan(running))
    labels = {key: str(value) for key, value in LABELS.items()}

    def sample(name):
        return registry.get_sample_value(name, labels)

    assert sample("sglang:feather_admissions_total") == 3
    assert sample("sglang:feather_stops_total") == 1
    consults = {
        kind: registry.get_sample_value("sglang:feather_consults_total", {**labels, "kind": kind})
        for kind in ("new_group", "cut")
    }
    assert consults == {"new_group": 1, "cut": 0}, "g1-1 adds a prefix group: the stopper's one decision"
    assert sample("sglang:feather_reward_windows_total") == policy.feather.admission.stats.num_windows
    assert sample("sglang:feather_delta_chunks_count") == 3
    assert sample("sglang:feather_delta_chunks_sum") == policy.feather.admission.stats.sum_delta
    assert sample("sglang:feather_prefix_groups_count") == 1, "observed at prefill steps only"
    assert sample("sglang:feather_prefix_groups_sum") == 1, "g0's three admissions, nothing running before"
    assert sample("sglang:feather_step_seconds_count") == 2
    assert sample("sglang:feather_step_seconds_sum") > 0
    assert sample("sglang:feather_drift_total") == 9, "the test queued 9 requests without the queue event"
    assert sample("sglang:feather_errors_total") == 0
    tracked = {
        state: registry.get_sample_value("sglang:feather_tracked_requests", {**labels, "state": state})
        for state in ("waiting", "active")
    }
    assert tracked == {"waiting": 6, "active": 3}, (
        "other-group joined without an event: seen at the self-check"
    )


def test_window_closes_when_the_batch_drains_so_idle_time_is_not_rewarded():
    clock = FakeClock()
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache,
        FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="ucb")),
        clock,
    )
    admission = policy.feather.admission
    running = batch()
    waiting = _groups_queue()[:2]
    admitted, _ = _pass(policy, cache, allocator, waiting, running)
    running.reqs.extend(admitted)
    waiting[:] = [r for r in waiting if r not in admitted]
    for _ in range(4):
        clock.now += 0.25
        on_step_end(scheduler_view(policy, waiting), decode_plan(running))
    assert admission.stats.num_windows == 0
    for req in running.reqs:
        req.finished_reason = FINISH_LENGTH(length=4)
        on_kv_released(req, cache)
    running.reqs.clear()
    on_step_end(scheduler_view(policy, waiting), idle_plan(running))
    assert admission.stats.num_windows == 1
    reward_at_drain = admission.stats.last_reward
    clock.now += 3600.0  # idle
    waiting.append(make_req("after-idle", group_prompt(0, 48, 8, salt=77)))
    _pass(policy, cache, allocator, waiting, running)
    assert admission.stats.num_windows == 1 and admission.stats.last_reward == reward_at_drain


def test_a_pick_sglangs_loop_passes_over_waits_for_the_next_pass_and_the_rest_goes_on():
    """SGLang's loop `continue`s past some requests without asking the adder (a LoRA adapter it cannot load,
    another pooling mode, a storage prefetch in progress): the request it reaches next is proposed as it is,
    the passed-over pick is skipped for the pass (not re-offered in front of every later slot), and it is
    Feather's first pick again in the next pass."""
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache, FeatherOptions(AdmissionConfig(chunk_size=16, defer_uncached_prefix=False, stopper="always"))
    )
    waiting = _groups_queue()
    running = batch()
    policy.calc_priority(waiting, running)
    adder = policy.prefill_adder_class(PrefillAdder)(1, cache, allocator, running, 0.0, 1 << 20, None)
    passed_over = waiting[0]
    for req in waiting:
        if req is passed_over:
            continue
        req.init_next_round_input(cache)
        if (
            adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            is not AddReqResult.CONTINUE
        ):
            break
    admitted = [r.rid for r in adder.can_run_list]
    assert passed_over.rid == "g0-0" and passed_over.rid not in admitted
    assert len(admitted) == 8, "every other request was admitted in the same pass"
    assert admitted[0] == "g1-1", "the request the loop reached instead, as it is"
    runtime = policy.feather
    assert runtime.admission.is_skipped(passed_over.rid)
    assert runtime.num_scans == 1, "one scan: the request admitted was not where Feather had put its pick"
    on_step_end(scheduler_view(policy, [passed_over]), idle_plan(batch(adder.can_run_list)))
    rest = [passed_over]
    policy.calc_priority(rest, batch(adder.can_run_list))
    assert not runtime.admission.is_skipped(passed_over.rid) and rest[0] is passed_over
