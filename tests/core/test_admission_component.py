"""The shared admission component: proposals, stopping, aging, lifecycle events and reward bookkeeping."""

import random

import pytest

from sglang_feather.admission import Admission, AdmissionConfig, ConfigError, StopReason
from sglang_feather.cht import InvalidTransition
from sglang_feather.policy import Decision
from sglang_feather.policy.aging import EARLY_EVERY
from sglang_feather.sim.engine import SimClock


def make(stopper="always", **kw):
    clock = SimClock()
    return Admission.from_config(AdmissionConfig(chunk_size=4, stopper=stopper, **kw), clock=clock), clock


GROUP_A = [1] * 32
GROUP_B = [2] * 32


def test_select_admits_best_first_until_empty():
    adm, _ = make()
    adm.enqueue("b0", GROUP_B + [9])
    adm.enqueue("a0", GROUP_A + [5])
    adm.enqueue("a1", GROUP_A + [6])
    plan = adm.select(batch_size=0)
    assert plan.admitted == ("b0", "a0"), "strangers in arrival order"
    assert plan.stop is StopReason.EMPTY, "a1 is skipped: it would prefill a0's uncached prefix a second time"
    assert adm.stats.num_deferred == 1 and adm.stats.num_stops == 0
    assert adm.is_waiting("a1") and not adm.tree.is_suspended("a1"), "skipped for one pass only"
    plan = adm.select(batch_size=2)
    assert plan.admitted == ("a1",) and plan.stop is StopReason.EMPTY
    assert adm.tree.num_active == 3


def test_cached_prefix_is_shared_within_a_pass():
    adm, _ = make()
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(batch_size=0)
    for i in range(1, 4):
        adm.enqueue(f"a{i}", GROUP_A + [i])
    plan = adm.select(batch_size=1)
    assert plan.admitted == ("a1", "a2", "a3"), "a0 ran in an earlier pass: its prefix is cached"
    assert adm.stats.num_deferred == 0


def test_cold_groups_send_leaders_then_followers():
    adm, _ = make()
    for i in range(3):
        adm.enqueue(f"b{i}", GROUP_B + [i])
        adm.enqueue(f"a{i}", GROUP_A + [i])
    first = adm.select(batch_size=0)
    assert first.admitted == ("b0", "a0") and adm.stats.num_deferred == 4
    plan = adm.select(batch_size=2, max_requests=3)
    assert plan.stop is StopReason.LIMIT
    assert plan.admitted == ("b1", "a1", "b2"), "sharers by missing chunks, ties by arrival"


def test_no_sharing_is_not_throttled():
    adm, _ = make("static")
    for i in range(6):
        adm.enqueue(i, [100 + i] * 40)
    assert adm.select(batch_size=0).admitted == tuple(range(6)), "a batch of one has no shared prefix to lose"


def test_static_stopper_stops_on_a_large_prefix_loss():
    adm, _ = make("static")
    adm.enqueue("a0", GROUP_A + [5])
    assert adm.select(batch_size=0).admitted == ("a0",)
    adm.enqueue("b0", GROUP_B + [5])
    adm.enqueue("a1", GROUP_A + [6])
    plan = adm.select(batch_size=1)
    assert plan == type(plan)(("a1",), StopReason.STOPPER)
    assert adm.stats.num_stops == 1
    assert adm.is_waiting("b0")


def test_budget_refusal_leaves_request_waiting_and_learns_nothing():
    adm, _ = make()
    adm.enqueue("a0", GROUP_A)
    plan = adm.select(batch_size=0, fits=lambda rid: False)
    assert plan.stop is StopReason.BUDGET and plan.admitted == ()
    assert adm.is_waiting("a0")
    assert adm.stats.num_withdrawn == 1


def test_aging_guard_admits_the_oldest_at_the_bound_not_before():
    adm, clock = make("static", max_wait_s=10.0)
    adm.enqueue("a0", GROUP_A + [0])
    adm.select(0)
    clock.now = 1.0
    adm.enqueue("old", GROUP_B + [1])
    clock.now = 2.0
    adm.enqueue("a1", GROUP_A + [1])
    clock.now = 10.99
    proposal = adm.propose(batch_size=1)
    assert not proposal.is_aged and proposal.request_id == "a1"
    clock.now = 11.0
    proposal = adm.propose(batch_size=1)
    assert proposal.is_aged and proposal.request_id == "old" and proposal.decision is Decision.ADD
    adm.accept(proposal)
    assert adm.stats.num_aged == 1 and adm.is_active("old")


def test_one_due_request_per_pass_then_its_group_follows():
    """A backlog of due requests does not turn the pass into FCFS: one due request, then the ranking, which
    puts the requests sharing its prefix first; and the guard serves no other for EARLY_EVERY admissions."""
    adm, clock = make(max_wait_s=10.0, defer_uncached_prefix=False)
    for i in range(3):
        adm.enqueue(f"b{i}", GROUP_B + [i])
        adm.enqueue(f"a{i}", GROUP_A + [i])
    for i in range(EARLY_EVERY):
        adm.enqueue(f"c{i}", [100 + i] * 32)
    clock.now = 50.0
    plan = adm.select(batch_size=0, max_requests=3)
    assert plan.admitted == ("b0", "b1", "b2"), "b0 is due; its group follows it, not the older a0"
    assert adm.stats.num_aged == 1
    plan = adm.select(batch_size=3, max_requests=1)
    assert plan.admitted == ("a0",) and adm.stats.num_aged == 1, "the ranking's: a0 first of the two groups"
    plan = adm.select(batch_size=4, max_requests=8)
    assert plan.admitted == ("a1", "a2", *(f"c{i}" for i in range(6))), "a's group follows a0"
    assert adm.stats.num_aged == 1, "11 admissions since b0: the guard's budget is closed"
    plan = adm.select(batch_size=12, max_requests=1)
    assert plan.admitted == ("c6",) and adm.stats.num_aged == 2, "12 admissions on: the guard serves again"


def test_a_due_stranger_takes_the_guards_slot_before_an_older_covered_request():
    adm, clock = make(max_wait_s=10.0, defer_uncached_prefix=False)
    adm.enqueue("run", GROUP_A + [9])
    adm.select(0, max_requests=1)
    adm.enqueue("hot", GROUP_A + [1])
    clock.now = 1.0
    adm.enqueue("cold", GROUP_B + [1])
    clock.now = 30.0
    proposal = adm.propose(batch_size=1)
    assert proposal.is_aged and proposal.request_id == "cold", (
        "hot is older, but the ranking serves it anyway"
    )
    adm.accept(proposal)
    assert adm.propose(batch_size=2).request_id == "hot"


def test_the_overtaken_rule_serves_strangers_only():
    """A small group's request that the heavier group overtakes waits for the ranking until the bound (serving
    it early only mixes its prefix into the batch); a stranger, which the ranking would serve last, is due once
    it waited longer than the recent admissions."""
    adm, clock = make(max_wait_s=100.0, defer_uncached_prefix=False)
    for i in range(5):
        adm.enqueue(f"a_run{i}", GROUP_A + [i])
    adm.enqueue("b_run", GROUP_B + [0])
    adm.select(0)
    adm.enqueue("b_small", GROUP_B + [1])
    running = 6
    for i in range(20):  # a window of admissions that waited 0 s: the overtaken rule is open from the 16th
        clock.now += 1.0
        adm.enqueue(f"a{i}", GROUP_A + [100 + i])
        assert adm.select(running, max_requests=1).admitted == (f"a{i}",), "the heavier group first"
        running += 1
    assert adm.is_waiting("b_small") and adm.stats.num_aged == 0, "covered: not due before the bound"
    adm.enqueue("cold", [3] * 32)
    clock.now += 1.0
    plan = adm.select(running, max_requests=1)
    assert plan.admitted == ("cold",) and adm.stats.num_aged == 1, "a stranger overtaken is due"
    clock.now = 100.0
    running += 1
    for i in range(EARLY_EVERY - 1):
        adm.enqueue(f"a_late{i}", GROUP_A + [900 + i])
        plan = adm.select(running, max_requests=1)
        assert plan.admitted == (f"a_late{i}",), "b_small reached the bound, but the guard served cold"
        running += 1
    adm.enqueue("a_last", GROUP_A + [999])
    plan = adm.select(running, max_requests=1)
    assert plan.admitted == ("b_small",) and adm.stats.num_aged == 2, "due at the bound, the budget open"


def test_the_guard_learns_a_lead_from_late_admissions():
    adm, clock = make(max_wait_s=10.0)
    adm.enqueue("old", GROUP_B + [1])
    clock.now = 14.0
    adm.select(0, fits=lambda rid: False)
    assert adm.is_waiting("old"), "the engine had no room: the pass ended at the due request"
    adm.select(0)
    assert adm.guard.lead_s == 4.0, "it fell due at 10 s and was admitted at 14 s"
    adm.enqueue("next", GROUP_A + [1])
    clock.now = 20.0
    assert adm.guard.bound_wait_s == 6.0 and adm.guard.reached_bound(adm.wait_s("next")), "4 s early now"
    assert not adm.propose(batch_size=1).is_aged, "but the guard served one of the last EARLY_EVERY"


def test_lifecycle_and_requeue_keep_arrival():
    adm, clock = make()
    adm.enqueue("r", [1, 2, 3])
    clock.now = 3.0
    adm.select(0)
    adm.retract("r")
    assert adm.is_waiting("r")
    adm.requeue("r", [1, 2, 3, 4, 5, 6, 7])
    assert adm.wait_s("r") == 3.0
    assert adm.tree.num_chunks("r") == 2
    adm.select(0)
    adm.finish("r")
    assert len(adm.tree) == 0
    assert adm.abort("r") is False
    adm.enqueue("x", [1])
    with pytest.raises(InvalidTransition):
        adm.finish("x")
    assert adm.is_waiting("x")


def test_reward_goes_to_every_decision_of_the_window():
    adm, _ = make("ucb")
    seen = []
    adm.stopper.feedback = lambda records, throughput: seen.append((len(records), throughput)) or 0.5
    for i in range(4):
        adm.enqueue(i, [10 + i] * 40)
    adm.select(0)
    assert adm.end_window(num_tokens=200, elapsed_s=0.5) == 0.5
    assert seen == [(4, 400.0)]
    adm.end_window(num_tokens=100, elapsed_s=0.5)
    assert seen[-1] == (0, 200.0), "a window without decisions still reaches the normaliser"
    assert adm.end_window(num_tokens=0, elapsed_s=0.5) is None and len(seen) == 2


def _record_windows(adm):
    seen = []
    adm.stopper.feedback = lambda records, throughput: (
        seen.append(([r.decision for r in records], throughput)) or 0.5
    )
    return seen


def test_window_measures_decode_throughput_without_the_prefill_steps():
    adm, clock = make("ucb")
    seen = _record_windows(adm)
    adm.enqueue("a", GROUP_A + [1])
    adm.select(0)  # opens the window at t=0
    clock.now = 2.0
    adm.on_prefill_step()  # a's prefill took 2 s: neither its time nor its tokens count
    for _ in range(4):
        clock.now += 0.5
        adm.on_decode_step(10)
    adm.enqueue("b", GROUP_B + [1])
    adm.select(1)  # the next pass's first decision rewards the window: 40 tokens over 2 s of decoding
    assert seen == [([Decision.ADD], 20.0)]


def test_a_stop_and_an_add_with_equal_decode_speed_earn_equal_rewards():
    """Regression: the window of an ADD holds the prefill it caused, a STOP's holds only decode steps. With
    the prefill's time in the window every ADD scored below a STOP, although the stopped request is prefilled
    in a later pass anyway, and ucb learned to stop under continuous arrivals (docs/simulator.md)."""
    adm, clock = make("ucb")
    seen = _record_windows(adm)
    adm.enqueue("a", GROUP_A + [1])
    adm.select(0)
    adm.on_prefill_step()
    clock.now += 0.02
    adm.on_decode_step(1)
    adm.stopper.decide = lambda obs: Decision.ADD
    adm.enqueue("b", GROUP_B + [1])
    adm.select(1)  # ADD b: its window holds b's 0.05 s prefill and one 0.01 s decode step of 2 tokens
    clock.now += 0.05
    adm.on_prefill_step()
    clock.now += 0.01
    adm.on_decode_step(2)
    adm.stopper.decide = lambda obs: Decision.STOP
    adm.enqueue("c", [3] * 32 + [1])
    adm.select(2)  # STOP c: its window is one 0.01 s decode step of 2 tokens
    clock.now += 0.01
    adm.on_decode_step(2)
    adm.select(2)
    assert [decisions for decisions, _ in seen] == [[Decision.ADD], [Decision.ADD], [Decision.STOP]]
    assert seen[1][1] == pytest.approx(200.0) and seen[2][1] == pytest.approx(200.0)


def test_steps_while_no_window_is_open_are_not_rewarded():
    adm, clock = make("ucb")
    seen = _record_windows(adm)
    adm.enqueue("a", GROUP_A + [1])
    adm.select(0)
    clock.now += 1.0
    adm.on_decode_step(5)
    adm.on_batch_drained()
    assert seen == [([Decision.ADD], 5.0)]
    clock.now += 100.0  # idle, then a step report before any decision opens a window
    adm.on_decode_step(7)
    adm.on_batch_drained()
    assert len(seen) == 1


@pytest.mark.parametrize(
    "kw",
    [
        dict(chunk_size=0),
        dict(stopper="nope"),
        dict(max_wait_s=0),
        dict(max_wait_s=-1.0),
        dict(chunk_size=1.5),
    ],
)
def test_bad_config_is_a_clear_error(kw):
    with pytest.raises(ConfigError):
        AdmissionConfig(**kw)


def test_bad_stopper_option_is_a_config_error():
    with pytest.raises(ConfigError, match="ucb"):
        Admission.from_config(AdmissionConfig(stopper="ucb", stopper_options={"no_such_option": 1}))


def test_state_persists_across_instances(tmp_path):
    path = str(tmp_path / "feather.json")
    adm, _ = make("ucb", state_path=path)
    for i in range(6):
        adm.enqueue(i, GROUP_A + [i])
    adm.select(0)
    adm.end_window(300, 1.0)
    adm.save_state()
    again, _ = make("ucb", state_path=path)
    assert again.stopper.state_dict() == adm.stopper.state_dict()


def test_a_prefix_the_engine_has_cached_is_not_deferred():
    adm, _ = make()
    for i in range(3):
        adm.enqueue(f"a{i}", GROUP_A + [i])
    cached = {"a0": 0, "a1": len(GROUP_A), "a2": len(GROUP_A)}
    plan = adm.select(batch_size=0, cached_tokens=cached.__getitem__)
    assert plan.admitted == ("a0", "a1", "a2") and adm.stats.num_deferred == 0


@pytest.mark.parametrize("seed", range(6))
def test_the_blind_stopper_path_admits_and_counts_as_the_seeing_one(seed):
    """`always` is blind (no observation is built for it); a stopper shown everything that always adds must
    give the same admissions, consults, deferrals and rewards on the same events, cache events included."""
    rng = random.Random(seed)
    blind, _ = make()
    seeing, _ = make()
    assert blind.stopper.blind_decision is Decision.ADD
    shown = seeing.stopper
    shown.blind_decision = None  # the same `always`, shown every observation
    seeing.stopper = shown  # handed over again: a stopper that looks gets a footprint
    seen = []
    decide = seeing.stopper.decide
    seeing.stopper.decide = lambda obs: seen.append(obs) or decide(obs)
    groups = [[g] * rng.choice((8, 16, 24)) for g in range(1, 6)]
    running: list[str] = []
    for step in range(60):
        for adm in (blind, seeing):
            adm.clock.now += 0.05
        for i in range(rng.randrange(4)):
            prompt = rng.choice(groups) + [rng.randrange(100, 200) for _ in range(rng.randrange(1, 9))]
            for adm in (blind, seeing):
                adm.enqueue(f"{step}.{i}", prompt)
        waiting = sorted(blind.tree.waiting_ids())
        if waiting and rng.random() < 0.3:  # the engine caches the first chunks of a waiting request's prompt
            hashes = blind.tree.path_hashes(rng.choice(waiting))[: rng.randrange(1, 4)]
            for adm in (blind, seeing):
                adm.cache_stored(hashes)
        limit = rng.randrange(1, 5)
        plans = [adm.select(len(running), max_requests=limit) for adm in (blind, seeing)]
        assert plans[0] == plans[1]
        running += plans[0].admitted
        for adm in (blind, seeing):
            adm.on_decode_step(len(running))
        if running and rng.random() < 0.5:
            done = running.pop(rng.randrange(len(running)))
            for adm in (blind, seeing):
                adm.finish(done)
    a, b = blind.stats, seeing.stats
    assert (
        a.num_admitted,
        a.num_consults,
        a.num_group_consults,
        a.num_deferred,
        a.num_aged,
        a.sum_delta,
    ) == (
        b.num_admitted,
        b.num_consults,
        b.num_group_consults,
        b.num_deferred,
        b.num_aged,
        b.sum_delta,
    )
    assert (a.num_windows, a.sum_reward) == (b.num_windows, b.sum_reward)
    assert a.num_admitted > 20 and a.num_consults > 0, "the run exercised admissions and consults"
    assert len(seen) == a.num_admitted - a.num_aged, "the seeing stopper was asked about every non-aged pick"
