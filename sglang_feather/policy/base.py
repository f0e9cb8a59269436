"""The stopping-policy interface: observe a candidate, decide add or stop, learn from the window's reward."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sglang_feather.policy.reward import RewardNormalizer


class Decision(enum.Enum):
    ADD = "add"
    STOP = "stop"


@dataclass(frozen=True)
class Observation:
    """What a stopper sees about the next candidate, all prefix depths in chunks.

    `depth_before` is the shared-prefix depth of the batch as it is (the chunks every running request holds);
    `depth_after` is that depth once the candidate joins. An empty batch has nothing to lose:
    `depth_before == depth_after == ` the candidate's own chunk count. Invalid numbers raise ValueError.
    """

    batch_size: int
    """Requests already in the batch (running plus admitted earlier in this pass)."""
    depth_before: int
    depth_after: int
    num_sharing: int
    """`w`: waiting requests (candidate excluded) that hold the batch's new shared prefix; 0 at depth 0."""
    num_waiting: int
    """Waiting requests, candidate included."""
    wait_s: float
    """How long the candidate has waited, in seconds."""

    def __post_init__(self) -> None:
        counts = ("batch_size", "depth_before", "depth_after", "num_sharing", "num_waiting")
        bad = [f"{name}={getattr(self, name)!r}" for name in counts if getattr(self, name) < 0]
        if bad:
            raise ValueError(f"Observation counts must be >= 0, got {', '.join(bad)}")
        if self.depth_after > self.depth_before:
            raise ValueError(
                f"Observation depth_after={self.depth_after} exceeds depth_before={self.depth_before}: "
                "adding a request can only keep or shorten the shared prefix"
            )
        if not (math.isfinite(self.wait_s) and self.wait_s >= 0):
            raise ValueError(f"Observation wait_s must be finite and >= 0, got {self.wait_s!r}")

    @property
    def delta(self) -> int:
        """Shared-prefix depth lost by adding the candidate (Δ = before − after, never negative)."""
        return self.depth_before - self.depth_after


@dataclass(frozen=True)
class DecisionRecord:
    """One decision of a scheduling pass, kept until the reward of its batch window arrives."""

    observation: Observation
    decision: Decision


@runtime_checkable
class StoppingPolicy(Protocol):
    """Decides, candidate by candidate, whether a growing batch takes one more request.

    Call order per scheduling pass: `begin_pass()`, then `decide(obs)` for each candidate until it returns
    STOP or the candidates run out; after the batch window that pass formed, `feedback(records, throughput)`
    with that pass's decisions in order and the window's decode throughput in tokens/s. Every policy
    normalises the throughput with its own `RewardNormalizer` (part of `state_dict`) and returns the
    normalised reward; learning policies credit it to the decisions of the window (see each policy).
    """

    name: str

    def begin_pass(self) -> None:
        """A new scheduling pass starts (per-pass counters reset); learning state is untouched."""
        return None

    def decide(self, obs: Observation) -> Decision: ...

    def feedback(self, records: Sequence[DecisionRecord], throughput: float) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PolicyBase(StoppingPolicy):
    """Shared plumbing: owns the `RewardNormalizer`, routes rewards to `learn`, persists both.

    Subclasses override `learn`, `learned_state` and `parse_learned_state` (which must validate everything
    and mutate nothing, so that a bad saved state leaves the policy fresh).
    """

    name = "base"

    def __init__(self, normalizer: RewardNormalizer | None = None) -> None:
        self.normalizer = normalizer if normalizer is not None else RewardNormalizer()

    def feedback(self, records: Sequence[DecisionRecord], throughput: float) -> float:
        reward = self.normalizer.update(throughput)
        self.learn(records, reward)
        return reward

    def learn(self, records: Sequence[DecisionRecord], reward: float) -> None:
        """Use the normalised reward of one window; policies that do not learn ignore it."""
        return None

    def learned_state(self) -> dict[str, Any]:
        return {}

    def parse_learned_state(self, state: dict[str, Any]) -> Callable[[], None]:
        """Validate `state` (as written by `learned_state`) and return a closure that installs it."""
        return lambda: None

    def state_dict(self) -> dict[str, Any]:
        return {"normalizer": self.normalizer.state_dict(), **self.learned_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        normalizer = RewardNormalizer(self.normalizer.decay)
        normalizer.load_state_dict(state["normalizer"])
        install = self.parse_learned_state(state)
        self.normalizer = normalizer
        install()


def save_policy(policy: StoppingPolicy, path: str | Path) -> None:
    """Persist `policy.state_dict()` (implemented in `sglang_feather.policy.persist`)."""
    from sglang_feather.policy.persist import save_state

    save_state(policy, path)


def load_policy(policy: StoppingPolicy, path: str | Path) -> bool:
    """Load saved state into `policy`; False (and a warning) when the file is missing, corrupt or stale."""
    from sglang_feather.policy.persist import load_state

    return load_state(policy, path)
