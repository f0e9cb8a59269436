"""The offline tools' prefix cache is the one a server builds: SGLang's factory, UnifiedRadixCache, its Rust radix tree."""

from __future__ import annotations

import pytest
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_feather.offline.sglang_objects import (
    PYTHON,
    cache_prompt,
    describe_tree_cache,
    make_allocator,
    make_radix_cache,
    token_ids,
)

SHARED = list(range(1, 41))
FIRST = SHARED + [100, 101, 102]
SECOND = SHARED + [200, 201]


def _matched(cache, tokens) -> int:
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids(tokens)))).device_prefix_len


def test_the_default_cache_is_a_unified_radix_cache_on_the_rust_radix_tree():
    cache = make_radix_cache([FIRST, SECOND])
    assert isinstance(cache, UnifiedRadixCache)
    assert isinstance(cache.tree_core, RustUnifiedTreeCore)
    assert describe_tree_cache(cache) == "UnifiedRadixCache (RustUnifiedTreeCore)"
    assert _matched(cache, FIRST) == len(FIRST)
    assert _matched(cache, SECOND + [7]) == len(SECOND)


@pytest.mark.parametrize("kind", ["unified", PYTHON])
def test_cached_prompts_hold_one_allocator_slot_per_distinct_token(kind):
    allocator = make_allocator(1000)
    cache = make_radix_cache([FIRST, SECOND], kind=kind, allocator=allocator)
    distinct = len(SHARED) + 3 + 2
    assert cache.evictable_size() == distinct
    assert allocator.available_size() == 1000 - distinct
    cache_prompt(cache, FIRST)
    assert allocator.available_size() == 1000 - distinct


def test_the_python_kind_is_sglangs_older_radix_cache():
    cache = make_radix_cache([FIRST], kind=PYTHON)
    assert type(cache) is RadixCache
    assert describe_tree_cache(cache) == "RadixCache"
    assert _matched(cache, FIRST) == len(FIRST)


def test_a_cache_not_on_the_rust_radix_tree_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    with pytest.raises(
        RuntimeError, match=r"UnifiedRadixCache \(UnifiedTreeCore\), not .*RustUnifiedTreeCore"
    ):
        make_radix_cache()


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown tree cache kind"):
        make_radix_cache(kind="hicache")


def test_a_full_allocator_fails_loudly():
    cache = make_radix_cache(allocator=make_allocator(len(FIRST)))
    cache_prompt(cache, FIRST)
    with pytest.raises(RuntimeError, match="no room for 2 more tokens"):
        cache_prompt(cache, SECOND)
