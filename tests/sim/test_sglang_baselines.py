"""The SGLang baselines run SGLang 0.5.23's real SchedulePolicy on real Req/RadixCache objects (no mocks).

SGLang must be importable: when it is not, these tests fail, and the simulator refuses the baselines loudly.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sim_helpers import request, small_gsp

from sglang_feather.offline.sglang_objects import token_ids
from sglang_feather.offline.sim_baselines import SGLangPolicy
from sglang_feather.sim.budget import KVPool
from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.engine import Engine, EngineConfig, EngineSetup
from sglang_feather.sim.policies import PolicyError, PolicySetup, make_policy
from sglang_feather.sim.prefix_cache import PrefixCache
from sglang_feather.sim.requests import build_states
from sglang_feather.sim.trace import TokenSource


def _engine(requests, cost, policy, capacity):
    src = TokenSource()
    states = build_states(requests, src, 16)
    cache = PrefixCache(capacity)
    pol = make_policy(policy, PolicySetup(cache=cache, clock=lambda: 0.0))
    setup = EngineSetup(cost, EngineConfig(kv_capacity_tokens=capacity), FixedCpu(0.0), src)
    eng = Engine(states, pol, KVPool(capacity, cache), setup)
    return eng, pol, states


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
def test_mirror_radix_cache_matches_the_simulator_cache_after_evictions(cost, policy):
    requests = small_gsp(seed=2, num_groups=4, prompts_per_group=5, prefix_len=200)
    eng, pol, states = _engine(requests, cost, policy, capacity=1200)
    assert isinstance(pol, SGLangPolicy)
    evicted = []
    eng.pool.cache.on_evict.append(lambda path, start: evicted.append(len(path) - start))
    eng.run()
    assert evicted, "the trace should force evictions"
    for s in states:
        sim = eng.pool.cache.match(s.hashes)
        sim_tokens = s.ends[sim - 1] if sim else 0
        real = pol.mirror.tree.match_prefix(
            MatchPrefixParams(key=RadixKey(token_ids(s.tokens)))
        ).device_prefix_len
        assert sim_tokens <= real < sim_tokens + 16 or real == s.prompt_len


def test_lpm_admits_cached_prefix_groups_first(cost):
    warm = [request("w", [("A", 256), ("wq", 8)], output_len=2)]
    later = [
        request(f"{g}{i}", [(g, 256), (f"{g}q{i}", 8)], output_len=2, arrival_s=5.0)
        for g, i in [("B", 0), ("A", 0), ("B", 1), ("A", 1)]
    ]
    orders = {}
    for policy in ("fcfs", "lpm"):
        eng, _, _ = _engine(warm + later, cost, policy, capacity=100_000)
        log = eng.run()
        orders[policy] = [r.rid for r in sorted(log.requests, key=lambda r: (r.admit_s, r.first_token_s))]
    assert orders["fcfs"][1:] == ["B0", "A0", "B1", "A1"]
    assert orders["lpm"][1:3] == ["A0", "A1"]


def test_missing_sglang_fails_loudly(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang_feather.offline.sim_baselines", None)
    with pytest.raises(PolicyError, match="sglang"):
        make_policy("lpm", PolicySetup(cache=PrefixCache(10), clock=lambda: 0.0))


def test_ids_are_int64_tokens():
    ids = token_ids(np.array([1, 2, 3], dtype=np.int32))
    assert ids.typecode == "q" and list(ids) == [1, 2, 3]
