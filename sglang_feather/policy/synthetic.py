"""A synthetic batching environment whose optimal stopping rule is known, for tests and figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sglang_feather.policy.base import Decision, DecisionRecord, Observation, StoppingPolicy
from sglang_feather.policy.context import is_forced

START_DEPTH = 40
"""Shared-prefix depth (chunks) of the running batch at the start of every pass."""


@dataclass(frozen=True)
class GroupedWorkload:
    """One pass per episode: a batch of `batch_size` requests of group A sharing 40 chunks; the CHT offers
    first 0-2 more requests of group A (Δ = 0, forced ADD, each +`same_gain`), then `num_mismatched`
    candidates from other groups with Δ uniform in 1..8 and w uniform in 0..7. Window throughput is
    `peak_tps · (0.3 + 0.015 · initial batch + Σ gains + N(0, noise))`. Admitting a mismatched candidate
    gains `gain` while the batch is below `small_batch` (an underused GPU likes any work) or when it costs
    at most `max_good_delta` chunks, and loses `loss` otherwise (a different group dilutes the prefix).
    Because `loss > (num_mismatched - 1) · gain`, the rule "add iff batch < small_batch or Δ <= max_good_delta"
    is optimal even in hindsight, so per-episode regret against it is never negative.
    """

    small_batch: int = 8
    max_good_delta: int = 2
    gain: float = 0.1
    loss: float = 0.3
    noise: float = 0.03
    num_mismatched: int = 3

    same_gain = 0.02
    peak_tps = 5000.0

    def __post_init__(self) -> None:
        if self.loss <= (self.num_mismatched - 1) * self.gain:
            raise ValueError("GroupedWorkload needs loss > (num_mismatched - 1) * gain for a known optimum")

    def optimal(self, obs: Observation) -> Decision:
        good = obs.delta == 0 or obs.batch_size < self.small_batch or obs.delta <= self.max_good_delta
        return Decision.ADD if good else Decision.STOP

    def gain_of(self, obs: Observation) -> float:
        if obs.delta == 0:
            return self.same_gain
        return self.gain if self.optimal(obs) is Decision.ADD else -self.loss


@dataclass(frozen=True)
class Episode:
    batch_size: int
    num_same: int
    deltas: tuple[int, ...]
    sharing: tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    records: tuple[DecisionRecord, ...]
    value: float
    """Noise-free normalised-scale value of the batch the decisions formed."""
    optimal_value: float
    reward: float
    """What the policy was fed (normalised by its own RewardNormalizer)."""

    @property
    def regret(self) -> float:
        return self.optimal_value - self.value


def draw_episode(env: GroupedWorkload, rng: np.random.Generator) -> Episode:
    return Episode(
        batch_size=int(rng.integers(1, 25)),
        num_same=int(rng.integers(0, 3)),
        deltas=tuple(int(d) for d in rng.integers(1, 9, size=env.num_mismatched)),
        sharing=tuple(int(w) for w in rng.integers(0, 8, size=env.num_mismatched)),
    )


def _walk(
    env: GroupedWorkload, ep: Episode, choose: Callable[[Observation], Decision]
) -> tuple[list[DecisionRecord], float]:
    records: list[DecisionRecord] = []
    batch, depth = ep.batch_size, START_DEPTH
    value = 0.3 + 0.015 * ep.batch_size
    candidates = [(0, ep.num_same - 1 - i) for i in range(ep.num_same)]
    candidates += list(zip(ep.deltas, ep.sharing, strict=True))
    for i, (delta, sharing) in enumerate(candidates):
        obs = Observation(batch, depth, depth - delta, sharing, len(candidates) - i, 0.0)
        decision = choose(obs)
        records.append(DecisionRecord(obs, decision))
        if decision is Decision.STOP:
            break
        value += env.gain_of(obs)
        batch, depth = batch + 1, depth - delta
    return records, value


def play(
    policy: StoppingPolicy, env: GroupedWorkload, ep: Episode, rng: np.random.Generator, *, learn: bool = True
) -> Outcome:
    """One pass and its window: begin_pass, decide per candidate, then feedback. With `learn=False` the
    decisions come from the policy's `greedy` rule (its `decide` if it has none) and nothing is fed back."""
    policy.begin_pass()
    choose = policy.decide if learn else getattr(policy, "greedy", policy.decide)
    records, value = _walk(env, ep, choose)
    _, optimal_value = _walk(env, ep, env.optimal)
    reward = float("nan")
    if learn:
        noisy = max(0.0, value + env.noise * float(rng.standard_normal()))
        reward = policy.feedback(records, env.peak_tps * noisy)
    return Outcome(tuple(records), value, optimal_value, reward)


@dataclass(frozen=True)
class Training:
    regrets: np.ndarray
    """Per-episode regret against the optimal rule, in episode order."""
    optimal_share: np.ndarray
    """Per-episode share of learnable decisions (not forced) that matched the optimal rule; NaN if none."""


def train(policy: StoppingPolicy, env: GroupedWorkload, num_episodes: int, seed: int) -> Training:
    """Play `num_episodes` learning episodes drawn from `seed`."""
    rng = np.random.default_rng(seed)
    regrets = np.empty(num_episodes)
    share = np.full(num_episodes, np.nan)
    for i in range(num_episodes):
        outcome = play(policy, env, draw_episode(env, rng), rng)
        regrets[i] = outcome.regret
        learnable = [r for r in outcome.records if not is_forced(r.observation)]
        if learnable:
            share[i] = sum(r.decision is env.optimal(r.observation) for r in learnable) / len(learnable)
    return Training(regrets, share)


def greedy_score(
    policy: StoppingPolicy, env: GroupedWorkload, num_episodes: int, seed: int
) -> tuple[float, float]:
    """(share of learnable decisions matching the optimum, mean regret per episode) of the policy's greedy
    rule on fresh episodes, without learning."""
    rng = np.random.default_rng(seed)
    matches = total = 0
    regret = 0.0
    for _ in range(num_episodes):
        outcome = play(policy, env, draw_episode(env, rng), rng, learn=False)
        regret += outcome.regret
        for record in outcome.records:
            if not is_forced(record.observation):
                total += 1
                matches += record.decision is env.optimal(record.observation)
    return matches / max(total, 1), regret / num_episodes
