"""Feather in the simulator: the shared `Admission` component (CHT order, stopper, aging) behind the sim API."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sglang_feather.admission import Admission
from sglang_feather.sim.policies import PassContext, PolicySetup

# How it works.
#
# Arrivals are enqueued into Admission (their chunk hashing is charged as scheduler CPU), each pass is one
# `Admission.select` whose `fits` callback is the engine's SGLang-budget admission and whose `cached_tokens`
# is what the simulator's prefix cache holds for the request (so a request whose shared prefix is running
# but not yet cached is skipped for the pass), and finish and retraction events go to Admission so its CHT
# always equals the engine's queues. The stopper's reward window is Admission's own: each decode step's
# tokens go to `on_decode_step` and each prefill step to `on_prefill_step` when the step ends, and
# `on_batch_drained` when no request runs any more, as in the SGLang and vLLM adapters.


class FeatherPolicy:
    name = "feather"

    def __init__(self, name: str, setup: PolicySetup) -> None:
        self.admission = Admission.from_config(setup.admission, clock=setup.clock)
        self._tokens: dict[str, np.ndarray] = {}

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        self._tokens[rid] = tokens

    def on_arrival(self, rid: str) -> None:
        self.admission.enqueue(rid, self._tokens[rid])

    def schedule(self, ctx: PassContext) -> None:
        self.admission.select(ctx.num_running, fits=ctx.try_admit, cached_tokens=ctx.num_cached_tokens)

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
        if self.admission.tree.num_active == 0:
            self.admission.on_batch_drained()
