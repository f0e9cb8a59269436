"""SGLang's own KV events, from a real UnifiedRadixCache on SGLang's Rust radix tree, keep the cache tier exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_feather.admission import Admission, AdmissionConfig
from sglang_feather.offline.sglang_objects import (
    cache_prompt,
    make_allocator,
    make_radix_cache,
    server_tree_cache,
    token_ids,
)
from sglang_feather.sglang.cache_events import EventTap, EventTranslator, event_source, events_enabled

CHUNK = 8


def cache_with_events(page_size: int, num_tokens: int = 4096, kind: str = "unified"):
    """A tree cache recording KV events: the server's (`UnifiedRadixCache`, SGLang's Rust radix tree) or SGLang's
    Python `RadixCache`."""
    return make_radix_cache(page_size=page_size, num_kv_tokens=num_tokens, kind=kind, kv_events=True)


def matched(cache, tokens) -> int:
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids(tokens)))).device_prefix_len


def depth_cached(admission: Admission, tokens) -> int:
    """The cache tier's cached depth of a prompt, through a request enqueued and removed again."""
    admission.enqueue("probe", tokens)
    depth = admission.tree.candidate("probe").depth_cached
    admission.abort("probe")
    return depth


prompts = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 60)), min_size=1, max_size=12
)
"""(document, split point, length): prompts that share documents, diverge anywhere and end anywhere."""


@pytest.mark.parametrize("kind", ["unified", "python"])
@pytest.mark.parametrize("page_size", [1, 4])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(prompts, st.integers(0, 200)), min_size=1, max_size=4))
def test_the_tier_agrees_with_the_cache_match_on_every_prompt(kind, page_size, ops):
    """After any inserts and evictions, a prompt's cached depth in the tier is the cache's own match in whole
    chunks (the equivalence the in-flight check relies on instead of a match per candidate), on both of SGLang's
    radix trees (the Rust one reports a node per event, the Python one a page)."""
    cache = cache_with_events(page_size, kind=kind)
    assert events_enabled(cache)
    admission = Admission.from_config(
        AdmissionConfig(chunk_size=CHUNK, page_size=page_size, cache_events=True)
    )
    translator = EventTranslator(admission, CHUNK)
    tap = EventTap(cache, translator, publish=False)
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 1000, 120).tolist() for _ in range(4)]
    seen = []
    for batch, num_evict in ops:
        for doc, split, length in batch:
            tokens = docs[doc][:split] + [1000 + length] * length
            cache_prompt(cache, tokens)
            seen.append(tokens)
        cache.evict(EvictParams(num_tokens=num_evict))
        tap.drain()
        for tokens in seen:
            assert depth_cached(admission, tokens) == matched(cache, tokens) // CHUNK
        translator.runs.check_invariants()
    admission.tree.check_invariants()
    assert translator.counts.num_skipped == 0


def test_the_publisher_still_gets_every_event():
    cache = cache_with_events(page_size=1)
    admission = Admission.from_config(AdmissionConfig(chunk_size=CHUNK, cache_events=True))
    tap = EventTap(cache, EventTranslator(admission, CHUNK), publish=True)
    cache_prompt(cache, list(range(1, 40)))
    tap.drain()
    cache_prompt(cache, list(range(1, 30)) + [7] * 20)
    published = cache.take_events()
    assert [type(e).__name__ for e in published] == ["AllBlocksCleared", "BlockStored", "BlockStored"]
    assert cache.take_events() == []
    assert admission.tree.num_cached == 39 // CHUNK + (29 - 24 + 20) // CHUNK
    tap.close()
    assert "take_events" not in cache.__dict__


def test_the_rust_radix_trees_queue_is_drained_directly_with_the_events_take_events_returns():
    """On the cache a 0.5.23 server builds, the tap drains the queue of SGLang's Rust radix tree itself (one call when it is
    empty) and gets exactly what `take_events` would: twin caches, the same inserts and evictions."""
    fast, public = cache_with_events(page_size=4), cache_with_events(page_size=4)
    assert event_source(fast).convert is not None, (
        "SGLang 0.5.23's Rust path was not recognised (RUST_EVENT_PATH)"
    )
    admission = Admission.from_config(AdmissionConfig(chunk_size=CHUNK, page_size=4, cache_events=True))
    tap = EventTap(fast, EventTranslator(admission, CHUNK), publish=True)
    take = fast.take_events  # the tap's drain, handing on what it read (`take_for_publisher`)
    rng = np.random.default_rng(1)
    for step in range(6):
        for _ in range(3):
            tokens = rng.integers(1, 50, int(rng.integers(4, 60))).tolist()
            for cache in (fast, public):
                cache_prompt(cache, tokens)
        for cache in (fast, public):
            cache.evict(EvictParams(num_tokens=int(rng.integers(0, 40))))
        events, expected = take(), public.take_events()
        assert events == expected and (step == 0 or events), f"step {step}"
    assert take() == [] == public.take_events()
    tap.close()


def test_other_caches_are_drained_through_take_events():
    cache = cache_with_events(page_size=1, kind="python")
    source = event_source(cache)
    assert source.take == cache.take_events and source.convert is None


def test_events_are_off_unless_the_cache_was_built_with_them():
    params = CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=make_allocator(64), page_size=1
    )
    assert not events_enabled(server_tree_cache(params))


def test_the_configured_runtime_gets_the_events_the_startup_runtime_did_not_drain():
    """SGLang builds the policy (a default runtime) before the scheduler configures the real one: events
    recorded in between must reach the configured runtime, not the discarded one."""
    from sglang_feather.sglang.options import FeatherOptions
    from sglang_feather.sglang.policy import FeatherSchedulePolicy

    cache = cache_with_events(page_size=1)
    policy = FeatherSchedulePolicy("feather", cache, False, False, False)
    cache_prompt(cache, list(range(1, 201)))
    policy.configure(FeatherOptions(AdmissionConfig(stopper="always")))
    runtime = policy.feather
    assert runtime.events is not None and runtime.config.cache_events
    runtime.begin_pass([], [])
    assert runtime.admission.tree.num_cached == 200 // runtime.config.chunk_size == 3
