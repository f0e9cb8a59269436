"""Where Feather's picks go in SGLang's waiting queue: the slot its admission loop reaches next."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import filterfalse
from operator import attrgetter
from typing import Any

from sglang_feather.cht import Candidate
from sglang_feather.sglang.mirror import QueueMirror

_REQUEST_ID = attrgetter("request_id")

REBUILD_RATIO = 8
"""Planned picks are placed by rebuilding the queue's tail when they are over 1/8 of it (each move is a
rank lookup and a list shift; a rebuild one pass over the tail, which reads every `Req` there)."""


class QueueSlots:
    """Moves each next pick to where SGLang's loop reaches next in this pass's waiting queue, and puts the
    unadmitted ones back in queue-number order at the next pass (see `runtime.py`, "how it works"). It owns
    the pass's queue reference, the slot, the moved requests and the miss counters, and receives the mirror
    whose queue numbers it reads."""

    def __init__(self, mirror: QueueMirror) -> None:
        self.mirror = mirror
        self.queue: list[Any] | None = None
        """SGLang's waiting queue during a pass (None between passes)."""
        self.slot = 0
        """Where the last pick was moved: the slot SGLang's loop reaches next."""
        self.moved: list[Any] = []
        """Picks moved to the head of the queue and not admitted: put back in queue-number order next pass."""
        self.num_scans = 0
        """Times a pick had to be found in the waiting queue by a linear scan (its order was disturbed)."""
        self.num_misses = 0
        """Times a pick was not where its rank in the mirror's sorted part said (found by bisection or scan)."""

    def begin_pass(self, queue: list[Any]) -> None:
        """A pass starts on SGLang's waiting queue (`queue`, moved in place)."""
        self.queue = queue

    def end_pass(self) -> None:
        self.queue = None

    @property
    def in_pass(self) -> bool:
        return self.queue is not None

    def slot_after(self, req: Any) -> int | None:
        """The slot after `req`, just admitted (None: no pass runs, or `req` is not in the queue)."""
        queue = self.queue
        if queue is None:
            return None
        slot = self.slot
        if not (slot < len(queue) and queue[slot] is req):
            self.num_scans += 1
            try:
                slot = queue.index(req)
            except ValueError:
                return None
        return slot + 1

    def move_to(self, req: Any, slot: int) -> None:
        """Move `req` into `queue[slot]`, the next one SGLang's loop reaches (nothing when it is not in the
        queue at or after `slot`)."""
        queue = self.queue
        if queue is None:
            return
        there = self._position(queue, req, slot, self.mirror.rank(req))
        if there is None:
            return
        if there != slot:
            queue.insert(slot, queue.pop(there))
            self.moved.append(req)
            self.mirror.take_out(req)
        self.slot = slot

    def admitted(self, req: Any) -> None:
        """SGLang's adder admitted `req`: it leaves the moved picks, or the mirror's sorted part (SGLang's filter
        takes it out of the queue)."""
        if self.moved and self.moved[-1] is req:
            self.moved.pop()
        else:
            self.mirror.take_out(req)

    @property
    def num_moved(self) -> int:
        return len(self.moved)

    def drop_moved(self, start: int, num: int) -> None:
        """`moved[start : start + num]` were admitted (SGLang's filter takes them out of the queue)."""
        del self.moved[start : start + num]

    def forget_moved(self) -> None:
        """The mirror renumbered the queue as it is: the moved requests are in queue-number order where they
        are, so none is put back."""
        self.moved.clear()

    def check_order(self, waiting_queue: Sequence[Any]) -> None:
        """Invariant, between passes: the mirror's sorted part is the waiting queue less the picks moved to its
        head and not admitted (ValueError otherwise)."""
        moved = set(map(id, self.moved))
        self.mirror.check_in_order([req for req in waiting_queue if id(req) not in moved])

    def place(self, picks: list[Candidate], slot: int) -> list[Any]:
        """Move planned picks into `queue[slot:]` in order; returns their `Req`s."""
        queue, rids = self.queue, map(_REQUEST_ID, picks)
        if queue is None:
            return self.mirror.requests(rids)
        if len(picks) * REBUILD_RATIO > len(queue) - slot:  # one C-speed rebuild beats a move per pick
            reqs = self.mirror.requests(rids)
            rest = list(filterfalse(set(reqs).__contains__, queue[slot:]))  # a `Req` hashes by identity
            if len(rest) + len(reqs) != len(queue) - slot:
                raise LookupError("a planned request is not in the waiting queue after the slot")
            queue[slot:] = reqs + rest
            self.moved += reqs
            self.mirror.forget_order()
            return reqs
        block = self.mirror.take_out_block(queue, slot, rids)
        if block is not None:
            self.moved += block
            return block
        reqs = self.mirror.requests(map(_REQUEST_ID, picks))  # the block could not move: one at a time
        take_out, moved = self.mirror.take_out, self.moved
        for req in reqs:
            there = self._position(queue, req, slot, take_out(req))
            if there is None:
                raise LookupError(f"planned request {req.rid!r} is not in the waiting queue")
            if there != slot:
                queue.insert(slot, queue.pop(there))
            moved.append(req)
            slot += 1
        return reqs

    def put_back(self, queue: list[Any]) -> None:
        """Return the last pass's moved (or planned), unadmitted picks from the head of the queue (where SGLang's
        filter of the admitted ones left them) to their places in queue-number order."""
        moved, self.moved = self.moved, []
        if not moved or not queue:
            return
        num_head = 0  # SGLang's filter leaves them at the head in the order they were moved
        for req in moved:
            if num_head == len(queue) or queue[num_head] is not req:
                break
            num_head += 1
        if num_head == len(moved):
            head = queue[:num_head]
            del queue[:num_head]
        else:  # admitted ones left, or in another order, or behind a pick held back where it stood: find them
            moved_ids = set(map(id, moved))  # `Req` compares by identity
            head, num_seen = [], 0
            for req in queue:  # they are near the head: stop once all are found
                num_seen += 1
                if id(req) in moved_ids:
                    head.append(req)
                    if len(head) == len(moved):
                        break
            if not head:
                return
            queue[:num_seen] = [req for req in queue[:num_seen] if id(req) not in moved_ids]
        seq = self.mirror.seq
        for req in head:
            slot, num = self.mirror.put_in(req), seq(req)
            if slot is None or not (
                slot <= len(queue)
                and (slot == 0 or seq(queue[slot - 1]) < num)
                and (slot == len(queue) or num < seq(queue[slot]))
            ):
                slot = self._sorted_slot(queue, req, 0)  # not kept, or out of step with the queue
            queue.insert(slot, req)

    def _sorted_slot(self, queue: list[Any], req: Any, lo: int) -> int:
        """Where `req` belongs in `queue[lo:]` by the mirror's queue numbers (bisection)."""
        return bisect_left(queue, self.mirror.seq(req), lo=lo, key=self.mirror.seq)

    def _position(self, queue: list[Any], req: Any, lo: int, rank: int | None) -> int | None:
        """Where `req` is in `queue[lo:]`, the sorted part of the queue once Feather's moves and the requests
        its loop passed are before `lo`: `lo + rank`, its rank there (`QueueMirror.take_out`; None: not kept),
        checked by identity, else by bisection on the mirror's queue numbers, checked, with a scan when the
        order was disturbed."""
        if rank is not None:
            there = lo + rank
            if there < len(queue) and queue[there] is req:
                return there
            self.num_misses += 1
        elif lo < len(queue) and queue[lo] is req:
            return lo
        there = self._sorted_slot(queue, req, lo)
        if there < len(queue) and queue[there] is req:
            return there
        self.num_scans += 1
        try:
            return queue.index(req, lo)
        except ValueError:
            return None
