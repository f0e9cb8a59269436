"""The cache tier fed from vLLM's block pool: it equals vLLM's own prefix match and ranks by it."""

import random

import pytest
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_harness import Driver, EngineShape, admitted_ids, check_agreement, make_scheduler, prompt

from sglang_feather.cht import HashChainError
from sglang_feather.vllm import FeatherScheduler
from sglang_feather.vllm.hashes import chunk_hash

pytestmark = pytest.mark.vllm

ALWAYS = {"stopper": "always"}
BLOCK = 16


def vllm_hit_blocks(scheduler, request) -> int:
    """vLLM's own prefix match of the request's prompt blocks (its scheduler's lookup, not capped at the
    prompt's last token, so it counts every block the cache holds)."""
    num_prompt_blocks = request.num_prompt_tokens // BLOCK
    coordinator = scheduler.kv_cache_manager.coordinator
    _, num_tokens, _ = coordinator.find_longest_cache_hit(request.block_hashes, num_prompt_blocks * BLOCK)
    return num_tokens // BLOCK


def check_tier(scheduler) -> None:
    """The tier holds exactly the hashes in vLLM's prefix cache, and every waiting request's cached depth is
    vLLM's prefix match. The whole map, not just the part vLLM's match can reach: its LRU queue frees a
    request's blocks tail first and a hit takes a whole prefix, so no cached block outlives the one before."""
    check_agreement(scheduler)
    tree = scheduler.admission.tree
    pool = scheduler.kv_cache_manager.block_pool
    keys = list(pool.cached_block_hash_to_block._cache)
    assert all(tree.is_cached(chunk_hash(key[:-4])) for key in keys)
    assert tree.num_cached == len(keys)
    for request in scheduler.waiting:
        depth = tree.candidate(request.request_id).depth_cached
        assert depth == vllm_hit_blocks(scheduler, request), request.request_id


def num_blocks_holding(pool, key) -> int:
    """How many blocks vLLM's prefix-cache map holds under `key`: vLLM 0.32/0.33 map a key to a block or a
    {block_id: block} dict; 0.34 maps it to one block id, with every id of a key held twice in `_dup_ids`."""
    cached = pool.cached_block_hash_to_block
    if hasattr(cached, "_dup_ids"):
        return len(cached._dup_ids.get(key, ())) or int(key in cached._cache)
    blocks = cached._cache.get(key)
    return 0 if blocks is None else len(blocks) if isinstance(blocks, dict) else 1


def feather(shape: EngineShape) -> Driver:
    return Driver(make_scheduler(FeatherScheduler, shape), block_size=shape.block_size, check=check_tier)


def evict_lru(scheduler, num_blocks: int) -> None:
    """Reuse the `num_blocks` least recently used free blocks as vLLM's allocation does (evicting what they
    cache), then free them again."""
    pool = scheduler.kv_cache_manager.block_pool
    pool.free_blocks(pool.get_new_blocks(num_blocks))


def lru_position(scheduler, block_hash: bytes) -> int:
    """How many free blocks vLLM reuses before (and including) the first free block holding `block_hash`."""
    key = make_block_hash_with_group_id(block_hash, 0)
    free = scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()
    return next(i for i, block in enumerate(free) if block.block_hash == key) + 1


def record_removals(admission) -> list[list[int]]:
    """Every non-empty `cache_removed` call the feed makes from now on."""
    removed = []
    cache_removed = admission.cache_removed
    admission.cache_removed = lambda hashes: removed.append(list(hashes)) or cache_removed(hashes)
    return removed


def test_the_tier_is_fed_where_it_can_equal_vllms_match_and_off_elsewhere():
    assert make_scheduler(FeatherScheduler, EngineShape()).cache_feed is not None
    scheduler = make_scheduler(FeatherScheduler, EngineShape(num_kv_cache_groups=2))
    assert scheduler.cache_feed is None, "two KV-cache groups: vLLM's match needs a hit in both"
    driver = Driver(scheduler, block_size=BLOCK, check=check_agreement)
    driver.add("a0", prompt(0, 2, 0, 5))
    driver.add("a1", prompt(0, 2, 1, 5))
    driver.run()
    assert set(driver.finished) == {"a0", "a1"}
    assert scheduler.admission.tree.num_cached == 0


def test_a_finished_requests_cached_prefix_outranks_an_earlier_stranger():
    shape = EngineShape(max_num_seqs=1, feather=ALWAYS)
    picked = {}
    for name, driver in (
        ("fcfs", Driver(make_scheduler(Scheduler, shape))),
        ("feather", feather(shape)),
    ):
        driver.add("a0", prompt(0, 4, 0, 5))
        driver.run()
        driver.add("stranger", prompt(1, 4, 0, 5))
        driver.add("a1", prompt(0, 4, 1, 5))
        if name == "feather":
            tree = driver.scheduler.admission.tree
            assert (tree.candidate("a1").depth_cached, tree.candidate("stranger").depth_cached) == (4, 0)
        step = driver.step()
        picked[name] = (
            admitted_ids(step),
            {r.req_id: r.num_computed_tokens for r in step.scheduled_new_reqs},
        )
        driver.run()
    assert picked["fcfs"] == (["stranger"], {"stranger": 0})
    assert picked["feather"] == (["a1"], {"a1": 64}), (
        "a1 reuses a0's 4 blocks, still cached after a0 finished"
    )


def test_an_evicted_prefix_stops_counting():
    driver = feather(EngineShape(num_blocks=32, max_num_seqs=1, feather=ALWAYS))
    scheduler = driver.scheduler
    driver.add("a0", prompt(0, 4, 0, 5))
    driver.run()
    tree = scheduler.admission.tree
    assert tree.num_cached == 4
    evict_lru(scheduler, scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
    assert tree.num_cached == 0
    driver.add("stranger", prompt(1, 4, 0, 5))
    driver.add("a1", prompt(0, 4, 1, 5))
    assert tree.candidate("a1").depth_cached == 0
    assert admitted_ids(driver.step()) == ["stranger"], "a1 shares nothing cached any more: arrival order"


def test_a_hash_two_blocks_hold_stays_cached_when_one_of_them_is_evicted():
    """vLLM never matches a whole prompt, so a block-aligned prompt sent again recomputes its last block into
    a second block with the same hash; evicting the older one leaves the hash cached."""
    driver = feather(EngineShape(num_blocks=32, max_num_seqs=1, feather=ALWAYS))
    scheduler = driver.scheduler
    aligned = prompt(0, 4, 0, 0)
    first = driver.add("a0", aligned, max_tokens=1)
    driver.run()
    driver.add("a1", aligned, max_tokens=1)
    driver.run()
    pool = scheduler.kv_cache_manager.block_pool
    last = make_block_hash_with_group_id(first.block_hashes[3], 0)
    assert num_blocks_holding(pool, last) == 2, "two blocks hold the last block's hash"
    removed = record_removals(scheduler.admission)
    evict_lru(scheduler, lru_position(scheduler, first.block_hashes[3]))
    assert pool.cached_block_hash_to_block.get_one_block(last) is not None
    assert removed == [] and scheduler.admission.tree.num_cached == 4
    driver.add("a2", prompt(0, 4, 2, 5))
    assert scheduler.admission.tree.candidate("a2").depth_cached == 4  # and check_tier: vLLM matches 4


def test_reserved_blocks_vllm_does_not_register_are_uncached_after_the_step():
    driver = feather(EngineShape(feather=ALWAYS))
    scheduler = driver.scheduler
    request = driver.add("a0", prompt(0, 4, 0, 5))
    scheduler.cache_feed.reserve(request.block_hashes, 0, 4)
    assert scheduler.admission.tree.candidate("a0").depth_cached == 4
    scheduler.cache_feed.settle()
    assert scheduler.admission.tree.num_cached == 0


def test_a_chain_the_tier_refuses_is_left_uncached_and_vllm_runs_on():
    driver = feather(EngineShape(feather=ALWAYS))
    driver.check = check_agreement
    scheduler = driver.scheduler

    def collide(hashes, parent=None):
        raise HashChainError("two prefixes collide")

    scheduler.admission.cache_stored = collide
    driver.add("a0", prompt(0, 4, 0, 5))
    driver.add("a1", prompt(0, 4, 1, 5))
    driver.run()
    assert set(driver.finished) == {"a0", "a1"}
    assert scheduler.cache_feed.num_refused > 0 and scheduler.admission.tree.num_cached == 0


def test_a_reset_prefix_cache_clears_the_tier():
    driver = feather(EngineShape(feather=ALWAYS))
    driver.add("a0", prompt(0, 4, 0, 5))
    driver.run()
    assert driver.scheduler.admission.tree.num_cached == 4
    assert driver.scheduler.reset_prefix_cache()
    assert driver.scheduler.admission.tree.num_cached == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_tier_equals_vllms_prefix_match_through_random_admissions_finishes_and_evictions(seed):
    rng = random.Random(seed)
    shape = EngineShape(
        num_blocks=20,
        max_num_seqs=6,
        max_num_batched_tokens=128,
        long_prefill_token_threshold=48,
        feather=ALWAYS,
    )
    driver = feather(shape)
    scheduler = driver.scheduler
    removed = record_removals(scheduler.admission)
    duplicates = resets = 0
    for i in range(120):
        for _ in range(rng.choice((0, 1, 1, 2))):
            tokens = prompt(
                rng.randrange(3), rng.randrange(1, 6), rng.randrange(4), rng.choice((0, 0, 7, 20))
            )
            driver.add(f"q{i}-{len(driver.outputs)}", tokens, max_tokens=rng.randrange(1, 60))
        live = [r.request_id for r in (*scheduler.running, *scheduler.waiting)]
        if live and rng.random() < 0.05:
            driver.abort([rng.choice(live)])
        if i % 40 == 39:
            driver.run()
            resets += scheduler.reset_prefix_cache()
            check_tier(scheduler)
        driver.step()
        pool = scheduler.kv_cache_manager.block_pool
        duplicates += any(num_blocks_holding(pool, key) > 1 for key in pool.cached_block_hash_to_block._cache)
    driver.run()
    assert removed, "the run should evict cached blocks"
    assert duplicates, "the run should cache one hash in two blocks"
    assert resets, "the run should reset the prefix cache"
    assert any(step.preempted_req_ids for step in driver.history), "the run should preempt"


@pytest.mark.parametrize(("budget", "join_step"), [(512, 0), (128, 1)])
def test_a_cold_groups_followers_join_in_the_step_that_registers_its_prefix(budget, join_step):
    """vLLM registers a block at allocation and looks waiting requests up after the running requests' chunks
    and earlier admissions: the reserved blocks let the followers join in that step (not a step later) and
    still hit the whole 12-block prefix. With a 512-token budget the leader allocates its 202-token prompt in
    step 0; with 128 tokens per step, blocks 0-7 in step 0 (too few: the followers wait) and 8-11 in step 1."""
    driver = feather(EngineShape(max_num_seqs=8, max_num_batched_tokens=budget, feather=ALWAYS))
    for i in range(4):
        driver.add(f"g{i}", prompt(0, 12, i, 10), max_tokens=2)
    joined = {}
    while driver.busy():
        step = driver.step()
        for r in step.scheduled_new_reqs:
            joined[r.req_id] = (len(driver.history) - 1, r.num_computed_tokens)
    assert joined == {"g0": (0, 0), **{f"g{i}": (join_step, 12 * BLOCK) for i in (1, 2, 3)}}
    assert driver.scheduler.admission.stats.num_deferred == 3 * join_step


def test_a_waiting_requests_cached_prefix_is_evicted_last():
    """a0's prefix is cached before b0's (older in vLLM's LRU); while a1 waits for it (the one slot is taken),
    Feather's schedule() moves it behind b0's, and vLLM's own scheduler leaves it in front."""
    shape = EngineShape(max_num_seqs=1, feather=ALWAYS)
    positions = {}
    for name, driver in (("fcfs", Driver(make_scheduler(Scheduler, shape))), ("feather", feather(shape))):
        a0 = driver.add("a0", prompt(0, 4, 0, 5))
        driver.run()
        b0 = driver.add("b0", prompt(1, 4, 0, 5))
        driver.run()
        driver.add("long", prompt(2, 1, 0, 5), max_tokens=20)
        driver.step()
        driver.add("a1", prompt(0, 4, 1, 5))
        assert admitted_ids(driver.step()) == [], "the one slot is taken: a1 waits"
        scheduler = driver.scheduler
        positions[name] = [lru_position(scheduler, r.block_hashes[i]) for r in (a0, b0) for i in (0, 3)]
    a_first, a_last, b_first, b_last = positions["fcfs"]
    assert a_last < a_first < b_last < b_first, "vLLM: a0's blocks first, each prompt's last block first"
    a_first, a_last, b_first, b_last = positions["feather"]
    assert b_last < b_first < a_last < a_first, "Feather: b0's blocks go first, a0's prefix is evicted last"
