"""`qlearn`: tabular Q-learning over the bandit's contexts, with the pass as the episode."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sglang_feather.policy.base import Decision, DecisionRecord, Observation, PolicyBase
from sglang_feather.policy.context import Context, context_of, is_forced
from sglang_feather.policy.tables import ARM_INDEX, ARMS, dump_table, load_counts, load_values


@dataclass(frozen=True)
class QLearnConfig:
    discount: float = 1.0
    """γ per decision. 1: the window reward is a property of the final batch, not of how many steps formed
    it, so discounting would bias every pass towards stopping early. Passes are finite, so Q stays bounded."""
    trace: float = 1.0
    """λ of the off-policy-corrected return (Q*(λ)): target_t = γ·(max_a Q(s', a) + λ·(G_{t+1} − Q(s', a'))).
    λ = 0 is one-step Q-learning; λ = 1 (default) is the window reward corrected by the Q-gap of every later
    non-greedy decision, which stays unbiased although the coarse contexts are not Markov (a context does
    not tell how much throughput the running batch already banks); see docs/policy.md."""
    learning_rate_min: float = 0.05
    """α = max(1 / n(s, a), this): sample averages at first, then a constant step that tracks drift."""
    epsilon_start: float = 0.3
    epsilon_decay_visits: float = 20.0
    """ε(s) = max(epsilon_min, epsilon_start · τ / (τ + n(s))) with τ this and n(s) the updates of s."""
    epsilon_min: float = 0.01
    initial_q: float = 1.0
    """Optimistic start at the top of the normalised reward range, so both actions get tried."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value)):
                raise ValueError(f"qlearn option {f.name} must be a finite number, got {value!r}")
        for name in ("discount", "trace", "learning_rate_min", "epsilon_start", "epsilon_min"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"qlearn option {name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.epsilon_decay_visits <= 0:
            raise ValueError(
                f"qlearn option epsilon_decay_visits must be > 0, got {self.epsilon_decay_visits}"
            )


def split_passes(records: Sequence[DecisionRecord]) -> list[list[DecisionRecord]]:
    """Cut a window's records into passes: a pass ends at a STOP, or where the next record's batch is not
    exactly one larger (after an ADD, the next candidate of the same pass always sees batch_size + 1)."""
    passes: list[list[DecisionRecord]] = []
    for record in records:
        if passes:
            prev = passes[-1][-1]
            same_pass = (
                prev.decision is Decision.ADD
                and record.observation.batch_size == prev.observation.batch_size + 1
            )
            if same_pass:
                passes[-1].append(record)
                continue
        passes.append([record])
    return passes


class QLearnPolicy(PolicyBase):
    """State = context (`context_of`: the authors' buckets, plus a new-group candidate's costs) at a decision
    point; actions ADD and STOP.

    Transition: ADD leads to the next decision point of the same pass (forced admissions in between are
    part of the environment) or, if the pass ends first, to the terminal state; STOP is terminal. The
    only reward is the window's normalised throughput, paid on reaching the terminal state. When that
    reward arrives, each pass is swept backwards with Q*(λ) targets (see `QLearnConfig.trace`): with the
    defaults γ = λ = 1 a decision's target is the window's reward (the authors' crediting) plus the Q-gap
    of every later non-greedy decision, so ADD is valued by the greedy continuation, not the exploring
    one. ε-greedy with a per-state decaying ε, ties to ADD; all randomness comes from `seed`.
    """

    name = "qlearn"

    def __init__(self, config: QLearnConfig | None = None, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config if config is not None else QLearnConfig()
        self.rng = np.random.default_rng(seed)
        self.q: dict[Context, list[float]] = {}
        self.visits: dict[Context, list[int]] = {}

    def epsilon(self, ctx: Context) -> float:
        cfg = self.config
        n = sum(self.visits.get(ctx, (0, 0)))
        tau = cfg.epsilon_decay_visits
        return max(cfg.epsilon_min, cfg.epsilon_start * tau / (tau + n))

    def decide(self, obs: Observation) -> Decision:
        if is_forced(obs):
            return Decision.ADD
        ctx = context_of(obs)
        if self.rng.random() < self.epsilon(ctx):
            return ARMS[int(self.rng.integers(2))]
        return self._best(ctx)

    def greedy(self, obs: Observation) -> Decision:
        """The action with the highest Q (ADD on ties): the learned rule without exploration."""
        return Decision.ADD if is_forced(obs) else self._best(context_of(obs))

    def _best(self, ctx: Context) -> Decision:
        q = self.q.get(ctx)
        return Decision.STOP if q is not None and q[1] > q[0] else Decision.ADD

    def learn(self, records: Sequence[DecisionRecord], reward: float) -> None:
        cfg = self.config
        for one_pass in split_passes(records):
            points = [
                (context_of(r.observation), ARM_INDEX[r.decision])
                for r in one_pass
                if not is_forced(r.observation)
            ]
            targets: list[float] = []
            later: tuple[float, list[float], int] | None = None
            for ctx, arm in reversed(points):
                if later is None:
                    target = reward
                else:
                    later_target, later_q, later_arm = later
                    target = cfg.discount * (max(later_q) + cfg.trace * (later_target - later_q[later_arm]))
                targets.append(target)
                later = (target, list(self.q.get(ctx, (cfg.initial_q, cfg.initial_q))), arm)
            for (ctx, arm), target in zip(reversed(points), targets, strict=True):
                q = self.q.setdefault(ctx, [cfg.initial_q, cfg.initial_q])
                visits = self.visits.setdefault(ctx, [0, 0])
                visits[arm] += 1
                q[arm] += max(1.0 / visits[arm], cfg.learning_rate_min) * (target - q[arm])

    def learned_state(self) -> dict[str, Any]:
        return {
            "q": dump_table(self.q),
            "visits": dump_table(self.visits),
            "rng": self.rng.bit_generator.state,
        }

    def parse_learned_state(self, state: dict[str, Any]) -> Callable[[], None]:
        q = load_values(state["q"])
        visits = load_counts(state["visits"])
        if q.keys() != visits.keys():
            raise ValueError("qlearn state: q and visits cover different contexts")
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"qlearn state: bad rng state ({exc})") from exc

        def install() -> None:
            self.q, self.visits, self.rng = q, visits, rng

        return install
