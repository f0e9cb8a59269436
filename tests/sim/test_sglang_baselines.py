"""The SGLang baselines run SGLang 0.5.23's real SchedulePolicy on real Req objects and tree cache (no mocks).

SGLang must be importable: when it is not, these tests fail, and the simulator refuses the baselines loudly.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sim_helpers import request, small_gsp

from sglang_feather.offline.sglang_objects import token_ids
from sglang_feather.sim.__main__ import main
from sglang_feather.sim.budget import KVPool
from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.engine import Engine, EngineConfig, EngineSetup
from sglang_feather.sim.interface import PolicySetup
from sglang_feather.sim.policies import PolicyError, make_policy
from sglang_feather.sim.prefix_cache import PrefixCache
from sglang_feather.sim.requests import build_states
from sglang_feather.sim.sglang_baselines import SGLangBaseline
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
    assert isinstance(pol, SGLangBaseline)
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


def _distinct_prefixes(paths: set[tuple[int, ...]]) -> int:
    """Tokens a radix tree holding `paths` stores: the nodes of their token trie."""
    trie: dict = {}
    count = 0
    for path in paths:
        node = trie
        for token in path:
            if token not in node:
                node[token] = {}
                count += 1
            node = node[token]
    return count


class _CacheModel:
    """The simulator's cached token paths, from its own insert/evict events: an evicted leaf block leaves its
    parent's path."""

    def __init__(self, pol: SGLangBaseline) -> None:
        self.tree = pol.mirror.tree
        self.paths: set[tuple[int, ...]] = set()
        self.num_events = 0

    def on_insert(self, path) -> None:
        self.paths.add(tuple(int(t) for t in path))
        self.check()

    def on_evict(self, path, start: int) -> None:
        self.paths.discard(tuple(int(t) for t in path))
        if start:
            self.paths.add(tuple(int(t) for t in path[:start]))
        self.check()

    def check(self) -> None:
        self.num_events += 1
        stored = _distinct_prefixes(self.paths)
        allocator = self.tree.token_to_kv_pool_allocator
        assert self.tree.evictable_size() + self.tree.protected_size() == stored
        assert allocator.available_size() + stored == allocator.size
        for path in self.paths:
            key = RadixKey(token_ids(np.array(path)))
            assert self.tree.match_prefix(MatchPrefixParams(key=key)).device_prefix_len == len(path)


def test_mirror_holds_exactly_the_simulator_cache_after_every_insert_and_eviction(cost):
    requests = small_gsp(seed=2, num_groups=4, prompts_per_group=5, prefix_len=200)
    eng, pol, _ = _engine(requests, cost, "lpm", capacity=1200)
    assert pol.tree_cache == "UnifiedRadixCache (RustUnifiedTreeCore)"
    model = _CacheModel(pol)
    eng.pool.cache.on_insert.append(model.on_insert)
    eng.pool.cache.on_evict.append(model.on_evict)
    evicted = []
    eng.pool.cache.on_evict.append(lambda path, start: evicted.append(start))
    eng.run()
    assert evicted and any(evicted), "the trace should evict blocks past the first"
    assert model.num_events > len(evicted)


def test_the_run_report_names_the_tree_cache_the_baselines_ran_on(tmp_path, capsys):
    argv = ["--workload", "gsp", "--num-groups", "2", "--prompts-per-group", "3", "--output-len", "4"]
    argv += ["--policies", "fcfs,dfs-weight,feather", "--fixed-cpu-ms", "0", "--no-progress"]
    assert main(argv + ["--json", str(tmp_path / "r.json")]) == 0
    cache = "UnifiedRadixCache (RustUnifiedTreeCore)"
    assert f"SGLang tree cache (fcfs, dfs-weight): {cache}" in capsys.readouterr().out.splitlines()
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert {r["policy"]: r["tree_cache"] for r in runs} == {
        "fcfs": cache,
        "dfs-weight": cache,
        "feather": None,
    }


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
    monkeypatch.delitem(sys.modules, "sglang_feather.sim.sglang_baselines", raising=False)
    with pytest.raises(PolicyError, match="sglang"):
        make_policy("lpm", PolicySetup(cache=PrefixCache(10), clock=lambda: 0.0))


def test_ids_are_int64_tokens():
    ids = token_ids(np.array([1, 2, 3], dtype=np.int32))
    assert ids.typecode == "q" and list(ids) == [1, 2, 3]
