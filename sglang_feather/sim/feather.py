"""Feather in the simulator: the shared `Admission` component (CHT order, stopper, aging) behind the sim API."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sglang_feather.admission import Admission
from sglang_feather.sim.interface import PassContext, PolicySetup
from sglang_feather.types import ChunkHash, RequestId

# How it works.
#
# Arrivals are enqueued into Admission (their chunk hashing is charged as scheduler CPU), each pass is one
# `Admission.select` whose `fits` callback is the engine's SGLang-budget admission, and finish and retraction
# events go to Admission so its CHT always equals the engine's queues. The prefix cache's block events feed
# the cache tier, as SGLang's KV-event feed does in a server: a block hash is the CHT's hash of the same
# prefix (both are the cumulative xxh64 of every token up to the block's end), so a stored block that ends
# on a chunk boundary names a cached chunk, and every evicted block is passed on (the tier ignores the ones
# that name no chunk). The tier then answers the in-flight check (a request whose shared prefix is running
# but not yet cached is skipped for the pass) and the ranking by cached prefix. The stopper's reward window is Admission's own: each decode step's
# tokens go to `on_decode_step` and each prefill step to `on_prefill_step` when the step ends, and
# `on_batch_drained` when no request runs any more, as in the SGLang and vLLM adapters. Each pass first
# refreshes in the cache's LRU the prefixes Admission names from the head of the queue (`refresh.py`), as a
# Feather server has SGLang's tree cache do.


def _sim_id(request_id: RequestId) -> str:
    """One of the simulator's request ids (a string) back from the admission, which takes any hashable id."""
    if not isinstance(request_id, str):
        raise TypeError(f"the simulator enqueued string ids, got {request_id!r}")
    return request_id


class FeatherPolicy:
    name = "feather"

    def __init__(self, name: str, setup: PolicySetup) -> None:
        config = replace(setup.admission, cache_events=True)
        self.admission = Admission.from_config(config, clock=setup.clock)
        self._chunk_size = config.chunk_size
        self._tokens: dict[str, np.ndarray] = {}
        setup.cache.on_store.append(self._stored)
        setup.cache.on_remove.append(self._removed)

    def _stored(self, hashes: Sequence[int], ends: Sequence[int], first_new: int) -> None:
        chunk = self._chunk_size
        chain = [
            ChunkHash(h)
            for h, end in zip(hashes[first_new:], ends[first_new:], strict=True)
            if end % chunk == 0
        ]
        if not chain:
            return
        start = ends[first_new - 1] if first_new else 0
        boundary = start - start % chunk
        parent = None
        if boundary:
            parent = ChunkHash(hashes[bisect.bisect_left(ends, boundary)])
        self.admission.cache_stored(chain, parent)

    def _removed(self, block_hash: int) -> None:
        self.admission.cache_removed([ChunkHash(block_hash)])

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        self._tokens[rid] = tokens

    def on_arrival(self, rid: str) -> None:
        self.admission.enqueue(rid, self._tokens[rid])

    def schedule(self, ctx: PassContext) -> None:
        ctx.refresh_prefixes([_sim_id(rid) for rid in self.admission.prefixes_to_refresh(ctx.waiting_ids())])
        self.admission.select(
            ctx.num_running, fits=lambda rid: ctx.try_admit(_sim_id(rid)), headroom=ctx.kv_headroom
        )

    def on_admitted(self, rids: Sequence[str]) -> None:
        return None

    def on_finish(self, rid: str) -> None:
        self.admission.finish(rid)
        del self._tokens[rid]

    def on_retract(self, rid: str, num_out: int) -> None:
        self.admission.retract(rid)

    def on_step(self, num_tokens: int, elapsed_s: float) -> None:
        if num_tokens:
            self.admission.on_decode_step(num_tokens)
        else:
            self.admission.on_prefill_step()
        if self.admission.num_active == 0:
            self.admission.on_batch_drained()
