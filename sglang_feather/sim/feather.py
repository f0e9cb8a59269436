"""Feather in the simulator: the shared `Admission` component (CHT order, stopper, aging) behind the sim API."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sglang_feather.admission import Admission, StopReason
from sglang_feather.sim.policies import PassContext, PolicySetup

# How it works.
#
# Arrivals are enqueued into Admission (their chunk hashing is charged as scheduler CPU), each pass is one
# `Admission.select` whose `fits` callback is the engine's SGLang-budget admission, and finish and
# retraction events go to Admission so its CHT always equals the engine's queues. The batch window of the
# stopper's reward runs from one pass that decided something to the next: the decode tokens and simulated
# seconds in between go to `end_window`.


class FeatherPolicy:
    name = "feather"

    def __init__(self, name: str, setup: PolicySetup) -> None:
        self.admission = Admission.from_config(setup.admission, clock=setup.clock)
        self._tokens: dict[str, np.ndarray] = {}
        self._window_tokens = 0
        self._window_s = 0.0
        self._decided = False
        self.rewards: list[float] = []

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        self._tokens[rid] = tokens

    def on_arrival(self, rid: str) -> None:
        self.admission.enqueue(rid, self._tokens[rid])

    def schedule(self, ctx: PassContext) -> None:
        if self._decided:
            reward = self.admission.end_window(self._window_tokens, self._window_s)
            if reward is not None:
                self.rewards.append(reward)
            self._window_tokens, self._window_s = 0, 0.0
        plan = self.admission.select(ctx.num_running, fits=ctx.try_admit, cached_tokens=ctx.num_cached_tokens)
        self._decided = bool(plan.admitted) or plan.stop is StopReason.STOPPER

    def on_admitted(self, rids: Sequence[str]) -> None:
        return None

    def on_finish(self, rid: str) -> None:
        self.admission.finish(rid)
        del self._tokens[rid]

    def on_retract(self, rid: str, num_out: int) -> None:
        self.admission.retract(rid)

    def on_step(self, num_tokens: int, elapsed_s: float) -> None:
        self._window_tokens += num_tokens
        self._window_s += elapsed_s
