"""The stopping-policy interface: observe a candidate, decide add or stop, learn from the window's reward."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class Decision(enum.Enum):
    ADD = "add"
    STOP = "stop"


@dataclass(frozen=True)
class Observation:
    """What a stopper sees about the next candidate, all prefix depths in chunks.

    `depth_before` is the shared-prefix depth of the batch as it is (the chunks every running request holds);
    `depth_after` is that depth once the candidate joins. An empty batch has nothing to lose:
    `depth_before == depth_after == ` the candidate's own chunk count.
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

    @property
    def delta(self) -> int:
        """Shared-prefix depth lost by adding the candidate (Δ = before − after, never negative)."""
        return self.depth_before - self.depth_after


@dataclass(frozen=True)
class DecisionRecord:
    """One decision a learning policy made, kept until the reward of its batch window arrives."""

    observation: Observation
    decision: Decision


@runtime_checkable
class StoppingPolicy(Protocol):
    """Decides, candidate by candidate, whether a growing batch takes one more request.

    Contract: `decide` must not mutate learning state that `feedback` relies on in a way that breaks
    determinism for a given seed; `feedback` gets every decision of one finished batch window (in order)
    with that window's normalised reward (see `sglang_feather.policy.reward`). Policies that do not learn
    ignore `feedback` and keep an empty state.
    """

    name: str

    def decide(self, obs: Observation) -> Decision: ...

    def feedback(self, records: list[DecisionRecord], reward: float) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def save_policy(policy: StoppingPolicy, path: str | Path) -> None:
    """Persist `policy.state_dict()` (implemented in `sglang_feather.policy.persist`)."""
    from sglang_feather.policy.persist import save_state

    save_state(policy, path)


def load_policy(policy: StoppingPolicy, path: str | Path) -> bool:
    """Load saved state into `policy`; False (and a warning) when the file is missing, corrupt or stale."""
    from sglang_feather.policy.persist import load_state

    return load_state(policy, path)
