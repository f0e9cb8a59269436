"""SGLang 0.5.23's own fcfs / lpm / dfs-weight as simulator policies: real `calc_priority`, `Req`, tree cache."""

from __future__ import annotations

from collections.abc import Sequence

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
from sglang_feather.sim.policies import PassContext, PolicySetup

with quiet_sglang():
    from sglang.srt.managers import schedule_policy as _schedule_policy
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

# How it works.
#
# Every request becomes a real `Req`; the waiting queue is a real list that `calc_priority` sorts in place
# each pass (so, as in SGLang, an order survives passes where LPM falls back to FCFS), and the admission
# walk stops at the first request the simulator's budgets refuse. The tree cache a server builds
# (`UnifiedRadixCache` on the Rust tree core, through SGLang's own factory) mirrors the simulator's prefix
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
        self.tree = make_radix_cache(num_kv_tokens=max(capacity_tokens, 1))

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
        tail = []
        for node in reversed(path):
            if node.path_start < start or node.num_children != (1 if tail else 0):
                break
            tail.append(node.node_id)
        return tail


class SGLangPolicy:
    def __init__(self, name: str, setup: PolicySetup) -> None:
        if name not in SGLANG_POLICIES:
            raise ValueError(f"not an SGLang baseline policy: {name!r}; choose from {SGLANG_POLICIES}")
        publish_cpu_context(role="test")
        self.name = name
        self.mirror = RadixMirror(setup.cache.capacity_tokens)
        self.tree_cache = describe_tree_cache(self.mirror.tree)
        self.policy = RecordingPolicy(name, self.mirror.tree, False, False, False)
        self.reqs: dict[str, Req] = {}
        self.queue: list[Req] = []
        setup.cache.on_insert.append(self.mirror.insert)
        setup.cache.on_evict.append(self.mirror.evict)

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        self.reqs[rid] = make_req(rid, tokens, max_new_tokens=max_new_tokens, ignore_eos=True)

    def on_arrival(self, rid: str) -> None:
        self.queue.append(self.reqs[rid])

    def schedule(self, ctx: PassContext) -> None:
        self.policy.calc_priority(self.queue)
        ctx.refresh_prefixes([r.rid for r in self.policy.refreshed])
        for req in self.queue:
            if not ctx.try_admit(req.rid):
                break

    def on_admitted(self, rids: Sequence[str]) -> None:
        gone = set(rids)
        self.queue = [r for r in self.queue if r.rid not in gone]

    def on_finish(self, rid: str) -> None:
        del self.reqs[rid]

    def on_retract(self, rid: str, num_out: int) -> None:
        self.queue.append(self.reqs[rid])

    def on_step(self, num_tokens: int, elapsed_s: float) -> None:
        return None


def make_sglang_policy(name: str, setup: PolicySetup) -> SGLangPolicy:
    return SGLangPolicy(name, setup)
