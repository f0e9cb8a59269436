"""Engine-agnostic admission: which waiting requests join the batch, and the stopper's reward bookkeeping."""

from __future__ import annotations

import enum
import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from sglang_feather.cht import DEFAULT_CHUNK_SIZE, Candidate, ChunkedHashTree, RequestState
from sglang_feather.policy import DEFAULT_MAX_WAIT_S, AgingGuard, make_policy, policy_names
from sglang_feather.policy.base import Decision, DecisionRecord, Observation, StoppingPolicy
from sglang_feather.policy.persist import load_state, save_state
from sglang_feather.types import ChunkHash, RequestId

logger = logging.getLogger(__name__)

# How it works.
#
# An engine runs one scheduling pass at a time. It calls `begin_pass()`, then asks `propose(batch_size)`
# for the next candidate: normally the CHT's best waiting request (fewest chunks missing from the running
# batch), but the oldest waiting request instead once it has waited past the aging bound. The stopper sees
# an `Observation` (batch size, shared-prefix depth before/after, w, queue length, wait) and says ADD or STOP.
# The engine then either `accept`s (the request joins: its chunks enter the CHT's working set), `decline`s
# (the stopper's STOP ends the pass) or `withdraw`s (the engine's own budget refused it; nothing is learned).
# Every ADD/STOP the stopper made is kept until the engine closes the batch window with `end_window(tokens,
# seconds)`: the window's decode throughput, normalised, is the reward for all of them. Request lifecycle
# events (`finish`, `abort`, `retract`, `requeue`) keep the CHT equal to the engine's own queues.


DEFAULT_STOPPER = "ucb"
"""The learning bandit: it converges to the optimal stop rule on the synthetic benchmarks (docs/policy.md)."""


class ConfigError(ValueError):
    """A Feather option is invalid; the message names the option and the accepted values."""


@dataclass(frozen=True)
class AdmissionConfig:
    chunk_size: int = DEFAULT_CHUNK_SIZE
    """Tokens per CHT chunk (an adapter may force it to the engine's block size)."""
    stopper: str = DEFAULT_STOPPER
    """Name of a registered stopping policy (`sglang_feather.policy.policy_names()`)."""
    stopper_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options for the stopper's factory."""
    max_wait_s: float | None = DEFAULT_MAX_WAIT_S
    """Aging bound in seconds (see `sglang_feather.policy.aging`); None disables the guard."""
    state_path: str | None = None
    """JSON file that keeps a learning stopper's state across restarts; None keeps it in memory only."""
    seed: int = 0
    defer_uncached_prefix: bool = True
    """Stop a pass rather than admit a request whose shared chunks only this pass's admissions hold (their
    prefill has not cached them yet, so the prefix would be computed twice); see `Proposal.is_deferred`."""

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be a positive integer, got {self.chunk_size!r}")
        if self.stopper not in policy_names():
            raise ConfigError(f"unknown stopper {self.stopper!r}; choose one of {sorted(policy_names())}")
        if self.max_wait_s is not None and not self.max_wait_s > 0:
            raise ConfigError(f"max_wait_s must be > 0 seconds or None, got {self.max_wait_s!r}")
        object.__setattr__(self, "stopper_options", MappingProxyType(dict(self.stopper_options)))


class StopReason(enum.Enum):
    STOPPER = "stopper"
    """The stopping policy said stop."""
    EMPTY = "empty"
    """No request is waiting."""
    LIMIT = "limit"
    """The caller's request limit for this pass was reached."""
    BUDGET = "budget"
    """The engine could not fit the candidate (tokens, KV memory, slots)."""


@dataclass(frozen=True)
class Proposal:
    candidate: Candidate
    observation: Observation
    decision: Decision
    is_aged: bool
    """The aging guard chose this request; the stopper was not asked."""
    is_deferred: bool = False
    """The chunks it would share are held only by requests admitted in this same pass, whose prefill has not
    cached them yet: admitting it now would compute that prefix twice, so the pass stops here (the
    stopper was not asked). SGLang's in-batch prefix check defers such requests the same way."""

    @property
    def request_id(self) -> RequestId:
        return self.candidate.request_id


@dataclass(frozen=True)
class AdmissionPlan:
    admitted: tuple[RequestId, ...]
    stop: StopReason


@dataclass
class AdmissionStats:
    """Running totals for metrics; never read by the admission logic itself."""

    num_admitted: int = 0
    num_aged: int = 0
    num_stops: int = 0
    num_withdrawn: int = 0
    num_deferred: int = 0
    num_windows: int = 0
    sum_delta: int = 0
    last_reward: float | None = None


class Admission:
    """The CHT, a stopper and the aging guard behind one event API shared by every engine adapter."""

    def __init__(
        self,
        tree: ChunkedHashTree,
        stopper: StoppingPolicy,
        guard: AgingGuard,
        clock: Callable[[], float] = time.monotonic,
        state_path: str | None = None,
        defer_uncached_prefix: bool = True,
    ):
        self.tree = tree
        self.stopper = stopper
        self.guard = guard
        self.clock = clock
        self.stats = AdmissionStats()
        self._state_path = state_path
        self._arrivals: dict[RequestId, float] = {}
        self._records: list[DecisionRecord] = []
        self._pass_admitted: list[RequestId] = []
        self._defer_uncached_prefix = defer_uncached_prefix
        if state_path is not None:
            load_state(stopper, state_path)

    @classmethod
    def from_config(cls, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic) -> Admission:
        try:
            stopper = make_policy(config.stopper, seed=config.seed, **config.stopper_options)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"stopper {config.stopper!r}: {err}") from None
        return cls(
            ChunkedHashTree(config.chunk_size),
            stopper,
            AgingGuard(config.max_wait_s),
            clock=clock,
            state_path=config.state_path,
            defer_uncached_prefix=config.defer_uncached_prefix,
        )

    # ----------------------------------------------------------------- request lifecycle

    def enqueue(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray | None = None,
        *,
        hashes: Sequence[ChunkHash] | None = None,
        namespace: str | None = None,
        arrival: float | None = None,
    ) -> int:
        """A request starts waiting (give token ids, or the engine's own cumulative hashes); returns chunks.

        `arrival` (on this admission's clock) defaults to now; pass the original time when re-enqueueing."""
        return self._insert(
            request_id, token_ids, hashes, namespace, self.clock() if arrival is None else arrival
        )

    def requeue(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray | None = None,
        *,
        hashes: Sequence[ChunkHash] | None = None,
        namespace: str | None = None,
    ) -> int:
        """A known request waits again with a new prompt (it grew); it keeps its original arrival time."""
        arrival = self._arrivals.get(request_id, self.clock())
        self.tree.discard(request_id)
        self._arrivals.pop(request_id, None)
        return self._insert(request_id, token_ids, hashes, namespace, arrival)

    def _insert(self, request_id, token_ids, hashes, namespace, arrival: float) -> int:
        if (token_ids is None) == (hashes is None):
            raise ValueError("give exactly one of token_ids and hashes")
        if hashes is None:
            num_chunks = self.tree.insert(request_id, token_ids, namespace=namespace, arrival=arrival)
        else:
            num_chunks = self.tree.insert_hashes(request_id, hashes, arrival=arrival)
        self._arrivals[request_id] = arrival
        return num_chunks

    def activate(self, request_id: RequestId) -> None:
        """The engine put a waiting request into the batch without a proposal (e.g. found it running while
        reconciling); no decision is recorded."""
        self.tree.activate(request_id)

    def retract(self, request_id: RequestId) -> None:
        """A running request is pushed back to waiting (KV exhausted, preemption)."""
        self.tree.deactivate(request_id)

    def finish(self, request_id: RequestId) -> None:
        """A running request completed."""
        self.tree.finish(request_id)
        del self._arrivals[request_id]

    def abort(self, request_id: RequestId) -> bool:
        """A request left in whatever state it was; False if Feather did not know it."""
        self._arrivals.pop(request_id, None)
        return self.tree.discard(request_id)

    def wait_s(self, request_id: RequestId) -> float:
        return self.clock() - self._arrivals[request_id]

    def sort_key(self, request_id: RequestId) -> tuple:
        """A waiting request's place in a best-first queue, in the order `propose()` would take requests
        against the current batch: starved ones first (oldest first), then fewest missing chunks, then
        earliest arrival. For engines that sort their own queue list."""
        arrival = self._arrivals[request_id]
        if self.guard.is_starved(self.clock() - arrival):
            return (0, 0, arrival)
        return (1, self.tree.num_missing(request_id), arrival)

    # ----------------------------------------------------------------- one scheduling pass

    def begin_pass(self) -> None:
        """A new scheduling pass starts (stoppers with per-pass state reset it)."""
        self.stopper.begin_pass()
        self._pass_admitted.clear()

    def propose(
        self,
        batch_size: int,
        request_id: RequestId | None = None,
        cached_tokens: Callable[[RequestId], int] | None = None,
    ) -> Proposal | None:
        """The next request to admit and the stopper's verdict; None when nothing waits.

        Engines that walk their own sorted queue name the request they are at (`request_id`); it is still
        admitted regardless of the stopper once it has waited past the aging bound. `cached_tokens(rid)`, when
        the engine knows it, is the prompt prefix its KV cache already holds: a cached prefix is never deferred."""
        if request_id is not None:
            aged = self.guard.is_starved(self.wait_s(request_id))
            return self._proposal(self.tree.candidate(request_id), batch_size, aged, cached_tokens)
        oldest = self.tree.oldest()
        if oldest is None:
            return None
        if self.guard.is_starved(self.wait_s(oldest)):
            return self._proposal(self.tree.candidate(oldest), batch_size, True, cached_tokens)
        return self._proposal(self.tree.best(), batch_size, False, cached_tokens)

    def _proposal(
        self,
        candidate: Candidate,
        batch_size: int,
        is_aged: bool,
        cached_tokens: Callable[[RequestId], int] | None,
    ) -> Proposal:
        observation = Observation(
            batch_size=batch_size,
            depth_before=candidate.depth_before,
            depth_after=candidate.depth_after,
            num_sharing=candidate.num_sharing,
            num_waiting=self.tree.num_waiting,
            wait_s=self.wait_s(candidate.request_id),
        )
        if is_aged:
            return Proposal(candidate, observation, Decision.ADD, is_aged=True)
        if self._shares_only_this_pass(candidate, cached_tokens):
            return Proposal(candidate, observation, Decision.STOP, is_aged=False, is_deferred=True)
        return Proposal(candidate, observation, self.stopper.decide(observation), is_aged=False)

    def _shares_only_this_pass(
        self, candidate: Candidate, cached_tokens: Callable[[RequestId], int] | None
    ) -> bool:
        """The candidate's covered chunks are held only by requests admitted in this pass, and the engine's
        cache does not hold them already."""
        covered = candidate.num_chunks - candidate.num_missing
        if covered == 0 or not self._pass_admitted or not self._defer_uncached_prefix:
            return False
        if (
            cached_tokens is not None
            and cached_tokens(candidate.request_id) >= covered * self.tree.chunk_size
        ):
            return False
        rid, tree = candidate.request_id, self.tree
        fresh = sum(
            tree.state(other) is RequestState.ACTIVE and tree.shares_prefix(rid, other, covered)
            for other in self._pass_admitted
        )
        return self.tree.num_holding(rid, covered) == fresh

    def accept(self, proposal: Proposal) -> None:
        """The engine admitted the proposed request."""
        self.tree.activate(proposal.request_id)
        self._pass_admitted.append(proposal.request_id)
        self.stats.num_admitted += 1
        self.stats.sum_delta += proposal.candidate.delta
        if proposal.is_aged:
            self.stats.num_aged += 1
        else:
            self._records.append(DecisionRecord(proposal.observation, Decision.ADD))

    def decline(self, proposal: Proposal) -> None:
        """A STOP ends this pass; the stopper's own decisions await the window's reward."""
        if proposal.is_deferred:
            self.stats.num_deferred += 1
            return
        self.stats.num_stops += 1
        self._records.append(DecisionRecord(proposal.observation, Decision.STOP))

    def withdraw(self, proposal: Proposal) -> None:
        """The engine's own budget refused a request the stopper would have added: nothing is learned."""
        self.stats.num_withdrawn += 1

    def select(
        self,
        batch_size: int,
        max_requests: int | None = None,
        fits: Callable[[RequestId], bool] | None = None,
        cached_tokens: Callable[[RequestId], int] | None = None,
    ) -> AdmissionPlan:
        """A whole pass: admit requests until the stopper, the engine's `fits` check or `max_requests` says no
        (`cached_tokens` as for `propose`)."""
        self.begin_pass()
        admitted: list[RequestId] = []
        while True:
            if max_requests is not None and len(admitted) >= max_requests:
                return AdmissionPlan(tuple(admitted), StopReason.LIMIT)
            proposal = self.propose(batch_size + len(admitted), cached_tokens=cached_tokens)
            if proposal is None:
                return AdmissionPlan(tuple(admitted), StopReason.EMPTY)
            if proposal.decision is Decision.STOP:
                self.decline(proposal)
                return AdmissionPlan(tuple(admitted), StopReason.STOPPER)
            if fits is not None and not fits(proposal.request_id):
                self.withdraw(proposal)
                return AdmissionPlan(tuple(admitted), StopReason.BUDGET)
            self.accept(proposal)
            admitted.append(proposal.request_id)

    # ----------------------------------------------------------------- learning

    def end_window(self, num_tokens: int, elapsed_s: float) -> float | None:
        """Close a batch window: its decode throughput becomes the reward of the decisions made since the last
        window (a window without decisions still updates the reward's normalisation). Returns the normalised
        reward, or None for an empty window (no tokens or no time)."""
        if elapsed_s <= 0 or num_tokens <= 0:
            return None
        records, self._records = self._records, []
        reward = self.stopper.feedback(records, num_tokens / elapsed_s)
        self.stats.num_windows += 1
        self.stats.last_reward = reward
        return reward

    def save_state(self) -> None:
        """Persist the learned stopper (atomic); a no-op without a state path."""
        if self._state_path is not None:
            save_state(self.stopper, self._state_path)

    # ----------------------------------------------------------------- views for adapters

    def is_waiting(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.WAITING

    def is_active(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.ACTIVE
