"""Where Feather's picks go in SGLang's waiting queue: the slot its admission loop reaches next."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from itertools import filterfalse
from operator import attrgetter
from typing import Any

from sglang_feather.admission import Admission, Pick
from sglang_feather.cht import Candidate
from sglang_feather.sglang.mirror import QueueMirror

_REQUEST_ID = attrgetter("request_id")

REBUILD_RATIO = 8
"""Planned picks are placed by rebuilding the queue's tail when they are over 1/8 of it (each move is a
rank lookup and a list shift; a rebuild one pass over the tail, which reads every `Req` there)."""


class QueueSlots:
    """Mixed into `FeatherRuntime`: moves each next pick to where SGLang's loop reaches next, and puts the
    unadmitted ones back in queue-number order at the next pass (see `runtime.py`, "how it works")."""

    admission: Admission
    mirror: QueueMirror
    events: Any
    num_scans: int
    num_misses: int
    _queue: list[Any] | None
    _pick: Pick | None
    _pick_req: Any
    _slot: int
    _moved: list[Any]
    _cached_tokens: Callable[[Any], int]
    planning_pass: bool
    _begin_plan: Callable[[int, int], None]
    _settle_plan: Callable[[], None]

    def _offer_after(self, req: Any, batch_size: int | None = None) -> None:
        """`req` was admitted (a batch of `batch_size` now runs: then the rest of the pass is planned where it can
        be) or passed over: offer the next pick in the slot after it."""
        queue = self._queue
        if queue is None:
            return
        slot = self._slot
        if not (slot < len(queue) and queue[slot] is req):
            self.num_scans += 1
            try:
                slot = queue.index(req)
            except ValueError:
                return
        if batch_size is not None and self.planning_pass and self.admission.can_plan_rest:
            try:
                self._begin_plan(batch_size, slot + 1)
                return
            except LookupError:  # a pick lies before the slot (the loop passed over it): step as before
                self._settle_plan()
        self._offer(slot + 1)

    def _offer(self, slot: int) -> None:
        """Move the admission's next pick into `queue[slot]`, the next one SGLang's loop reaches."""
        queue = self._queue
        pick = self.admission.next_pick(None if self.events is not None else self._cached_tokens)
        self._pick = pick
        if queue is None or pick is None:
            return
        req = self._pick_req = self.mirror.request(pick.request_id)
        there = self._position(queue, req, slot, self.mirror.rank(req))
        if there is None:
            return
        if there != slot:
            queue.insert(slot, queue.pop(there))
            self._moved.append(req)
            self.mirror.take_out(req)
        self._slot = slot

    def _place(self, picks: list[Candidate], slot: int) -> list[Any]:
        """Move planned picks into `queue[slot:]` in order; returns their `Req`s."""
        queue, rids = self._queue, map(_REQUEST_ID, picks)
        if queue is None:
            return self.mirror.requests(rids)
        if len(picks) * REBUILD_RATIO > len(queue) - slot:  # one C-speed rebuild beats a move per pick
            reqs = self.mirror.requests(rids)
            rest = list(filterfalse(set(reqs).__contains__, queue[slot:]))  # a `Req` hashes by identity
            if len(rest) + len(reqs) != len(queue) - slot:
                raise LookupError("a planned request is not in the waiting queue after the slot")
            queue[slot:] = reqs + rest
            self._moved += reqs
            self.mirror.forget_order()
            return reqs
        reqs = self.mirror.take_out_block(queue, slot, rids)
        if reqs is not None:
            self._moved += reqs
            return reqs
        reqs = self.mirror.requests(map(_REQUEST_ID, picks))  # the block could not move: one at a time
        take_out, moved = self.mirror.take_out, self._moved
        for req in reqs:
            there = self._position(queue, req, slot, take_out(req))
            if there is None:
                raise LookupError(f"planned request {req.rid!r} is not in the waiting queue")
            if there != slot:
                queue.insert(slot, queue.pop(there))
            moved.append(req)
            slot += 1
        return reqs

    def _put_back(self, queue: list[Any]) -> None:
        """Return the last pass's moved (or planned), unadmitted picks from the head of the queue (where SGLang's
        filter of the admitted ones left them) to their places in queue-number order."""
        moved, self._moved = self._moved, []
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
