"""Engine-agnostic admission: which waiting requests join the batch, and the stopper's reward bookkeeping."""

from __future__ import annotations

import enum
import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from sglang_feather.cht import DEFAULT_CHUNK_SIZE, Candidate, ChunkedHashTree, RequestState
from sglang_feather.options import (
    ConfigError,
    boolean,
    check_options,
    file_in_existing_dir,
    integer,
    object_of_names,
    option,
    parse_int,
    parse_json_object,
    parse_on_off,
    parse_path_or_none,
    parse_seconds_or_none,
    positive_int,
    seconds_or_none,
)
from sglang_feather.policy import DEFAULT_MAX_WAIT_S, AgingGuard, make_policy, policy_names
from sglang_feather.policy.base import Decision, DecisionRecord, Observation, StoppingPolicy
from sglang_feather.policy.context import is_forced
from sglang_feather.policy.persist import load_state, save_state
from sglang_feather.types import ChunkHash, RequestId

logger = logging.getLogger(__name__)

# How it works.
#
# An engine runs one scheduling pass at a time: `begin_pass()`, then `propose(batch_size)` for each next
# candidate, then `end_pass()`. A candidate is normally the CHT's best waiting request (requests whose prompt
# running requests or the engine's cache hold first, deepest covered prefix first, then the heaviest group,
# then arrival; requests with nothing covered in arrival order), but once the oldest waiting request is due
# (the aging guard) one due request per pass goes first. A candidate whose shared chunks the engine's prefix
# cache does not hold yet (page-rounded; the cache tier answers when the adapter feeds cache events) is
# *deferred*: a running request sharing them is still computing that prefix (a prefill in flight, possibly
# split by chunked prefill), so admitting the candidate now would compute it twice. It is suspended in the CHT
# for the rest of the pass and the pass goes on with the next candidate; `end_pass()` puts it back. An aged
# request is never deferred, and nothing is deferred when no running request shares it. Without cache events,
# asking the engine's cache costs a prefix match per candidate, and a cold group's followers are skipped one
# after another, so the answer is reused within the pass: a request
# whose cache hit stops at C tokens inside its chunk d (not its last chunk) tells that every request sharing
# its first d chunks hits exactly C too (same tokens up to the uncached page, and more prompt after it), until
# the next admission may change the cache (`_CacheFrontier`). For any other candidate the stopper sees an
# `Observation` (batch size, shared-prefix depth before/after, w, queue length, wait) and says ADD or STOP;
# the engine `accept`s (the request's chunks enter the working set), `decline`s (STOP ends the pass) or
# `withdraw`s (its own budget refused; nothing is learned). Reward window: the first stopper decision of a pass closes
# the open window, whose decode throughput rewards every decision made in it, and opens the next;
# `on_batch_drained()` closes it without opening one, so idle time never dilutes a reward. Decode throughput
# is tokens of decode-only steps (`on_decode_step`) over the time those steps took: a step that computed
# prompt tokens (`on_prefill_step`) counts neither tokens nor time. The prefill is work that STOP does not
# avoid (the stopped request waits and is prefilled in a later pass), so charging it to the window that
# admitted it would make every ADD look slower than a STOP whose window is a bare decode step. Lifecycle
# events (`finish`, `abort`, `retract`, `requeue`) keep the CHT equal to the engine's queues.


@dataclass(frozen=True)
class _CacheFrontier:
    """Where the engine's cache hit of a waiting request ends: `num_cached` tokens, inside its chunk `depth`.

    Valid for every request that shares the first `depth` chunks, while the cache is unchanged: their tokens
    agree up to `depth` full chunks, the uncached page at `num_cached` lies inside them (the frontier is only
    kept when it does), and each has prompt left after them, so an engine that never matches a whole prompt
    still matches up to `num_cached`. An engine that also caps the match per request (SGLang with input
    logprobs from a start position) may see a different hit for such a request; the deferral is a one-pass
    hint, so the cost of that is at most one pass of waiting or one prefix computed twice."""

    request_id: RequestId
    depth: int
    num_cached: int


DEFAULT_STOPPER = "ucb"
"""The learning bandit: it converges to the optimal stop rule on the synthetic benchmarks (docs/policy.md)."""


@dataclass(frozen=True)
class AdmissionConfig:
    """Feather's options, declared once: SGLang's and the simulator's `--feather-*` flags and vLLM's
    `additional_config["feather"]` keys are generated from these fields (`sglang_feather.options`). The last
    two fields are not options: the engine adapter sets them."""

    chunk_size: int = option(
        DEFAULT_CHUNK_SIZE,
        metavar="TOKENS",
        help="Tokens per Chunked-Hash-Tree chunk, the unit in which shared prefix is counted",
        parse=parse_int,
        check=positive_int,
    )
    stopper: str = option(
        DEFAULT_STOPPER,
        metavar="NAME",
        help="Stopping policy that decides add-one-more vs stop",
        parse=str,
        choices=policy_names,
    )
    stopper_options: Mapping[str, Any] = option(
        default_factory=dict,
        metavar="JSON",
        help="Keyword options of the stopping policy, a JSON object, e.g. '{\"max_chunk_loss\": 3}' for static",
        parse=parse_json_object,
        check=object_of_names,
    )
    max_wait_s: float | None = option(
        DEFAULT_MAX_WAIT_S,
        metavar="SECONDS",
        help="Aging bound: a request that waited this long is admitted whatever the stopper says; none "
        "disables the guard",
        parse=parse_seconds_or_none,
        check=seconds_or_none,
    )
    state_path: str | None = option(
        None,
        metavar="FILE",
        help="JSON file keeping a learning stopper's state across restarts: loaded at start, saved while "
        "serving (tagged with engine, model and device; another tag's state is not loaded)",
        parse=parse_path_or_none,
        check=file_in_existing_dir,
    )
    seed: int = option(
        0, metavar="INT", help="Seed of a randomised stopping policy", parse=parse_int, check=integer
    )
    defer_uncached_prefix: bool = option(
        True,
        metavar="on|off",
        help="Skip, for one scheduling pass, a request whose prefix shared with running requests the engine's "
        "cache does not hold yet (an in-flight prefill is computing it), so the prefix is computed once",
        parse=parse_on_off,
        check=boolean,
    )
    page_size: int = 1
    """Tokens per KV page of the engine's cache (SGLang `page_size`, vLLM block size): the cache only holds
    whole pages, so shared and cached prefixes are compared rounded down to pages."""
    state_tag: Mapping[str, str] = field(default_factory=dict)
    """Where a learned state comes from (engine, model, device); a state file saved under another tag is not
    loaded (warning, fresh start)."""
    cache_events: bool = False
    """The adapter feeds the engine's KV-cache events (`Admission.cache_stored` / `cache_removed` /
    `cache_cleared`): the cache tier then answers what the cache holds, with no per-candidate cache match."""

    def __post_init__(self) -> None:
        check_options(self)
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {self.page_size!r}")
        if self.cache_events and self.chunk_size % self.page_size:
            raise ConfigError(
                "chunk_size",
                f"{self.chunk_size} tokens is not a whole number of the engine's {self.page_size}-token pages: "
                "cache events name pages, and a chunk is cached only when all its pages are",
            )
        try:
            make_policy(self.stopper, seed=self.seed, **self.stopper_options)
        except (TypeError, ValueError) as err:
            raise ConfigError("stopper_options", f"do not fit stopper {self.stopper!r}: {err}") from None
        if self.state_path is not None:
            object.__setattr__(self, "state_path", str(Path(self.state_path).expanduser()))
        object.__setattr__(self, "stopper_options", MappingProxyType(dict(self.stopper_options)))
        object.__setattr__(
            self, "state_tag", MappingProxyType({str(k): str(v) for k, v in self.state_tag.items()})
        )

    def __reduce__(self):
        """Pickle as plain values (SGLang sends the options to its scheduler processes); loading checks again."""
        values = (getattr(self, f.name) for f in fields(self))
        return type(self), tuple(dict(v) if isinstance(v, Mapping) else v for v in values)


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
    """Running requests share chunks with it that the engine's cache does not hold yet (page-rounded): their
    prefill is still computing that prefix, so admitting it now would compute the prefix twice. The stopper
    was not asked; the engine skips it for this pass (`skip`)."""

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
    num_consults: int = 0
    """Candidates on which the stopper had a choice: not aged, not deferred, and not forced by its own rule
    (an empty batch, or Δ = 0: nothing shared is at stake; `policy.context.is_forced`)."""
    num_stops: int = 0
    num_withdrawn: int = 0
    num_deferred: int = 0
    num_cache_events: int = 0
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
        page_size: int = 1,
        state_tag: Mapping[str, str] | None = None,
        cache_events: bool = False,
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
        self._skipped: list[RequestId] = []
        self._frontiers: list[_CacheFrontier] = []
        self._defer_uncached_prefix = defer_uncached_prefix
        self._page_size = page_size
        self._cache_events = cache_events
        self._state_tag = dict(state_tag or {})
        self._decided_this_pass = False
        self._aged_this_pass = False
        self._window_open = False
        self._window_tokens = 0
        self._window_decode_s = 0.0
        self._last_event_s: float | None = None
        """When the last step report (or the window's opening) happened: a step's duration is measured from it."""
        if state_path is not None:
            load_state(stopper, state_path, tag=self._state_tag)

    @classmethod
    def from_config(cls, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic) -> Admission:
        return cls(
            ChunkedHashTree(config.chunk_size),
            make_policy(config.stopper, seed=config.seed, **config.stopper_options),
            AgingGuard(config.max_wait_s),
            clock=clock,
            state_path=config.state_path,
            defer_uncached_prefix=config.defer_uncached_prefix,
            page_size=config.page_size,
            state_tag=config.state_tag,
            cache_events=config.cache_events,
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
        """A request left in whatever state it was (finished, aborted); False if Feather did not know it."""
        self._arrivals.pop(request_id, None)
        return self.tree.discard(request_id)

    # ----------------------------------------------------------------- the engine's cache

    def cache_stored(self, hashes: Sequence[ChunkHash], parent: ChunkHash | None = None) -> int:
        """The engine's cache now holds the chunk chain `hashes` below the prefix `parent` (None: from the
        start); returns the chunks newly cached. See `ChunkedHashTree.cache_store`."""
        self.stats.num_cache_events += 1
        return self.tree.cache_store(hashes, parent)

    def cache_removed(self, hashes: Sequence[ChunkHash]) -> int:
        """The engine evicted these prefixes (and what extends them); returns the chunks uncached."""
        self.stats.num_cache_events += 1
        return self.tree.cache_remove(hashes)

    def cache_cleared(self) -> None:
        """The engine's cache was emptied."""
        self.stats.num_cache_events += 1
        self.tree.cache_clear()

    def forget_all(self) -> None:
        """Drop every request (the stopper keeps what it learned, the cache tier what the engine's cache
        holds); for an adapter that rebuilds its view. A tree that refuses to let its requests go is replaced
        by an empty one (the cache tier then relearns from the next events)."""
        tree = self.tree
        try:
            for rid in [*tree.waiting_ids(), *tree.active_ids()]:
                tree.discard(rid)
        except Exception:
            logger.exception("Feather could not empty its tree; starting a new one without the cache tier")
            self.tree = ChunkedHashTree(tree.chunk_size)
        self._arrivals.clear()
        self._skipped.clear()
        self._pass_admitted.clear()
        self._frontiers.clear()

    def wait_s(self, request_id: RequestId) -> float:
        return self.clock() - self._arrivals[request_id]

    # ----------------------------------------------------------------- one scheduling pass

    def begin_pass(self) -> None:
        """A new scheduling pass starts (stoppers with per-pass state reset it)."""
        self._resume_skipped()
        self.stopper.begin_pass()
        self._pass_admitted.clear()
        self._frontiers.clear()
        self._decided_this_pass = False
        self._aged_this_pass = False

    def end_pass(self) -> None:
        """The pass is over: requests skipped in it compete again."""
        self._resume_skipped()
        self._pass_admitted.clear()
        self._frontiers.clear()
        self._aged_this_pass = False

    def propose(
        self,
        batch_size: int,
        request_id: RequestId | None = None,
        cached_tokens: Callable[[RequestId], int] | None = None,
    ) -> Proposal | None:
        """The next request to admit and the stopper's verdict; None when nothing (not skipped) waits.

        Deferred candidates are skipped for the rest of the pass and the next one is proposed. Engines that
        walk their own queue may name the request they are at (`request_id`): its proposal is returned as it
        is, deferred or not (then call `skip` or end the pass). `cached_tokens(rid)` is the prompt prefix the
        engine's cache holds for a request (not needed with cache events); without either, only this pass's
        own admissions count as in flight."""
        if request_id is not None:
            candidate = self.tree.candidate(request_id)
            if self._is_due(request_id):
                return self._proposal(candidate, batch_size, is_aged=True)
            deferred = self._is_in_flight(candidate, cached_tokens)
            return self._proposal(candidate, batch_size, is_aged=False, is_deferred=deferred)
        found = self._next_candidate(cached_tokens)
        if found is None:
            return None
        candidate, aged = found
        return self._proposal(candidate, batch_size, is_aged=aged)

    def next_request(self, cached_tokens: Callable[[RequestId], int] | None = None) -> RequestId | None:
        """The request `propose()` would offer next (deferred ones skipped), without asking the stopper: for
        engines that put it at the head of their own queue and ask `propose(request_id=...)` when they reach
        it. None when nothing (not skipped) waits."""
        found = self._next_candidate(cached_tokens)
        return found[0].request_id if found is not None else None

    def _is_due(self, request_id: RequestId) -> bool:
        """The aging guard serves this request now: it is due and no due request was admitted in this pass."""
        return not self._aged_this_pass and self.guard.is_starved(self.wait_s(request_id))

    def _due_request(self, oldest: RequestId) -> RequestId:
        """The request the guard serves when `oldest` is due: the oldest one with nothing covered if it is due
        too (the ranking serves it last; a covered request's group keeps being served), else `oldest`."""
        stranger = self.tree.oldest_stranger()
        if stranger is not None and stranger != oldest and self._is_due(stranger):
            return stranger
        return oldest

    def _next_candidate(self, cached_tokens) -> tuple[Candidate, bool] | None:
        """(candidate, is_aged): a due request once the oldest is due (one per pass), else the CHT's best not
        in flight."""
        tree = self.tree
        oldest = tree.oldest()
        if oldest is None:
            return None
        if self._is_due(oldest):
            return tree.candidate(self._due_request(oldest)), True
        while True:  # a skipped request leaves only younger ones, none of them due either
            candidate = tree.best()
            if candidate is None:
                return None
            if not self._is_in_flight(candidate, cached_tokens):
                return candidate, False
            self._skip(candidate.request_id)

    def _proposal(
        self, candidate: Candidate, batch_size: int, *, is_aged: bool, is_deferred: bool = False
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
        if is_deferred:
            return Proposal(candidate, observation, Decision.STOP, is_aged=False, is_deferred=True)
        if not self._decided_this_pass:
            self._decided_this_pass = True
            self._roll_window()
        self.stats.num_consults += not is_forced(observation)
        return Proposal(candidate, observation, self.stopper.decide(observation), is_aged=False)

    def _is_in_flight(self, candidate: Candidate, cached_tokens: Callable[[RequestId], int] | None) -> bool:
        """Running requests share chunks with the candidate beyond what the engine's cache holds."""
        covered = candidate.depth_running
        if covered == candidate.num_chunks:
            covered -= 1  # a cache never matches a whole prompt: its last token is always computed
        if covered <= 0 or not self._defer_uncached_prefix:
            return False
        if self._cache_events:
            return covered > candidate.depth_cached
        if cached_tokens is None:
            return self._shares_only_this_pass(candidate, covered)
        page = self._page_size
        shared = covered * self.tree.chunk_size
        return shared - shared % page > self._cached_tokens(candidate, cached_tokens) // page * page

    def _cached_tokens(self, candidate: Candidate, cached_tokens: Callable[[RequestId], int]) -> int:
        """`cached_tokens(candidate)`, answered from this pass's frontiers when the candidate shares one."""
        rid, tree = candidate.request_id, self.tree
        for frontier in self._frontiers:
            if frontier.request_id in tree and tree.shares_prefix(rid, frontier.request_id, frontier.depth):
                return frontier.num_cached
        num_cached = cached_tokens(rid)
        chunk_size = tree.chunk_size
        depth = num_cached // chunk_size + 1
        if depth < candidate.num_chunks and num_cached + self._page_size <= depth * chunk_size:
            self._frontiers.append(_CacheFrontier(rid, depth, num_cached))
        return num_cached

    def _shares_only_this_pass(self, candidate: Candidate, covered: int) -> bool:
        """Without a view of the cache: the shared chunks are held only by requests admitted in this pass."""
        if not self._pass_admitted:
            return False
        rid, tree = candidate.request_id, self.tree
        fresh = sum(
            tree.state(other) is RequestState.ACTIVE and tree.shares_prefix(rid, other, covered)
            for other in self._pass_admitted
        )
        return tree.num_holding(rid, covered) == fresh

    def skip(self, proposal: Proposal) -> None:
        """Pass over a (deferred) request until the pass ends."""
        self._skip(proposal.request_id)

    def _skip(self, request_id: RequestId) -> None:
        self.tree.suspend(request_id)
        self._skipped.append(request_id)
        self.stats.num_deferred += 1

    def _resume_skipped(self) -> None:
        """Every request skipped in this pass competes again (only the admission suspends requests)."""
        if self._skipped:
            self.tree.resume_all()
            self._skipped.clear()

    def accept(self, proposal: Proposal) -> None:
        """The engine admitted the proposed request."""
        self.tree.activate(proposal.request_id)
        self._pass_admitted.append(proposal.request_id)
        self._frontiers.clear()
        self.stats.num_admitted += 1
        self.stats.sum_delta += proposal.candidate.delta
        if proposal.is_aged:
            self.stats.num_aged += 1
            self._aged_this_pass = True
            self.guard.admitted(self.wait_s(proposal.request_id))
        else:
            self._records.append(DecisionRecord(proposal.observation, Decision.ADD))

    def decline(self, proposal: Proposal) -> None:
        """The stopper's STOP ends this pass; its decisions await the window's reward."""
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
        try:
            return self._select(batch_size, max_requests, fits, cached_tokens)
        finally:
            self.end_pass()

    def _select(self, batch_size, max_requests, fits, cached_tokens) -> AdmissionPlan:
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

    def on_decode_step(self, num_tokens: int) -> None:
        """A decode-only step finished: it produced `num_tokens` tokens in the time since the previous step
        report (or since the window opened). Report each forward step when it is done."""
        elapsed = self._step_elapsed()
        if self._window_open:
            self._window_tokens += num_tokens
            self._window_decode_s += elapsed

    def on_prefill_step(self) -> None:
        """A step that computed prompt tokens (a prefill, a chunk of one, or a step mixing prefill and decode)
        finished: neither its time nor its tokens count towards the reward window."""
        self._step_elapsed()

    def _step_elapsed(self) -> float:
        now = self.clock()
        elapsed = 0.0 if self._last_event_s is None else max(0.0, now - self._last_event_s)
        self._last_event_s = now
        return elapsed

    def on_batch_drained(self) -> None:
        """Nothing runs any more: reward the open window and open none until the next decision."""
        self._close_window()
        self._window_open = False
        self._last_event_s = None

    def _roll_window(self) -> None:
        """At a pass's first stopper decision: reward the open window if it decoded anything, open the next."""
        if not self._window_open or self._close_window():
            self._window_open = True
            self._window_tokens = 0
            self._window_decode_s = 0.0
            self._last_event_s = self.clock()

    def _close_window(self) -> bool:
        if not self._window_open or self._window_tokens == 0:
            return False
        self.end_window(self._window_tokens, self._window_decode_s)
        self._window_tokens = 0
        self._window_decode_s = 0.0
        return True

    def end_window(self, num_tokens: int, elapsed_s: float) -> float | None:
        """Reward every decision made since the last window with `num_tokens / elapsed_s` (normalised); a
        window without decisions still updates the normalisation. None for an empty window."""
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
            save_state(self.stopper, self._state_path, tag=self._state_tag)

    # ----------------------------------------------------------------- views for adapters

    def is_waiting(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.WAITING

    def is_active(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.ACTIVE
