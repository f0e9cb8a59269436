"""SGLang's own fcfs / lpm / dfs-weight as simulator policies: its queue's order, the simulator's budgets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sglang_feather.offline.sim_baselines import SGLangQueue
from sglang_feather.sim.interface import PassContext, PolicySetup

# How it works. Each pass asks SGLang's queue (`offline/sim_baselines.py`: real `Req`s, `calc_priority` on a
# tree cache that mirrors the simulator's prefix cache through the cache's insert and evict events) for its
# order, refreshes in the simulator's cache the prefixes SGLang's pass refreshed in its own, and admits in
# that order until the engine's budgets refuse a request, as SGLang's `PrefillAdder` walk stops.


class SGLangBaseline:
    def __init__(self, name: str, setup: PolicySetup) -> None:
        self.name = name
        self.queue = SGLangQueue(name, setup.cache.capacity_tokens)
        self.mirror = self.queue.mirror
        self.tree_cache = self.queue.tree_cache
        setup.cache.on_insert.append(self.mirror.insert)
        setup.cache.on_evict.append(self.mirror.evict)

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        self.queue.prepare(rid, tokens, max_new_tokens)

    def on_arrival(self, rid: str) -> None:
        self.queue.append(rid)

    def schedule(self, ctx: PassContext) -> None:
        order, refreshed = self.queue.calc_priority()
        ctx.refresh_prefixes(refreshed)
        for rid in order:
            if not ctx.try_admit(rid):
                break

    def on_admitted(self, rids: Sequence[str]) -> None:
        self.queue.remove(rids)

    def on_finish(self, rid: str) -> None:
        self.queue.forget(rid)

    def on_retract(self, rid: str, num_out: int) -> None:
        self.queue.append(rid)

    def on_step(self, num_tokens: int, elapsed_s: float) -> None:
        return None
