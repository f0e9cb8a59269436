"""The concentration rule: while the KV pool binds, a request that would lock a new prefix waits for running groups."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from sglang_feather.admission.costs import KvHeadroom
from sglang_feather.cht import Candidate, ChunkedHashTree

_NUM_CHUNKS = attrgetter("num_chunks")
_DEPTH_RUNNING = attrgetter("depth_running")

PRIVATE_WINDOW = 32
"""Measured admissions whose cost makes the running groups' per-request cost `p` (their mean, over the runs that
cover the last this many): a window, so a shift in the traffic's private lengths is followed within about that
many admissions."""

# How it works.
#
# Every prefix some running request holds is locked in the engine's KV pool (not evictable), so a request's
# cost in batch room is what its admission takes from the engine's room (`KvHeadroom.num_free_tokens`: free
# plus evictable, less what running requests are promised) beyond what running requests already lock: its
# prompt below the deepest prefix running requests hold, `(num_chunks - depth_running)` chunks, plus what the
# engine promises it ahead (SGLang reserves its output by `new_token_ratio`; vLLM nothing). A request that
# joins a running prefix costs its private part alone; `p` is the mean of what those admissions took, read
# from the room (the engine's own accounting, whatever it is): a *run* of consecutive such admissions in one
# pass took the room's drop from before its first to after its last, so the room is read where a run may start
# or end and before a pass's 1st, 2nd, 4th, ... admission (`_is_read_point`), not at every admission (an
# engine read costs microseconds, and a planned pass admits dozens in a row), and `p` is the mean per
# admission over the runs that cover the last PRIVATE_WINDOW measured admissions. What they took beyond their
# prompts is the engine's promise per request.
# A candidate *locks a new prefix* when it shares a prefix with other requests that no running request holds:
# its group (first chunk) runs nowhere and has other waiting requests, or the engine's cache holds more of its
# prompt than running requests do and another waiting request shares that cached part (a cold prompt nothing
# shares, or one whose cached part is its own, a chat turn's history, locks nothing new: it costs its own
# prompt whenever it runs, and holding it back only lets its cached part be evicted). It then costs its new
# prompt tokens, that prefix included, plus the promise. The pool *binds* when the room cannot hold both the
# candidate and what waits (`num_waiting * p`): which requests run is then decided by who takes the room, and
# every token a new prefix locks is taken from a request that would lock none, so the candidate displaces
# `cost / p` of them to bring one. A candidate that locks a new prefix and costs more than `p` is then held
# back for the pass while a request of a running group waits (without one the room would go unused), and the
# rest of the pass is closed to such candidates (`Admission.hold_back`; the room and the demand fall together
# as requests join, so it binds for the rest of the pass). The aging guard's pick, due by the overtaken rule
# or by the bound, is held back whenever the pool binds (even with no running group's request waiting), and
# the guard is then done for the pass: which group's prefix is locked is the ranking's choice (the heaviest
# covered group first), not the oldest request's; a cold prompt locks nothing new and is never held. Where the
# pool does not bind the rule stays out of the way, and so it does until admissions measured `p`.


@dataclass(frozen=True)
class RoomCheck:
    """The rule's inputs and verdict on one candidate, in tokens."""

    num_cost_tokens: int
    """What admitting the candidate takes from the room beyond what running requests lock."""
    num_room_tokens: int
    """What the engine can still give to new requests."""
    num_demand_tokens: int
    """What the waiting requests need (`num_waiting * p`)."""
    mean_cost_tokens: float
    """`p`: what an admission that locks no new prefix takes."""

    @property
    def binds(self) -> bool:
        """The room cannot hold both the candidate and what waits."""
        return self.num_cost_tokens + self.num_demand_tokens > self.num_room_tokens

    @property
    def holds_back(self) -> bool:
        """It binds, and the candidate takes the room of more than one request that locks nothing new."""
        return self.binds and self.num_cost_tokens > self.mean_cost_tokens


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive measured admissions of one pass: the room they took in all, their prompt tokens, how many."""

    num_taken_tokens: int
    num_prompt_tokens: int
    num_admissions: int


class Concentration:
    """Decides whether a candidate that locks a new prefix is held back for the pass (see "how it works")."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size <= 0:
            raise ValueError(f"Concentration chunk_size must be > 0, got {chunk_size!r}")
        self.chunk_size = chunk_size
        self._runs: deque[Run] = deque()
        """The booked runs that cover the last PRIVATE_WINDOW measured admissions, oldest first."""
        self._sum_taken = self._sum_prompt = self._num_measured = 0
        # This pass: its admissions so far, and whether the last was measured (None: none yet).
        self._num_admitted = 0
        self._last_measured: bool | None = None
        # The latest read, not yet used: the room (None: the engine could not say) and the admissions before it
        # (`_read_at`; None: no read waits).
        self._read_room: int | None = None
        self._read_at: int | None = None
        # The last used read's room, and the admissions since (their prompt tokens; all measured or not).
        self._used_room: int | None = None
        self._num_since = self._prompt_since = 0
        self._since_measured = True
        # The open run: the room before its first admission (None: no run open), the last used read inside it,
        # and the admissions up to that read with their prompt tokens.
        self._run_start: int | None = None
        self._run_end = self._run_admissions = self._run_prompt = 0

    @staticmethod
    def locks_new_prefix(candidate: Candidate, tree: ChunkedHashTree) -> bool:
        """Admitting it locks a prefix other requests share and no running request holds: its group (first
        chunk) runs nowhere and has other waiting requests, or the engine's cache holds more of its prompt than
        running requests do and another waiting request shares that cached part. A prompt nothing else waiting
        shares beyond the running prefix (a cold prompt, or one whose cached part is its own, as a chat turn's
        history) locks nothing new: its prompt is its own, which it costs whenever it runs."""
        depth = candidate.depth_running
        if candidate.depth_cached > depth and tree.num_waiting_holding(candidate.request_id, depth + 1) > 1:
            return True
        return candidate.adds_group and tree.num_waiting_holding(candidate.request_id, 1) > 1

    @staticmethod
    def is_measured(candidate: Candidate) -> bool:
        """Its admission measures `p`: it joins a prefix running requests hold and locks none of the cache's."""
        return not candidate.adds_group and candidate.depth_cached <= candidate.depth_running

    @staticmethod
    def _is_read_point(num_admitted: int, last_measured: bool | None, measured: bool) -> bool:
        """A read before the pass's admission number `num_admitted` (from 0) is used where a run may start or
        end (the pass's first admission, or one measured where the last was not or the other way round) and
        before the 1st, 2nd, 4th, 8th, ... admission, so a pass that ends with no read after its last admission
        (its queue or its batch full) still measures at least half of its last run."""
        return last_measured is None or last_measured != measured or num_admitted & (num_admitted - 1) == 0

    def read_points(self, num_planned: int, num_picks: int) -> list[bool]:
        """Whether the rule uses the room read before each of a planned block's `num_picks` picks, admitted in
        order after `num_planned` earlier picks of the plan, which follows this pass's admissions so far. A plan
        holds measured picks only (it ends before any other: `Planner`), so a run turns only at the plan's first
        pick and the other reads are the powers of two: O(log) checks, not one a pick. A planned pass reads the
        room there, and after a refusal."""
        start = self._num_admitted + num_planned
        after_measured = True if num_planned else self._last_measured
        points = [False] * num_picks
        if num_picks and self._is_read_point(start, after_measured, True):
            points[0] = True
        k = 1 << start.bit_length()  # the first power of two after `start`
        while k < start + num_picks:
            points[k - start] = self._is_read_point(k, True, True)
            k <<= 1
        return points

    def prompt_tokens(self, candidate: Candidate) -> int:
        """The prompt tokens admitting `candidate` takes beyond what running requests lock."""
        return self.prompt_tokens_all((candidate,))

    def prompt_tokens_all(self, candidates: Sequence[Candidate]) -> int:
        """`prompt_tokens` summed over `candidates`."""
        return (sum(map(_NUM_CHUNKS, candidates)) - sum(map(_DEPTH_RUNNING, candidates))) * self.chunk_size

    @property
    def mean_cost_tokens(self) -> float | None:
        """`p`: the mean room the last measured admissions of running groups took, the open run's so far
        included (None before the first)."""
        num_taken, _, num_measured = self._totals()
        return num_taken / num_measured if num_measured else None

    @property
    def promise_tokens(self) -> float:
        """What the engine promised those admissions beyond their prompts, per request (0 before any)."""
        num_taken, num_prompt, num_measured = self._totals()
        return max(0.0, (num_taken - num_prompt) / num_measured) if num_measured else 0.0

    def _totals(self) -> tuple[int, int, int]:
        """Room taken, prompt tokens and admissions over the window's runs and the open run's measured part."""
        if self._run_start is None:
            return self._sum_taken, self._sum_prompt, self._num_measured
        return (
            self._sum_taken + max(0, self._run_start - self._run_end),
            self._sum_prompt + self._run_prompt,
            self._num_measured + self._run_admissions,
        )

    def room_seen(self, room: KvHeadroom | None) -> None:
        """The engine's room at a decision of this pass (the step path reads it at every decision; the rule
        uses the reads `_is_read_point` names and the pass's last one)."""
        self._read_room = None if room is None else room.num_free_tokens
        self._read_at = self._num_admitted

    def admitted(self, candidate: Candidate) -> None:
        """The last decision's candidate was admitted."""
        measured = self.is_measured(candidate)
        self._admitted_all(1, measured, self.prompt_tokens(candidate) if measured else 0)

    def replay(self, rooms: Mapping[int, int | None], admitted: Sequence[Candidate]) -> None:
        """`room_seen` and `admitted` for decisions made ahead of the rule (a planned pass, whose picks are all
        measured: see `read_points`): the first `len(admitted)` were admitted, in order, and the engine had
        `rooms[i]` tokens of room (None: it could not say) before the i-th, read where `read_points` said
        (`rooms[len(admitted)]`: after the last, read at a refusal)."""
        points = sorted(rooms)
        num_inside = bisect_left(points, len(admitted))
        if num_inside > 2 and None not in rooms.values():
            # Past the first read among the admissions each read only extends the open run (the admissions are
            # measured and every read says), so the last one books what all of them would have.
            points = [points[0], points[num_inside - 1], *points[num_inside:]]
        done = 0
        for i in points:
            if i > done:
                self._admitted_all(i - done, True, self.prompt_tokens_all(admitted[done:i]))
            self._read_room, self._read_at = rooms[i], self._num_admitted
            done = i
        if len(admitted) > done:
            self._admitted_all(len(admitted) - done, True, self.prompt_tokens_all(admitted[done:]))

    def _admitted_all(self, num: int, measured: bool, num_prompt: int) -> None:
        """`num` admissions in a row with no read between them, all measured or all not (`num_prompt`: their
        prompt tokens when measured): the latest read is used when it was taken right before the first and that
        is a read point."""
        k = self._num_admitted
        if self._read_at == k:
            if self._is_read_point(k, self._last_measured, measured):
                self._use_read(self._read_room)
            self._read_at = None
        self._num_admitted = k + num
        self._last_measured = measured
        self._num_since += num
        self._prompt_since += num_prompt
        self._since_measured = self._since_measured and measured

    def pass_ended(self) -> None:
        """The pass's last read counts when no admission came after it; admissions after the last used read go
        unmeasured."""
        if self._read_at == self._num_admitted:
            self._use_read(self._read_room)
        self._close_run()
        self._num_admitted = 0
        self._last_measured = self._read_at = self._used_room = None
        self._num_since = self._prompt_since = 0
        self._since_measured = True

    def _use_read(self, num_free: int | None) -> None:
        """A used read of the room: the admissions since the last one extend the open run when all of them are
        measured and both reads say; any other admission between them ends it."""
        if self._num_since:
            if self._since_measured and self._used_room is not None and num_free is not None:
                if self._run_start is None:
                    self._run_start, self._run_admissions, self._run_prompt = self._used_room, 0, 0
                self._run_end = num_free
                self._run_admissions += self._num_since
                self._run_prompt += self._prompt_since
                self._drop_old_runs()
            else:
                self._close_run()
        self._used_room = num_free
        self._num_since = self._prompt_since = 0
        self._since_measured = True

    def _close_run(self) -> None:
        """Book the open run into the window."""
        if self._run_start is None:
            return
        run = Run(max(0, self._run_start - self._run_end), self._run_prompt, self._run_admissions)
        self._run_start = None
        self._runs.append(run)
        self._sum_taken += run.num_taken_tokens
        self._sum_prompt += run.num_prompt_tokens
        self._num_measured += run.num_admissions

    def _drop_old_runs(self) -> None:
        """Drop the oldest booked runs that the newer ones and the open run no longer need to cover the last
        PRIVATE_WINDOW measured admissions."""
        num_open = self._run_admissions if self._run_start is not None else 0
        runs = self._runs
        while runs and self._num_measured + num_open - runs[0].num_admissions >= PRIVATE_WINDOW:
            old = runs.popleft()
            self._sum_taken -= old.num_taken_tokens
            self._sum_prompt -= old.num_prompt_tokens
            self._num_measured -= old.num_admissions

    def check(self, candidate: Candidate, num_waiting: int, room: KvHeadroom) -> RoomCheck | None:
        """The rule's inputs for a candidate that locks a new prefix, `num_waiting` requests waiting (None before
        `p` was measured)."""
        p = self.mean_cost_tokens
        if p is None:
            return None
        cost = round(self.prompt_tokens(candidate) + self.promise_tokens)
        return RoomCheck(cost, room.num_free_tokens, round(num_waiting * p), p)

    def holds_back(
        self,
        candidate: Candidate,
        num_waiting_running: int,
        room: KvHeadroom | None,
        tree: ChunkedHashTree,
        early: bool = False,
    ) -> bool:
        """Whether `candidate` is held back in this pass: it locks a new prefix, costs more than a request that
        locks nothing new and the pool binds; and a request of a running group waits (`num_waiting_running`,
        else the room would go unused), or it is an `early` pick (the aging guard's before its bound: the
        ranking, not age, then chooses which group's prefix is locked). Never without the engine's room."""
        if room is None or (not early and num_waiting_running == 0):
            return False
        if not self.locks_new_prefix(candidate, tree):
            return False
        check = self.check(candidate, tree.num_waiting, room)
        return check is not None and check.holds_back
