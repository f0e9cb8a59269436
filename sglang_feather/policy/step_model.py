"""`step-model`: learn decode step time from every step, STOP a candidate whose group would lower throughput."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_feather.policy.base import Decision, Observation, PolicyBase
from sglang_feather.policy.context import is_forced
from sglang_feather.policy.nnls import ForgettingNNLS
from sglang_feather.policy.steps import StepSample

# How it works.
#
# The throughput reward comes once per scheduling pass, and where a STOP pays the stopper is asked a few dozen
# times a run, all before that reward says anything; but every decode step shows what a batch costs. So this
# stopper fits, by least squares with non-negative coefficients and forgetting (`nnls.py`) on every decode
# step the admission reports, a linear model of step time over what the step read: a constant (weights, launch), the requests (one token each), the
# prefix groups, the distinct chunks (a shared prefix read once) and the chunks counted per request (a shared
# prefix read by each request). The kernel decides which of the last two a step pays: a per-request decode
# pays the second, a grouped or cascade kernel the first, and an L2 that holds the running prefixes makes the
# per-request reads cheap, so the fit learns the GPU and kernel it runs on, whatever they are. At a consult
# (`context.is_forced` cases ADD, as everywhere) it compares the batch's predicted throughput, tokens per
# second, without the candidate and with it, the candidate bringing the waiting requests of its group, who
# join behind it (`num_group_waiting`; a running group's requests never ask): a new group whose prefix read
# costs the running batch more than its tokens are worth lowers throughput and is stopped. What a STOP costs:
# the candidate waits and is served later, when its group has gathered more peers to share the prefix read
# or the batch has shrunk; the aging guard bounds that wait. Until `min_samples` decode steps were seen, and
# wherever the model predicts a non-positive time, it adds (`always`). Deterministic: no randomness is used.

CHUNKS_UNIT = 1024.0
"""Chunks per model unit (64K tokens at the default 64-token chunk), so every input is O(1)."""
REQUESTS_UNIT = 64.0
GROUPS_UNIT = 8.0
NUM_FEATURES = 5


def step_features(
    num_requests: int, num_groups: int, num_running_chunks: int, num_read_chunks: int
) -> tuple[float, ...]:
    """The model's inputs for a step that reads this batch: 1, requests, groups, distinct chunks, per-request
    chunks, each in its unit."""
    return (
        1.0,
        num_requests / REQUESTS_UNIT,
        num_groups / GROUPS_UNIT,
        num_running_chunks / CHUNKS_UNIT,
        num_read_chunks / CHUNKS_UNIT,
    )


@dataclass(frozen=True)
class StepModelConfig:
    min_samples: int = 32
    """Decode steps seen before the model is trusted; until then every candidate is added."""
    margin: float = 0.02
    """STOP only when adding lowers the batch's predicted throughput by more than this share."""
    forgetting: float = 0.999
    """λ of the fit: a step seen n steps ago weighs λⁿ (half-life ~700 steps, seconds of decoding)."""
    ridge: float = 1e-3
    """Weight of the prior that every coefficient is 0 (in milliseconds per model unit)."""
    max_leverage: float = 1.0
    """The model is trusted only for batches like those it has seen: a batch whose inputs x give xᵀ·P·x above
    this (its prediction's variance over one step's) is outside what it learned, and the candidate is added."""

    def __post_init__(self) -> None:
        if not (type(self.min_samples) is int and self.min_samples >= 1):
            raise ValueError(f"step-model option min_samples must be an int >= 1, got {self.min_samples!r}")
        if not (isinstance(self.max_leverage, int | float) and self.max_leverage > 0):
            raise ValueError(
                f"step-model option max_leverage must be a number > 0, got {self.max_leverage!r}"
            )
        for name, low, high in (("margin", 0.0, 1.0), ("forgetting", 0.0, 1.0)):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and low <= value <= high):
                raise ValueError(f"step-model option {name} must be in [{low}, {high}], got {value!r}")
        if self.forgetting == 0:
            raise ValueError("step-model option forgetting must be > 0")
        if not (isinstance(self.ridge, int | float) and math.isfinite(self.ridge) and self.ridge > 0):
            raise ValueError(f"step-model option ridge must be a finite number > 0, got {self.ridge!r}")


@dataclass(frozen=True)
class Verdict:
    """The predicted throughputs (tokens/s) a consult compared, and what it decided."""

    without: float
    with_group: float
    num_joining: int
    decision: Decision


class StepModelPolicy(PolicyBase):
    """See "how it works": a linear step-time model fitted on every decode step, throughput compared."""

    name = "step-model"
    observes_steps = True

    def __init__(self, config: StepModelConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else StepModelConfig()
        self.model = ForgettingNNLS(NUM_FEATURES, self.config.ridge, self.config.forgetting)

    def observe_step(self, step: StepSample) -> None:
        x = step_features(step.num_tokens, step.num_groups, step.num_running_chunks, step.num_read_chunks)
        self.model.update(x, step.elapsed_s * 1e3)

    def decide(self, obs: Observation) -> Decision:
        verdict = self.verdict(obs)
        return Decision.ADD if verdict is None else verdict.decision

    def verdict(self, obs: Observation) -> Verdict | None:
        """What the model says of `obs`: None while it adds without asking (forced, cold, or a prediction
        that is not a positive time)."""
        if is_forced(obs) or self.model.num_samples < self.config.min_samples:
            return None
        joining = 1 + obs.num_group_waiting if obs.adds_group else 1
        before = step_features(
            obs.batch_size, obs.num_groups_running, obs.num_running_chunks, obs.num_read_chunks
        )
        after = step_features(
            obs.batch_size + joining,
            obs.num_groups_running + obs.adds_group,
            obs.num_running_chunks + obs.num_new_chunks,
            obs.num_read_chunks + joining * obs.num_chunks,
        )
        if max(self.model.leverage(before), self.model.leverage(after)) > self.config.max_leverage:
            return None
        time_before, time_after = self.model.predict(before), self.model.predict(after)
        if time_before <= 0 or time_after <= 0:
            return None
        without = obs.batch_size / time_before * 1e3
        with_group = (obs.batch_size + joining) / time_after * 1e3
        stop = with_group < (1 - self.config.margin) * without
        return Verdict(without, with_group, joining, Decision.STOP if stop else Decision.ADD)

    def learned_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict()}

    def parse_learned_state(self, state: dict[str, Any]) -> Callable[[], None]:
        model = state["model"]
        if not isinstance(model, dict):
            raise ValueError(f"step-model state: model must be an object, got {model!r}")
        fit = self.model.parse_state(model)

        def install() -> None:
            self.model = fit

        return install
