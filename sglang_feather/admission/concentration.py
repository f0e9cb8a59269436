"""The concentration rule: while the KV pool binds, a request that would lock a new prefix waits for running groups."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sglang_feather.admission.costs import KvHeadroom
from sglang_feather.cht import Candidate, ChunkedHashTree

PRIVATE_WINDOW = 32
"""Admissions whose measured cost makes the running groups' per-request cost `p` (their mean): a window, so a
shift in the traffic's private lengths is followed within that many admissions."""

# How it works.
#
# Every prefix some running request holds is locked in the engine's KV pool (not evictable), so a request's
# cost in batch room is what its admission takes from the engine's room (`KvHeadroom.num_free_tokens`: free plus
# evictable, less what running requests are promised) beyond what running requests already lock: its prompt
# below the deepest prefix running requests hold, `(num_chunks - depth_running)` chunks, plus what the engine
# promises it ahead (SGLang reserves its output by `new_token_ratio`; vLLM nothing). A request that joins a
# running prefix costs its private part alone; `p` is the mean of what those admissions took, read as the
# room's drop from one decision to the next in a pass (the engine's own accounting, whatever it is) over the
# last PRIVATE_WINDOW of them, and what they took beyond their prompts is the engine's promise per request.
# A candidate *locks a new prefix* when it shares a prefix with other requests that no running request holds:
# its group (first chunk) runs nowhere and has other waiting requests, or the engine's cache holds more of its
# prompt than running requests do and another waiting request shares that cached part (a cold prompt nothing
# shares, or one whose cached part is its own, a chat turn's history, locks nothing new: it costs its own
# prompt whenever it runs, and holding it back only lets its cached part be evicted). It then costs its new prompt tokens, that prefix included, plus the promise. The pool
# *binds* when the room cannot hold both the candidate and what waits (`num_waiting * p`): which requests
# run is then decided by who takes the room, and every token a new prefix locks is taken from a request that
# would lock none, so the candidate displaces `cost / p` of them to bring one. A candidate that locks a new
# prefix and costs more than `p` is then held back for the pass while a request of a running group waits
# (without one the room would go unused), and the rest of the pass is closed to such candidates
# (`Admission.hold_back`; the room and the demand fall together as requests join, so it binds for the rest of
# the pass). The aging guard's pick, due by the overtaken rule or by the bound, is held back whenever the pool
# binds (even with no running group's request waiting), and the guard is then done for the pass: which group's
# prefix is locked is the ranking's choice (the heaviest covered group first), not the oldest request's; a
# cold prompt locks nothing new and is never held. Where the pool does not bind the rule stays out of the way,
# and so it does until admissions measured `p`.


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


class Concentration:
    """Decides whether a candidate that locks a new prefix is held back for the pass (see "how it works")."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size <= 0:
            raise ValueError(f"Concentration chunk_size must be > 0, got {chunk_size!r}")
        self.chunk_size = chunk_size
        self._costs: deque[tuple[int, int]] = deque(maxlen=PRIVATE_WINDOW)
        """(room taken, prompt tokens) of the last measured admissions that locked no new prefix."""
        self._sum_taken = 0
        self._sum_prompt = 0
        self._last_room: int | None = None
        """The room at this pass's last decision."""
        self._pending: int | None = None
        """The prompt tokens of the admission since that decision, when it locked no new prefix."""

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

    def prompt_tokens(self, candidate: Candidate) -> int:
        """The prompt tokens admitting `candidate` takes beyond what running requests lock."""
        return (candidate.num_chunks - candidate.depth_running) * self.chunk_size

    @property
    def mean_cost_tokens(self) -> float | None:
        """`p`: the mean room the last measured admissions of running groups took (None before the first)."""
        return self._sum_taken / len(self._costs) if self._costs else None

    @property
    def promise_tokens(self) -> float:
        """What the engine promised those admissions beyond their prompts, per request (0 before any)."""
        return max(0.0, (self._sum_taken - self._sum_prompt) / len(self._costs)) if self._costs else 0.0

    def room_seen(self, room: KvHeadroom | None) -> None:
        """The engine's room at a decision of this pass: the drop since the last one is what the admission
        between them took (measured when that admission locked no new prefix)."""
        num_free = None if room is None else room.num_free_tokens
        if self._pending is not None and self._last_room is not None and num_free is not None:
            self._measured(max(0, self._last_room - num_free), self._pending)
        self._last_room, self._pending = num_free, None

    def replay(self, rooms: list[int | None], admitted: list[Candidate]) -> None:
        """`room_seen` and `admitted` for decisions made ahead of the rule (a planned pass): at the i-th the
        engine had `rooms[i]` tokens of room (None: it could not say), and the first `len(admitted)` were
        admitted, in order. Only the last PRIVATE_WINDOW measurements stay in the window, so only those are
        booked."""
        last, pending = self._last_room, self._pending
        measured: list[tuple[int, int]] = []
        for i, num_free in enumerate(rooms):
            if pending is not None and last is not None and num_free is not None:
                measured.append((max(0, last - num_free), pending))
            last, pending = num_free, None
            if i < len(admitted):
                candidate = admitted[i]
                if candidate.depth_running and candidate.depth_cached <= candidate.depth_running:
                    pending = (candidate.num_chunks - candidate.depth_running) * self.chunk_size
        for num_taken, num_prompt in measured[-PRIVATE_WINDOW:]:
            self._measured(num_taken, num_prompt)
        self._last_room, self._pending = last, pending

    def admitted(self, candidate: Candidate) -> None:
        """The last decision's candidate was admitted: its cost is read at the pass's next decision when it
        joined a prefix running requests hold and locked none of the cache's."""
        joins_running = not candidate.adds_group and candidate.depth_cached <= candidate.depth_running
        self._pending = self.prompt_tokens(candidate) if joins_running else None

    def pass_ended(self) -> None:
        self._last_room = self._pending = None

    def _measured(self, num_taken: int, num_prompt: int) -> None:
        if len(self._costs) == self._costs.maxlen:
            old_taken, old_prompt = self._costs[0]
            self._sum_taken -= old_taken
            self._sum_prompt -= old_prompt
        self._costs.append((num_taken, num_prompt))
        self._sum_taken += num_taken
        self._sum_prompt += num_prompt

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
