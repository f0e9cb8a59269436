"""`ucb`: a contextual UCB1 bandit that learns, per discretised context, whether adding pays."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_feather.policy.base import Decision, DecisionRecord, Observation, PolicyBase
from sglang_feather.policy.context import Context, context_of, is_forced
from sglang_feather.policy.tables import ARM_INDEX, ARMS, dump_table, greedy_arm, load_counts, load_values

DEFAULT_EXPLORATION = 0.5
"""UCB1 constant c for rewards normalised to [0, 1]; see docs/policy.md for the sweep behind it."""


@dataclass(frozen=True)
class UCBConfig:
    exploration: float = DEFAULT_EXPLORATION

    def __post_init__(self) -> None:
        c = self.exploration
        if not (isinstance(c, int | float) and math.isfinite(c) and c >= 0):
            raise ValueError(f"ucb option exploration must be a finite number >= 0, got {c!r}")


class UCBPolicy(PolicyBase):
    """Each context (batch bucket, clamped Δ, w bucket) is a two-armed bandit, ADD or STOP.

    Score of an arm = mean reward + c·sqrt(ln(n_context + 1) / n_arm); an arm never tried in the context
    scores +inf (ADD first when both are untried), ties go to ADD. Forced cases (`context.is_forced`: an
    empty batch, or a running group's candidate with Δ = 0) always ADD and teach nothing. Every learnable decision of a window is credited with
    that window's normalised reward (the authors' scheme). Fully deterministic: no randomness is used.
    """

    name = "ucb"

    def __init__(self, config: UCBConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else UCBConfig()
        self.counts: dict[Context, list[int]] = {}
        self.sums: dict[Context, list[float]] = {}

    def decide(self, obs: Observation) -> Decision:
        if is_forced(obs):
            return Decision.ADD
        ctx = context_of(obs)
        counts = self.counts.get(ctx)
        if counts is None:
            return Decision.ADD
        total = counts[0] + counts[1]
        scores = []
        for n, s in zip(counts, self.sums[ctx], strict=True):
            bonus = self.config.exploration * math.sqrt(math.log(total + 1) / n) if n else math.inf
            scores.append(s / n + bonus if n else math.inf)
        return ARMS[1] if scores[1] > scores[0] else ARMS[0]

    def greedy(self, obs: Observation) -> Decision:
        """The arm with the best mean reward so far (ADD when untried or tied): the learned rule."""
        if is_forced(obs):
            return Decision.ADD
        return greedy_arm(self.counts, self.sums, context_of(obs))

    def learn(self, records: Sequence[DecisionRecord], reward: float) -> None:
        for record in records:
            if is_forced(record.observation):
                continue
            ctx = context_of(record.observation)
            arm = ARM_INDEX[record.decision]
            self.counts.setdefault(ctx, [0, 0])[arm] += 1
            self.sums.setdefault(ctx, [0.0, 0.0])[arm] += reward

    def learned_state(self) -> dict[str, Any]:
        return {"counts": dump_table(self.counts), "sums": dump_table(self.sums)}

    def parse_learned_state(self, state: dict[str, Any]) -> Callable[[], None]:
        counts = load_counts(state["counts"])
        sums = load_values(state["sums"])
        if counts.keys() != sums.keys():
            raise ValueError("ucb state: counts and sums cover different contexts")

        def install() -> None:
            self.counts, self.sums = counts, sums

        return install
