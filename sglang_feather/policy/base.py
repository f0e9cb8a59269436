"""The stopping-policy interface: observe a candidate, decide add or stop, learn from the window's reward."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sglang_feather.policy.reward import RewardNormalizer
from sglang_feather.policy.steps import StepSample


class Decision(enum.Enum):
    ADD = "add"
    STOP = "stop"


@dataclass(frozen=True)
class Observation:
    """What a stopper sees about the next candidate, all prefix depths and KV sizes in chunks.

    `depth_before` is the shared-prefix depth of the batch as it is (the chunks every running request holds);
    `depth_after` is that depth once the candidate joins. An empty batch has nothing to lose:
    `depth_before == depth_after == ` the candidate's own chunk count. The fields after `wait_s` describe
    what admitting the candidate costs under continuous batching (docs/policy.md, "When the stopper is
    consulted"); their defaults describe a candidate whose prefix group already runs, with nothing else
    known. Invalid numbers raise ValueError.
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
    adds_group: bool = False
    """The candidate's prefix group (its first chunk) is not in the running batch: admitting it adds a
    prefix that every decode step reads on its behalf alone until more of its group join."""
    num_groups_running: int = 0
    """Distinct prefix groups (first chunks) among the running requests and this pass's admissions."""
    num_running_chunks: int = 0
    """Distinct chunks the running requests hold: the KV one decode step reads with perfect sharing."""
    num_new_chunks: int = 0
    """Chunks of the candidate that no running request holds: what it adds to that per-step read."""
    num_missing: int = 0
    """Chunks neither a running request nor the engine's cache holds: the KV its prefill computes and
    allocates (taking room from cached prefixes when the pool is full)."""
    num_group_waiting: int = 0
    """Other waiting requests of the candidate's prefix group (its first chunk): who would share the
    prefix it brings."""
    oldest_wait_s: float = 0.0
    """How long the oldest waiting request has waited, in seconds."""
    kv_free_fraction: float | None = None
    """Share of the engine's KV pool it can still give to new requests (free plus evictable, less what
    running requests are promised), in [0, 1]; None where the engine did not say."""
    num_read_chunks: int = 0
    """The running requests' chunks, each request's counted: the KV one decode step reads with no sharing."""
    num_chunks: int = 0
    """The candidate's own prompt chunks: what it adds to that per-request read."""

    def __post_init__(self) -> None:
        counts = (
            "batch_size",
            "depth_before",
            "depth_after",
            "num_sharing",
            "num_waiting",
            "num_groups_running",
            "num_running_chunks",
            "num_new_chunks",
            "num_missing",
            "num_group_waiting",
            "num_read_chunks",
            "num_chunks",
        )
        bad = [f"{name}={getattr(self, name)!r}" for name in counts if getattr(self, name) < 0]
        if bad:
            raise ValueError(f"Observation counts must be >= 0, got {', '.join(bad)}")
        if self.depth_after > self.depth_before:
            raise ValueError(
                f"Observation depth_after={self.depth_after} exceeds depth_before={self.depth_before}: "
                "adding a request can only keep or shorten the shared prefix"
            )
        for name in ("wait_s", "oldest_wait_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Observation {name} must be finite and >= 0, got {value!r}")
        room = self.kv_free_fraction
        if room is not None and not (math.isfinite(room) and 0 <= room <= 1):
            raise ValueError(f"Observation kv_free_fraction must be in [0, 1] or None, got {room!r}")

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
    normalised reward; learning policies credit it to the decisions of the window (see each policy). A
    stopper with `observes_steps` is also shown every decode step (`observe_step`) as the engine reports it.
    """

    name: str
    blind_decision: Decision | None = None
    """The decision of a stopper that never looks at its `Observation` and never learns (`always`: ADD);
    the admission then builds no observation and records nothing for it. None: `decide` is asked."""
    observes_steps: bool = False
    """The admission shows this stopper every decode step (`observe_step`); False: it builds no sample."""

    def begin_pass(self) -> None:
        """A new scheduling pass starts (per-pass counters reset); learning state is untouched."""
        return None

    def decide(self, obs: Observation) -> Decision: ...

    def observe_step(self, step: StepSample) -> None:
        """One decode step finished (only called when `observes_steps`); learning state may change."""
        return None

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
