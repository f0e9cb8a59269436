"""FeatherScheduler inside vLLM's real v1 Scheduler, driven step by step with fake model outputs."""

import json
import random
from dataclasses import replace

import pytest
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus
from vllm_harness import (
    Driver,
    EngineShape,
    FakeClock,
    admitted_ids,
    check_agreement,
    computed_ranges,
    make_scheduler,
    prompt,
    require_model,
)

from sglang_feather.admission import DEFAULT_STOPPER
from sglang_feather.cht import RequestState
from sglang_feather.vllm import FeatherScheduler
from sglang_feather.vllm.capacity import CapacityEstimate

pytestmark = pytest.mark.vllm

ALWAYS = {"stopper": "always", "defer_uncached_prefix": False}
"""Greedy admission; a cold group is admitted in one step (these tests are about ordering, not deferral)."""
NEVER_LOSE_A_CHUNK = {
    "stopper": "static",
    "defer_uncached_prefix": False,
    "stopper_options": {"max_chunk_loss": 0, "max_chunk_loss_lenient": 0},
}
"""`static` that admits a candidate to a non-empty batch only if the batch keeps its whole shared prefix."""


def feather(shape: EngineShape, **kwargs) -> Driver:
    scheduler = make_scheduler(FeatherScheduler, shape, **kwargs)
    return Driver(scheduler, block_size=shape.block_size, check=check_agreement, clock=kwargs.get("clock"))


def test_takes_the_request_that_shares_the_running_prefix_where_fcfs_takes_the_oldest():
    shape = EngineShape(max_num_seqs=2, feather=ALWAYS)
    picked = {}
    for name, driver in (("fcfs", Driver(make_scheduler(Scheduler, shape))), ("feather", feather(shape))):
        driver.add("a0", prompt(0, 4, 0, 5))
        assert admitted_ids(driver.step()) == ["a0"]
        driver.add("b0", prompt(1, 4, 1, 5))
        driver.add("a1", prompt(0, 4, 1, 5))
        step = driver.step()
        picked[name] = (
            admitted_ids(step),
            {r.req_id: r.num_computed_tokens for r in step.scheduled_new_reqs},
        )
        driver.run()
        assert set(driver.finished) == {"a0", "b0", "a1"}
    assert picked["fcfs"] == (["b0"], {"b0": 0})
    assert picked["feather"] == (["a1"], {"a1": 64}), "a1 joins a0's batch and reuses its 4 cached blocks"


def test_orders_the_whole_admission_best_first():
    driver = feather(EngineShape(max_num_seqs=4, feather=ALWAYS))
    driver.add("a0", prompt(0, 6, 0, 3))
    driver.step()
    driver.add("c0", prompt(2, 3, 0, 3))
    driver.add("b0", prompt(0, 2, 9, 20))  # shares 2 of a0's blocks, then 1 block of its own
    driver.add("a1", prompt(0, 6, 1, 3))  # shares all 6
    assert admitted_ids(driver.step()) == ["a1", "b0", "c0"]


def test_stopper_stop_holds_admission_back_until_the_batch_drains():
    admissions = {}
    for name, options in (("always", ALWAYS), ("static", NEVER_LOSE_A_CHUNK)):
        driver = feather(EngineShape(max_num_seqs=8, feather=options))
        driver.add("a0", prompt(0, 4, 0, 5), max_tokens=3)
        driver.add("a1", prompt(0, 4, 1, 5), max_tokens=3)
        driver.step()
        driver.add("b0", prompt(1, 4, 0, 5))
        driver.add("b1", prompt(1, 4, 1, 5))
        driver.run()
        admissions[name] = [
            (i, admitted_ids(step)) for i, step in enumerate(driver.history) if admitted_ids(step)
        ]
        assert set(driver.finished) == {"a0", "a1", "b0", "b1"}
        stops = driver.scheduler.admission.stats.num_stops
        assert (stops == 0) if name == "always" else (stops == 2), stops
    assert admissions["always"] == [(0, ["a0", "a1"]), (1, ["b0", "b1"])]
    # b0 would cut the 4-chunk prefix a0 and a1 share to 0: it waits (two STOPs) until their 3 tokens are out.
    assert admissions["static"] == [(0, ["a0", "a1"]), (3, ["b0", "b1"])]


def test_preempted_requests_go_back_to_waiting_and_finish():
    shape = EngineShape(num_blocks=12, max_num_seqs=4, feather=ALWAYS)
    driver = feather(shape)
    for i in range(3):
        driver.add(f"r{i}", prompt(i, 2, i, 0), max_tokens=60)
    preempted_seen = set()
    for _ in range(600):
        if not driver.busy():
            break
        step = driver.step()
        for request_id in step.preempted_req_ids:
            assert driver.scheduler.admission.tree.state(request_id) is RequestState.WAITING
            preempted_seen.add(request_id)
    assert preempted_seen, "12 blocks cannot hold three 92-token requests: vLLM must preempt"
    assert driver.finished == dict.fromkeys(["r0", "r1", "r2"], RequestStatus.FINISHED_LENGTH_CAPPED)
    assert all(len(tokens) == 60 for tokens in driver.outputs.values())
    assert len(driver.scheduler.admission.tree) == 0


def test_aborts_remove_waiting_and_running_requests():
    driver = feather(EngineShape(max_num_seqs=2, feather=ALWAYS))
    for i in range(4):
        driver.add(f"r{i}", prompt(0, 2, i, 5), max_tokens=5)
    driver.step()
    tree = driver.scheduler.admission.tree
    assert (tree.state("r1"), tree.state("r2")) == (RequestState.ACTIVE, RequestState.WAITING)
    driver.abort(["r1", "r2"])
    assert "r1" not in tree and "r2" not in tree
    driver.run()
    assert driver.finished == {
        "r0": RequestStatus.FINISHED_LENGTH_CAPPED,
        "r1": RequestStatus.FINISHED_ABORTED,
        "r2": RequestStatus.FINISHED_ABORTED,
        "r3": RequestStatus.FINISHED_LENGTH_CAPPED,
    }
    assert len(tree) == 0


def test_prompts_shorter_than_a_block_share_nothing_and_still_run():
    driver = feather(EngineShape(max_num_seqs=4))
    short = [5, 6, 7, 8, 9]
    driver.add("s0", short)
    driver.add("s1", short)  # same tokens, no full block: vLLM cannot share them, neither does the CHT
    driver.add("long", prompt(0, 2, 0, 3))
    tree = driver.scheduler.admission.tree
    assert (tree.num_chunks("s0"), tree.num_chunks("s1"), tree.num_chunks("long")) == (1, 1, 2)
    driver.run()
    assert set(driver.finished) == {"s0", "s1", "long"}


@pytest.mark.parametrize("concentrate", [False, True], ids=["concentrate-off", "concentrate-on"])
def test_random_arrivals_aborts_and_preemptions_keep_cht_and_vllm_queues_equal(concentrate):
    rng = random.Random(10)
    options = {**NEVER_LOSE_A_CHUNK, "concentrate": concentrate}
    shape = EngineShape(num_blocks=24, max_num_seqs=6, max_num_batched_tokens=128, feather=options)
    driver = feather(shape)
    expected = {}
    next_id = 0
    for _ in range(400):
        for _ in range(rng.choice((0, 0, 1, 2))):
            if next_id < 60:
                request_id = f"q{next_id}"
                tokens = prompt(rng.randrange(4), rng.randrange(1, 4), next_id, rng.randrange(20))
                driver.add(request_id, tokens, max_tokens=rng.randrange(1, 60))
                expected[request_id] = RequestStatus.FINISHED_LENGTH_CAPPED
                next_id += 1
        live = [r.request_id for r in (*driver.scheduler.running, *driver.scheduler.waiting)]
        if live and rng.random() < 0.05:
            victim = rng.choice(live)
            driver.abort([victim])
            expected[victim] = RequestStatus.FINISHED_ABORTED
        driver.step()
    driver.run()
    assert next_id == 60
    assert driver.finished == expected
    stats = driver.scheduler.admission.stats
    if concentrate:  # fewer prefixes locked: the same arrivals need no preemption
        assert stats.num_concentrated > 0, "the run should exercise the concentration rule"
    else:
        assert any(step.preempted_req_ids for step in driver.history), "the run should exercise preemption"
    assert stats.num_stops > 0, "the run should exercise the stopper's STOP"
    assert len(driver.scheduler.admission.tree) == 0


def test_planned_requests_vllm_does_not_admit_go_back_to_waiting(monkeypatch):
    monkeypatch.setattr(CapacityEstimate, "fits", lambda self, request_id: True)  # an estimate that is wrong
    driver = feather(EngineShape(max_num_batched_tokens=64, feather=ALWAYS))
    for i in range(3):
        driver.add(f"r{i}", prompt(i, 3, i, 2), max_tokens=2)
    step = driver.step()  # the plan holds all three; vLLM's 64-token budget takes r0 (50) and 14 of r1
    assert step.num_scheduled_tokens == {"r0": 50, "r1": 14}
    assert driver.scheduler.admission.stats.num_admitted == 3
    assert driver.scheduler.admission.tree.state("r2") is RequestState.WAITING  # check_agreement holds too
    driver.run()
    assert set(driver.finished) == {"r0", "r1", "r2"}


def _record_windows(admission) -> list[tuple[int, float]]:
    """Every window the admission's reward window closes, as (tokens, decode seconds)."""
    windows = []
    window = admission._window
    end = window.end
    window.end = lambda num_tokens, elapsed_s: (
        windows.append((num_tokens, elapsed_s)) or end(num_tokens, elapsed_s)
    )
    return windows


def test_a_window_runs_from_a_passs_first_decision_until_the_batch_drains():
    driver = feather(EngineShape(max_num_seqs=4, feather={"stopper": "ucb"}), clock=FakeClock())
    driver.step_s = 0.5
    windows = _record_windows(driver.scheduler.admission)
    for i in range(3):
        driver.add(f"r{i}", prompt(0, 2, i, 5), max_tokens=4)
    driver.run()
    assert driver.num_sampled == [3, 3, 3, 3]
    assert windows == [(9, 1.5)], (
        "one window, closed when the batch drained: 3 decode steps of 0.5 s (the prefill step, which "
        "sampled 3 tokens, counts neither)"
    )
    driver.step()  # idle: no window is open, nothing is rewarded
    assert windows == [(9, 1.5)]
    assert driver.scheduler.admission.stats.last_reward is not None


def test_the_next_passs_first_decision_rewards_the_window_before_it():
    driver = feather(EngineShape(max_num_seqs=4, feather={"stopper": "ucb"}), clock=FakeClock())
    windows = _record_windows(driver.scheduler.admission)
    driver.add("a", prompt(0, 2, 0, 5), max_tokens=6)
    driver.step()  # a's prefill: the first decision opens the window at t=1000
    driver.step()
    driver.step()
    driver.add("b", prompt(1, 2, 0, 5), max_tokens=2)
    driver.step()  # b's pass decides at t=1003: a's 2 decode tokens over 2 s reward a's ADD (a's prefill
    # step counts neither its time nor its token); a new window opens
    assert windows == [(2, 2.0)]
    driver.run()
    assert windows[1:] == [(2 + 1, 2.0)], (
        "from b's decision until drained: the step with b's prefill counts nothing, then a and b decode "
        "together (2 tokens) and a alone (1)"
    )


def test_learned_state_is_saved_on_shutdown_and_loaded_on_start(tmp_path):
    state = tmp_path / "feather-state.json"
    shape = EngineShape(feather={"stopper": "ucb", "state_path": str(state)})
    driver = feather(shape, clock=FakeClock())
    for i in range(4):
        driver.add(f"r{i}", prompt(i % 2, 2, i, 5), max_tokens=3)
    driver.run()
    driver.step()
    driver.scheduler.shutdown()
    saved = json.loads(state.read_text())
    assert saved
    again = make_scheduler(FeatherScheduler, shape)
    assert again.admission.stopper.state_dict() == driver.scheduler.admission.stopper.state_dict()


def test_options_come_from_additional_config_and_the_engine():
    shape = EngineShape(block_size=32, feather={"stopper": "ucb", "max_wait_s": 5.0, "seed": 3})
    admission = make_scheduler(FeatherScheduler, shape).admission
    assert (admission.stopper.name, admission.guard.max_wait_s, admission.tree.chunk_size) == ("ucb", 5.0, 32)
    assert admission.page_size == 32
    assert admission.state_tag == {"engine": "vllm", "model": str(require_model()), "device": "cpu"}
    defaults = make_scheduler(FeatherScheduler, EngineShape()).admission
    assert (defaults.stopper.name, defaults.tree.chunk_size) == (DEFAULT_STOPPER, 16)


def test_nothing_is_planned_while_vllm_is_paused():
    driver = feather(EngineShape(feather=ALWAYS))
    driver.add("r0", prompt(0, 2, 0, 5), max_tokens=2)
    driver.scheduler.set_pause_state(PauseState.PAUSED_NEW)
    driver.step()
    driver.step()
    assert driver.scheduler.admission.stats.num_admitted == 0
    driver.scheduler.set_pause_state(PauseState.UNPAUSED)
    driver.run()
    assert driver.finished == {"r0": RequestStatus.FINISHED_LENGTH_CAPPED}
    assert driver.scheduler.admission.stats.num_admitted == 1


COLD_BURSTS = {
    "one-step": EngineShape(max_num_seqs=32, max_num_batched_tokens=2048),
    "chunked": EngineShape(max_num_seqs=32, max_num_batched_tokens=512, long_prefill_token_threshold=64),
}
"""Engines for a cold burst: every prompt fits in one step; or each prefill is cut into 64-token chunks, so a
group's prefix is still being computed (across steps) when the group's next request could be admitted."""


@pytest.mark.parametrize("engine", list(COLD_BURSTS))
@pytest.mark.parametrize("scheduler", ["vllm", "feather"])
def test_a_cold_burst_computes_each_groups_prefix_once(engine, scheduler):
    """G groups x N requests arrive at once on a cold cache: with Feather each group's shared prefix is
    computed by exactly one request (G prefix computations). vLLM alone does that too when a prefix is
    prefilled in one step (it caches a block's hash at allocation), but not under chunked prefill: the
    group's second request hits only the first chunk and computes the rest of the prefix again."""
    num_groups, per_group, num_prefix_blocks = 3, 5, 12
    prefix_len = num_prefix_blocks * 16
    shape = replace(COLD_BURSTS[engine], feather={"stopper": "always"})
    if scheduler == "feather":
        driver = feather(shape)
    else:
        driver = Driver(make_scheduler(Scheduler, shape))
    groups = {}
    for i in range(per_group):
        for g in range(num_groups):
            driver.add(f"g{g}-{i}", prompt(g, num_prefix_blocks, i, 10), max_tokens=2)
            groups[f"g{g}-{i}"] = g
    computed = {rid: [] for rid in groups}
    while driver.busy():
        for rid, span in computed_ranges(driver.step()).items():
            computed[rid].append(span)
    assert len(driver.finished) == num_groups * per_group
    prefix_tokens = {rid: sum(max(0, min(end, prefix_len) - start) for start, end in spans)
                     for rid, spans in computed.items()}  # fmt: skip
    computers = sorted(rid for rid, n in prefix_tokens.items() if n)
    if scheduler == "vllm" and engine == "chunked":
        assert sum(prefix_tokens.values()) > num_groups * prefix_len, "the scenario must show the duplicate"
        return
    assert sum(prefix_tokens.values()) == num_groups * prefix_len
    assert sorted(groups[rid] for rid in computers) == list(range(num_groups)), computers
    if scheduler == "feather" and engine == "chunked":
        assert driver.scheduler.admission.stats.num_deferred > 0


def test_the_stopper_sees_vllms_kv_headroom_and_the_group_a_candidate_adds():
    driver = feather(EngineShape(max_num_seqs=8, feather=ALWAYS))
    seen = []
    stopper = driver.scheduler.admission.stopper
    stopper.blind_decision = None  # `always` is blind (shown nothing); this one is shown every observation
    decide = stopper.decide
    stopper.decide = lambda obs: seen.append(obs) or decide(obs)
    driver.add("a0", prompt(0, 4, 0, 5), max_tokens=3)
    driver.step()
    driver.add("b0", prompt(1, 4, 0, 5))
    driver.step()
    new = [o for o in seen if o.adds_group and o.batch_size > 0]
    assert new, "b0 adds a prefix group to a0's batch"
    assert all(o.kv_free_fraction is not None and 0 < o.kv_free_fraction < 1 for o in new)
    assert new[0].num_groups_running == 1 and new[0].num_running_chunks >= 4
    assert driver.scheduler.admission.stats.num_group_consults >= 1
