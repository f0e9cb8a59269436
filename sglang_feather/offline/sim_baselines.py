"""SGLang 0.5.23's own fcfs / lpm / dfs-weight queue for the simulator: real `calc_priority`, `Req`, tree cache."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from sglang_feather.offline.sglang_objects import (
    cache_prompt,
    describe_tree_cache,
    make_radix_cache,
    make_req,
    publish_cpu_context,
    quiet_sglang,
    token_ids,
)

with quiet_sglang():
    from sglang.srt.managers import schedule_policy as _schedule_policy
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

# How it works.
#
# Every request becomes a real `Req`; the waiting queue is a real list that `calc_priority` sorts in place
# each pass (so, as in SGLang, an order survives passes where LPM falls back to FCFS); the simulator's
# policy (`sim/sglang_baselines.py`) walks that order and stops at the first request its budgets refuse. The tree cache a server builds
# (`UnifiedRadixCache` on SGLang's Rust radix tree, through SGLang's own factory) mirrors the simulator's prefix
# cache through its insert/evict listeners, so LPM and DFS-weight match against the same cached prefixes
# the simulator holds. An evicted block is cut out of the mirror by splitting the tree at the block start
# (a match there) and evicting, leaf first, the nodes of that path that lie wholly past it and hold nothing
# else, with the per-leaf eviction step SGLang's own eviction walk runs (their KV slots go back to the
# allocator).

SGLANG_POLICIES = ("fcfs", "lpm", "dfs-weight")


class RecordingPolicy(SchedulePolicy):
    """SGLang's `SchedulePolicy`, recording the waiting requests whose cached prefixes its pass refreshed in
    the tree cache's LRU, in refresh order: every request a cache-aware policy matched, and the ones
    `_touch_waiting_prefixes` touched (so the simulator's cache can refresh the same ones)."""

    refreshed: list[Req]

    def calc_priority(self, waiting_queue: list[Req], *args, **kwargs) -> None:
        self.refreshed = []
        super().calc_priority(waiting_queue, *args, **kwargs)

    def _compute_prefix_matches(self, waiting_queue: list[Req], policy):
        self.refreshed.extend(waiting_queue)  # `match_kv_cache` on each, in queue order
        return super()._compute_prefix_matches(waiting_queue, policy)

    def _touch_waiting_prefixes(self, policy, waiting_queue: list[Req]) -> None:
        calls = self._waiting_prefix_refresh_calls
        super()._touch_waiting_prefixes(policy, waiting_queue)
        if (
            self._waiting_prefix_refresh_calls != calls
            and calls % _schedule_policy.WAITING_PREFIX_REFRESH_INTERVAL == 0
        ):
            self.refreshed.extend(reversed(waiting_queue[: _schedule_policy.WAITING_QUEUE_PREFIX_MATCH_MAX]))


class RadixMirror:
    """SGLang's tree cache kept equal, prefix for prefix, to the simulator's block cache of `capacity_tokens`."""

    def __init__(self, capacity_tokens: int) -> None:
        tree = make_radix_cache(num_kv_tokens=max(capacity_tokens, 1))
        if not isinstance(tree, UnifiedRadixCache):  # the default kind: what a server builds
            raise TypeError(f"the radix mirror runs on SGLang's UnifiedRadixCache, got {type(tree).__name__}")
        self.tree = tree

    def insert(self, path: np.ndarray) -> None:
        cache_prompt(self.tree, path)

    def evict(self, path: np.ndarray, start: int) -> None:
        ids = token_ids(path)
        if start > 0:
            self._match(ids[:start])
        res = self._match(ids)
        if res.device_prefix_len != len(ids):
            raise RuntimeError(
                f"radix mirror lost a path of {len(ids)} tokens (matched {res.device_prefix_len})"
            )
        for node in self._evictable_tail(res.last_device_node, start):
            self.tree._evict_device_leaf(node, {ct: 0 for ct in self.tree.tree_components})

    def _match(self, ids):
        return self.tree.match_prefix(MatchPrefixParams(key=RadixKey(ids)))

    def _evictable_tail(self, leaf, start: int) -> list:
        """Node ids from `leaf` up that lie wholly at or past `start` and hold only the path below them."""
        (path,) = self.tree.tree_core.collect_path_info([leaf])
        tail: list[int] = []
        for node in reversed(path):
            if node.path_start < start or node.num_children != (1 if tail else 0):
                break
            tail.append(node.node_id)
        return tail


class SGLangQueue:
    """SGLang's waiting queue under one of its own policies, against a tree cache of `capacity_tokens` that
    mirrors the simulator's prefix cache (fed through `mirror.insert` / `mirror.evict`)."""

    def __init__(self, name: str, capacity_tokens: int) -> None:
        if name not in SGLANG_POLICIES:
            raise ValueError(f"not an SGLang baseline policy: {name!r}; choose from {SGLANG_POLICIES}")
        publish_cpu_context(role="test")
        self.mirror = RadixMirror(capacity_tokens)
        self.tree_cache = describe_tree_cache(self.mirror.tree)
        self.policy = RecordingPolicy(name, self.mirror.tree, False, False, False)
        self.reqs: dict[str, Req] = {}
        self.queue: list[Req] = []

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        self.reqs[rid] = make_req(rid, tokens, max_new_tokens=max_new_tokens, ignore_eos=True)

    def append(self, rid: str) -> None:
        """An arrival, or a retracted request rejoining the queue at its end."""
        self.queue.append(self.reqs[rid])

    def calc_priority(self) -> tuple[Iterator[str], list[str]]:
        """One pass of SGLang's `calc_priority`: the waiting requests in its order (lazily, read before any
        leaves) and the ones whose cached prefixes it refreshed, in refresh order."""
        self.policy.calc_priority(self.queue)
        return (r.rid for r in self.queue), [r.rid for r in self.policy.refreshed]

    def remove(self, rids: Sequence[str]) -> None:
        gone = set(rids)
        self.queue = [r for r in self.queue if r.rid not in gone]

    def forget(self, rid: str) -> None:
        del self.reqs[rid]
