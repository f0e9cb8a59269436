"""What the admission component hands back: picks, proposals, a pass's plan, running totals."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sglang_feather.cht import Candidate
from sglang_feather.policy.base import Decision, Observation
from sglang_feather.types import RequestId


@dataclass(frozen=True)
class Pick:
    """The request the admission offers next, before the stopper is asked."""

    candidate: Candidate
    is_aged: bool
    """The aging guard chose it: it is admitted whatever the stopper would say."""
    is_deferred: bool = False
    """Running requests share chunks with it that the engine's cache does not hold yet (page-rounded): their
    prefill is still computing that prefix, so admitting it now would compute the prefix twice. Only a pick
    the engine named (`Admission.pick_request`) can be deferred; the admission's own picks skip such
    requests."""

    @property
    def request_id(self) -> RequestId:
        return self.candidate.request_id


@dataclass(frozen=True)
class Proposal:
    candidate: Candidate
    observation: Observation | None
    """What the stopper was shown; None for a blind stopper (`StoppingPolicy.blind_decision`), which is
    shown nothing."""
    decision: Decision
    is_aged: bool
    """The aging guard chose this request; the stopper was not asked."""
    is_deferred: bool = False
    """A deferred pick (see `Pick.is_deferred`): the stopper was not asked; the engine skips it for this pass
    (`Admission.skip`)."""
    is_held_back: bool = False
    """The concentration rule held it back (it locks a new prefix while the KV pool binds): the stopper was not
    asked; the engine passes over it for this pass (`Admission.hold_back`) and the pass goes on."""

    @property
    def request_id(self) -> RequestId:
        return self.candidate.request_id


class StopReason(enum.Enum):
    STOPPER = "stopper"
    """The stopping policy said stop (with the new-groups stop scope: it closed the pass to new prefix groups,
    and no request of a running group was left to admit)."""
    EMPTY = "empty"
    """No request is waiting."""
    LIMIT = "limit"
    """The caller's request limit for this pass was reached."""
    BUDGET = "budget"
    """The engine could not fit the candidate (tokens, KV memory, slots)."""


@dataclass(frozen=True)
class AdmissionPlan:
    admitted: tuple[RequestId, ...]
    stop: StopReason


@dataclass
class AdmissionStats:
    """Running totals for metrics; never read by the admission logic itself."""

    num_admitted: int = 0
    num_aged: int = 0
    num_consults: int = 0
    """Candidates on which the stopper had a choice: not aged, not deferred, and not forced (an empty batch, or
    a candidate whose prefix group runs and that cuts no shared prefix; `policy.context.is_forced`)."""
    num_group_consults: int = 0
    """The consults on candidates that add a prefix group to the running batch."""
    num_stops: int = 0
    num_held_back: int = 0
    """Candidates that add a prefix group skipped, without asking the stopper, after a STOP closed the pass to
    new groups (stop scope `new-groups`)."""
    num_concentrated: int = 0
    """Candidates the concentration rule held back for a pass (they lock a new prefix while the pool binds)."""
    num_withdrawn: int = 0
    num_deferred: int = 0
    num_cache_events: int = 0
    num_windows: int = 0
    sum_delta: int = 0
    last_reward: float | None = None
    sum_reward: float = 0.0
    """Of the normalised rewards of every window (`num_windows`): their mean is this over `num_windows`."""
