"""Feather keeps SGLang's refresh of the waiting requests' cached prefixes in the tree cache's LRU."""

from __future__ import annotations

from conftest import batch, feather_policy, group_prompt, make_req, sglang_schedule_policy
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_feather.offline.sglang_objects import make_radix_cache, token_ids


def _cached_len(cache, ids) -> int:
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids(ids)))).device_prefix_len


def _evict_one_prefix(policy_of) -> tuple[int, int]:
    """Two cached 64-token prefixes, the waited-for one cached first (older in LRU); one pass of the policy
    over a queue waiting for it, then room for one prefix is evicted. Returns both prefixes' cached lengths."""
    waited, other = group_prompt(1, 64, 0, salt=0), group_prompt(2, 64, 0, salt=0)
    cache = make_radix_cache((waited, other), kv_events=True)  # as `--schedule-policy feather` builds it
    waiting = [make_req("w", group_prompt(1, 64, 8, salt=1))]
    policy_of(cache).calc_priority(waiting, batch())
    cache.evict(EvictParams(num_tokens=64))
    return _cached_len(cache, waited), _cached_len(cache, other)


def test_a_feather_pass_refreshes_the_prefix_its_queue_waits_for():
    assert _evict_one_prefix(feather_policy) == (64, 0)


def test_sglang_fcfs_does_the_same_and_without_a_pass_lru_evicts_the_older_prefix():
    fcfs = _evict_one_prefix(lambda cache: sglang_schedule_policy()("fcfs", cache, False, False, False))
    assert fcfs == (64, 0)

    class NoPass:
        def calc_priority(self, waiting, running) -> None:
            return None

    assert _evict_one_prefix(lambda cache: NoPass()) == (0, 64)
