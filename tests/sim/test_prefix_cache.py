"""The block prefix cache: capacity, locking, LRU leaf eviction, and hit + miss accounting in the engine."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import run, small_gsp

from sglang_feather.cht.hashing import chunk_hashes
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.prefix_cache import CacheFull, PrefixCache
from sglang_feather.sim.sharing import block_ends

BS = 4


def _path(tokens: list[int]):
    arr = np.asarray(tokens, dtype=np.int32)
    return chunk_hashes(arr, BS), block_ends(len(arr), BS), arr


def test_match_lock_and_lru_eviction_order():
    cache = PrefixCache(capacity_tokens=100)
    a = _path([1] * 8 + [2] * 4)
    b = _path([1] * 8 + [3] * 4)
    c = _path([9] * 8)
    for h, e, t in (a, b, c):
        cache.insert(h, e, t, free_tokens=100 - cache.num_tokens)
    assert cache.match(a[0]) == 3 and cache.match(b[0]) == 3 and cache.match(c[0]) == 2
    assert cache.num_tokens == 8 + 4 + 4 + 8
    cache.lock(b[0])
    cache.touch(a[0])
    assert cache.evict(4) == 4
    assert cache.match(c[0]) == 1
    assert cache.evict(100) == 4 + 4
    assert cache.match(b[0]) == 3 and cache.match(a[0]) == 2 and cache.match(c[0]) == 0
    cache.unlock(b[0])
    cache.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 20), st.booleans()), min_size=1, max_size=40))
def test_random_operations_keep_invariants(ops):
    cache = PrefixCache(capacity_tokens=48)
    locked: list[list[int]] = []
    for prefix, length, lock in ops:
        h, e, t = _path([prefix] * 6 + list(range(100 * prefix, 100 * prefix + length)))
        before = cache.match(h)
        try:
            cache.insert(h, e, t, cache.capacity_tokens - cache.num_tokens)
        except CacheFull:
            assert cache.match(h) == before
            cache.check_invariants()
            continue
        assert cache.match(h) == len(h)
        if lock:
            cache.lock(h)
            locked.append(h)
        elif locked:
            cache.unlock(locked.pop())
        cache.check_invariants()
        assert cache.num_tokens <= cache.capacity_tokens


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), min_size=1, max_size=12),
    st.lists(st.lists(st.integers(0, 11), max_size=8), min_size=1, max_size=4),
)
def test_touch_paths_is_one_touch_per_path_in_order(inserts, touches):
    """The batched refresh leaves every block's time, and so the eviction order, exactly as one `touch` per
    path in the given order does (the reference)."""
    paths = [_path([p] * 6 + list(range(100 * p, 100 * p + n))) for p, n in inserts]
    batched, reference = PrefixCache(capacity_tokens=64), PrefixCache(capacity_tokens=64)
    orders: tuple[list[int], list[int]] = ([], [])
    for cache, order in zip((batched, reference), orders, strict=True):
        cache.on_remove.append(order.append)
        for h, e, t in paths:
            try:
                cache.insert(h, e, t, cache.capacity_tokens - cache.num_tokens)
            except CacheFull:
                pass
    for chosen in touches:
        picked = [paths[i % len(paths)][0] for i in chosen]
        batched.touch_paths(picked)
        for h in picked:
            reference.touch(h)
        assert {h: b.last_access for h, b in batched._blocks.items()} == {
            h: b.last_access for h, b in reference._blocks.items()
        }
        batched.check_invariants()
    assert batched.evict(1000) == reference.evict(1000)
    assert orders[0] == orders[1]


def test_touch_paths_spares_the_refreshed_prefix_from_eviction():
    cache = PrefixCache(capacity_tokens=100)
    a, b = _path([1] * 8 + [2] * 4), _path([5] * 8)
    for h, e, t in (a, b):
        cache.insert(h, e, t, free_tokens=100 - cache.num_tokens)
    cache.touch_paths([a[0][:2]])  # a's first two blocks only: its leaf stays the oldest
    assert cache.evict(4) == 4 and cache.match(a[0]) == 2 and cache.match(b[0]) == 2
    cache.touch_paths([a[0]])
    assert cache.evict(4) == 4 and cache.match(b[0]) == 1 and cache.match(a[0]) == 2


def test_engine_accounting_hit_plus_miss_is_prompt_tokens(cost):
    requests = small_gsp(prompts_per_group=10)
    log = run(requests, cost, "feather", EngineConfig(kv_capacity_tokens=3000))
    assert log.num_retractions == 0
    assert log.cache_hit_tokens + log.cache_miss_tokens == sum(r.prompt_len for r in requests)
    assert 0 < log.cache_hit_tokens
    assert log.max_cache_tokens <= 3000


def test_warm_cache_hits_every_shared_prefix(cost):
    requests = small_gsp(prompts_per_group=4)
    log = run(requests, cost, "feather", EngineConfig(warm_cache=True))
    shared = 300 // 16 * 16
    assert log.cache_hit_tokens >= shared * len(requests)
