"""`ucb-adaptive`: a discounted contextual UCB whose contexts restart when a change detector sees a shift."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_feather.policy.base import Decision, DecisionRecord, Observation, PolicyBase
from sglang_feather.policy.change import (
    DEFAULT_DELTA,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_THRESHOLD,
    PageHinkley,
    PageHinkleyConfig,
)
from sglang_feather.policy.context import Context, context_of, is_forced, parse_context
from sglang_feather.policy.tables import ARM_INDEX, ARMS, dump_table, greedy_arm, load_values
from sglang_feather.policy.ucb import DEFAULT_EXPLORATION

# How it works.
#
# Each context (from `context_of`) is a two-armed bandit, ADD or STOP, scored as `ucb`'s
# mean + c·sqrt(ln(n_context + 1) / n_arm), but over *discounted* counts and sums (Garivier & Moulines
# 2011, D-UCB): every update of a context first multiplies both arms' counts and sums by γ, then adds the
# new sample. Old rewards fade with a memory of about 1 / (1 − γ) updates, so n_context stays bounded and the
# arm that is losing keeps being tried now and then; a best arm that flips is eventually followed even if
# nothing else notices. The clock is the context's own updates, so a context the workload stops visiting
# keeps what it knew until it comes back. Waiting out the discount is slow, so each (context, arm) also
# feeds its rewards to a two-sided Page-Hinkley detector (`policy.change`); when one alarms, the context's
# reward distribution has shifted and both its arms restart from nothing (a local restart, as in M-UCB,
# Cao et al. 2019, and CD-UCB, Liu, Lee & Shroff 2018): ADD is tried again, then STOP, and UCB takes over.
# Forced cases (`is_forced`) always ADD and teach nothing; every learnable decision of a window is credited
# with the window's normalised reward, as in `ucb`. Deterministic: no randomness.

DEFAULT_DISCOUNT = 0.998
"""γ per update of a context: a memory of about 500 updates. Garivier & Moulines' tuning is
γ = 1 − (1/4)·sqrt(Υ/T) for Υ breakpoints in T plays, which gives 0.998 for one shift per ~16,000 updates of
a context (an assumption about a serving deployment, where a busy context is updated on most passes; no
measurement backs it). On the synthetic phase-shift runs (at most ~800 updates per context over three
phases) the discount barely acts and the detector does the adapting; γ = 0.99 lowers their total regret a
little and raises the stationary one (docs/policy.md)."""


@dataclass(frozen=True)
class AdaptiveUCBConfig:
    exploration: float = DEFAULT_EXPLORATION
    """UCB constant c, `ucb`'s default (the same sweep: docs/policy.md)."""
    discount: float = DEFAULT_DISCOUNT
    """γ in (0, 1]: 1 keeps every sample (UCB1 with a detector)."""
    detector_delta: float = DEFAULT_DELTA
    """Page-Hinkley δ (`policy.change`)."""
    detector_threshold: float = DEFAULT_THRESHOLD
    """Page-Hinkley λ (`policy.change`)."""
    detector_min_samples: int = DEFAULT_MIN_SAMPLES
    """Samples a (context, arm) needs before its detector may alarm."""

    def __post_init__(self) -> None:
        c = self.exploration
        if not (type(c) in (int, float) and math.isfinite(c) and c >= 0):
            raise ValueError(f"ucb-adaptive option exploration must be a finite number >= 0, got {c!r}")
        g = self.discount
        if not (type(g) in (int, float) and 0 < g <= 1):
            raise ValueError(f"ucb-adaptive option discount must be in (0, 1], got {g!r}")
        try:
            self.detector()
        except ValueError as exc:
            raise ValueError(f"ucb-adaptive detector option: {exc}") from None

    def detector(self) -> PageHinkleyConfig:
        return PageHinkleyConfig(self.detector_delta, self.detector_threshold, self.detector_min_samples)


class AdaptiveUCBPolicy(PolicyBase):
    """Discounted two-armed UCB per context with a Page-Hinkley detector per (context, arm); an alarm
    restarts the context. `num_restarts` counts the alarms (persisted)."""

    name = "ucb-adaptive"

    def __init__(self, config: AdaptiveUCBConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else AdaptiveUCBConfig()
        self._detector_config = self.config.detector()
        self.counts: dict[Context, list[float]] = {}
        self.sums: dict[Context, list[float]] = {}
        self.detectors: dict[Context, tuple[PageHinkley, PageHinkley]] = {}
        self.num_restarts = 0

    def decide(self, obs: Observation) -> Decision:
        if is_forced(obs):
            return Decision.ADD
        ctx = context_of(obs)
        counts = self.counts.get(ctx)
        if counts is None:
            return Decision.ADD
        if counts[0] == 0 or counts[1] == 0:
            return Decision.ADD if counts[0] == 0 else Decision.STOP
        total = counts[0] + counts[1]
        sums = self.sums[ctx]
        scores = [
            s / n + self.config.exploration * math.sqrt(math.log(total + 1) / n)
            for n, s in zip(counts, sums, strict=True)
        ]
        return ARMS[1] if scores[1] > scores[0] else ARMS[0]

    def greedy(self, obs: Observation) -> Decision:
        """The arm with the best discounted mean (ADD when either is untried, or tied): the learned rule."""
        if is_forced(obs):
            return Decision.ADD
        return greedy_arm(self.counts, self.sums, context_of(obs))

    def learn(self, records: Sequence[DecisionRecord], reward: float) -> None:
        gamma = self.config.discount
        for record in records:
            if is_forced(record.observation):
                continue
            ctx = context_of(record.observation)
            arm = ARM_INDEX[record.decision]
            detectors = self.detectors.get(ctx)
            if detectors is None:
                detectors = (PageHinkley(self._detector_config), PageHinkley(self._detector_config))
                self.detectors[ctx] = detectors
            if detectors[arm].update(reward):
                self._restart(ctx)
            counts = self.counts.setdefault(ctx, [0.0, 0.0])
            sums = self.sums.setdefault(ctx, [0.0, 0.0])
            for i in range(2):
                counts[i] *= gamma
                sums[i] *= gamma
            counts[arm] += 1.0
            sums[arm] += reward

    def _restart(self, ctx: Context) -> None:
        """A shift in this context: forget both arms and both detectors' history (the sample that raised the
        alarm is then learned as the new regime's first)."""
        self.counts.pop(ctx, None)
        self.sums.pop(ctx, None)
        for detector in self.detectors[ctx]:
            detector.reset()
        self.num_restarts += 1

    def learned_state(self) -> dict[str, Any]:
        return {
            "counts": dump_table(self.counts),
            "sums": dump_table(self.sums),
            "detectors": [
                {"context": list(ctx), "arms": [d.state_dict() for d in pair]}
                for ctx, pair in sorted(self.detectors.items())
            ],
            "num_restarts": self.num_restarts,
        }

    def parse_learned_state(self, state: dict[str, Any]) -> Callable[[], None]:
        counts = load_values(state["counts"])
        sums = load_values(state["sums"])
        if counts.keys() != sums.keys():
            raise ValueError("ucb-adaptive state: counts and sums cover different contexts")
        if any(v < 0 for row in counts.values() for v in row):
            raise ValueError("ucb-adaptive state: negative count")
        detectors = self._parse_detectors(state["detectors"])
        num_restarts = state["num_restarts"]
        if not (type(num_restarts) is int and num_restarts >= 0):
            raise ValueError(f"ucb-adaptive state: num_restarts must be an int >= 0, got {num_restarts!r}")

        def install() -> None:
            self.counts, self.sums, self.detectors = counts, sums, detectors
            self.num_restarts = num_restarts

        return install

    def _parse_detectors(self, raw: object) -> dict[Context, tuple[PageHinkley, PageHinkley]]:
        if not isinstance(raw, list):
            raise ValueError(f"ucb-adaptive state: detectors must be a list, got {type(raw).__name__}")
        detectors: dict[Context, tuple[PageHinkley, PageHinkley]] = {}
        for entry in raw:
            if not (isinstance(entry, dict) and set(entry) == {"context", "arms"}):
                raise ValueError(f"ucb-adaptive state: bad detector entry {entry!r}")
            ctx = parse_context(entry["context"])
            arms = entry["arms"]
            if ctx in detectors or not (isinstance(arms, list) and len(arms) == 2):
                raise ValueError(f"ucb-adaptive state: bad or duplicate detector entry {entry!r}")
            pair = (PageHinkley(self._detector_config), PageHinkley(self._detector_config))
            for detector, arm_state in zip(pair, arms, strict=True):
                detector.load_state_dict(arm_state)
            detectors[ctx] = pair
        return detectors
