"""A pass planned ahead (`plan_ahead` / `settle`) admits, skips and counts exactly as the step-by-step path."""

import dataclasses
import random

import pytest

from sglang_feather.admission import Admission, AdmissionConfig
from sglang_feather.cht import RequestState
from sglang_feather.policy import Decision
from sglang_feather.sim.engine import SimClock


def make(stopper="always", max_wait_s=300.0, cache_events=True):
    clock = SimClock()
    config = AdmissionConfig(
        chunk_size=4, stopper=stopper, max_wait_s=max_wait_s, cache_events=cache_events, concentrate=False
    )
    return Admission.from_config(config, clock=clock)


def step_by_step(adm: Admission, batch_size: int, limit: int, reaches_refusal: bool) -> list:
    """The SGLang runtime's step path: the next pick is taken right after each admission; the engine's loop
    admits `limit` and then refuses the next pick (`reaches_refusal`) or stops before reaching it."""
    adm.begin_pass()
    admitted = []
    pick = adm.next_pick()
    while pick is not None:
        proposal = None
        if len(admitted) < limit or reaches_refusal:
            proposal = adm.decide(pick, batch_size + len(admitted))
            assert proposal.decision is Decision.ADD
        if len(admitted) >= limit:
            if proposal is not None:
                adm.withdraw(proposal)
            break
        adm.accept(proposal)
        admitted.append(pick.request_id)
        pick = adm.next_pick()
    adm.end_pass()
    return admitted


def planned(
    adm: Admission,
    batch_size: int,
    limit: int,
    reaches_refusal: bool,
    first_block: int,
    block_missing: int | None = None,
) -> list:
    """The same engine loop over a plan taken in blocks that double whenever the loop reaches the end (and
    with `block_missing`, end at the pick that brings their missing chunks to it, a budget that doubles too)."""
    adm.begin_pass()
    picks, block, num_admitted, refused = [], first_block, 0, False
    while True:
        if num_admitted == len(picks):
            taken = adm.plan_ahead(batch_size, block, block_missing)
            block *= 2
            if block_missing is not None:
                block_missing *= 2
            if not taken:
                break
            picks += taken
        if num_admitted >= limit:
            refused = reaches_refusal
            break
        num_admitted += 1
    settled = adm.settle(num_admitted, refused)
    assert [p.request_id for p in settled] == [p.request_id for p in picks[:num_admitted]]
    adm.end_pass()
    return [p.request_id for p in picks[:num_admitted]]


def state(adm: Admission) -> tuple:
    tree = adm.tree
    best = tree.best()
    return (
        sorted(tree.waiting_ids()),
        sorted(tree.active_ids()),
        tree.num_suspended,
        best,
        tree.oldest(),
        dataclasses.asdict(adm.stats),
        (adm.guard.due_wait_s, adm.guard.lead_s),
        type(adm.footprint).__name__,  # a blind stopper's: nothing kept
        adm.index_sizes(),
    )


@pytest.mark.parametrize("seed", range(12))
def test_a_planned_pass_admits_and_counts_as_the_step_path(seed):
    rng = random.Random(seed)
    max_wait_s = rng.choice((None, 0.4, 1.5, 300.0))
    steps, plans = make(max_wait_s=max_wait_s), make(max_wait_s=max_wait_s)
    assert plans.can_plan
    num_taken = []  # picks the Python plan took in one call of the tree (no due check could touch them)
    take_picks = plans.tree.take_picks

    def counted_take_picks(max_picks, skip_running_uncached, max_missing=None, first=None):
        taken = take_picks(max_picks, skip_running_uncached, max_missing, first)
        num_taken.append(len(taken.candidates))
        return taken

    plans.tree.take_picks = counted_take_picks
    groups = [[g] * rng.choice((8, 16, 24)) for g in range(1, 7)]
    running: list[str] = []
    num_due = num_refused = 0
    for step in range(80):
        elapsed = rng.choice((0.01, 0.05, 0.3))
        for adm in (steps, plans):
            adm.clock.now += elapsed
        for i in range(rng.randrange(5)):
            body = [rng.randrange(100, 200) for _ in range(rng.randrange(1, 9))]
            prompt = (rng.choice(groups) if rng.random() < 0.8 else []) + body
            for adm in (steps, plans):
                adm.enqueue(f"{step}.{i}", prompt)
        waiting = sorted(steps.tree.waiting_ids())
        if waiting and rng.random() < 0.4:  # the engine caches the first chunks of a request's prompt
            hashes = steps.tree.path_hashes(rng.choice(waiting))[: rng.randrange(1, 5)]
            for adm in (steps, plans):
                adm.cache_stored(hashes)
        if waiting and rng.random() < 0.15:
            hashes = steps.tree.path_hashes(rng.choice(waiting))[rng.randrange(3) : rng.randrange(3, 5)]
            for adm in (steps, plans):
                adm.cache_removed(hashes)
        limit, reaches = rng.randrange(0, 7), rng.random() < 0.5
        before = steps.stats.num_aged
        admitted = step_by_step(steps, len(running), limit, reaches)
        block_missing = rng.choice((None, 1, 3, 10))
        assert planned(plans, len(running), limit, reaches, rng.choice((1, 2, 8)), block_missing) == admitted
        num_due += steps.stats.num_aged > before
        num_refused += reaches and len(admitted) == limit
        running += admitted
        assert state(plans) == state(steps)
        plans.tree.check_invariants()
        for adm in (steps, plans):
            adm.on_decode_step(len(running))
        for _ in range(rng.randrange(3)):
            if running and rng.random() < 0.6:
                done = running.pop(rng.randrange(len(running)))
                retracted = rng.random() < 0.2
                for adm in (steps, plans):
                    (adm.retract if retracted else adm.finish)(done)
    assert steps.stats.num_admitted > 40 and steps.stats.num_deferred > 0, "the run admitted and deferred"
    assert sum(num_taken) > steps.stats.num_admitted / 3, "most picks came from one call of the tree"
    assert num_refused > 0
    if max_wait_s is not None and max_wait_s < 2:
        assert num_due > 0, "due requests were served"


def test_settle_books_only_what_the_engine_admitted():
    adm = make()
    for i in range(4):
        adm.enqueue(f"a{i}", [1] * 8 + [i])
    adm.cache_stored(adm.tree.path_hashes("a0")[:2])
    adm.begin_pass()
    picks = adm.plan_ahead(0, 3)
    assert [p.request_id for p in picks] == ["a0", "a1", "a2"]
    states = [adm.tree.state(p.request_id) for p in picks]
    assert states == [RequestState.ACTIVE] * 2 + [RequestState.WAITING], "each activated before the next"
    with pytest.raises(ValueError, match="4 admitted of 3"):
        adm.settle(4, False)
    adm.begin_pass()
    assert adm.tree.num_active == 0 and adm.num_planned == 0, "a new pass undid the unsettled plan"
    adm.plan_ahead(0, 3)
    assert [p.request_id for p in adm.settle(2, True)] == ["a0", "a1"]
    adm.end_pass()
    assert sorted(adm.tree.active_ids()) == ["a0", "a1"] and adm.tree.state("a2") is RequestState.WAITING
    assert (adm.stats.num_admitted, adm.stats.num_withdrawn) == (2, 1)
    assert adm.settle(0, False) == [], "nothing planned: nothing to settle"


def test_only_a_blind_adding_stopper_without_engine_queries_plans():
    assert not make(stopper="static").can_plan
    assert not make(cache_events=False).can_plan, "the in-flight check would read this pass's admissions"
    with pytest.raises(ValueError, match="plan_ahead needs"):
        make(stopper="static").plan_ahead(0, 1)


def test_a_bad_budget_is_refused_before_anything_is_planned():
    adm = make()
    adm.enqueue("a", [1] * 9)
    adm.begin_pass()
    with pytest.raises(ValueError, match="max_missing must be >= 1"):
        adm.plan_ahead(0, 3, 0)
    for bad in ("3", 1.5):
        with pytest.raises(TypeError):
            adm.plan_ahead(0, 3, bad)
    assert adm.num_planned == 0 and adm.tree.num_active == 0
    assert [p.request_id for p in adm.plan_ahead(0, 3, 1)] == ["a"]
