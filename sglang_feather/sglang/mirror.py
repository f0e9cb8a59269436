"""Keeps the admission component's Chunked Hash Tree in step with SGLang's waiting queue and running batch."""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, eq, is_
from typing import Any

# How it works.
#
# SGLang owns the truth: `waiting_queue` (a list of `Req`) and the running batch. The runtime forwards the
# scheduler's own events, each O(1) plus hashing a new prompt (the tree reads SGLang's `array('q')` of token
# ids in place; the compiled tree hashes it without a copy): a request entering the waiting queue
# (`queued`: a new one is enqueued with `origin_input_ids + output_ids`; a known running one was retracted and
# waits again with its grown prompt, keeping its arrival time; a `Req` object that replaces a known one with
# the same rid starts over), and a request leaving for good (`left`: finished or aborted, in whatever state).
# Admissions are Feather's own decisions. `sync()` is the slow path: it reconciles ids with the full queues
# (used as a periodic self-check, and when an event was missed); its count of corrections is the drift. The
# chunked-prefill request is in flight between passes (neither waiting nor in the running batch), so a
# partial sync keeps an absent active request unless it has finished; a complete one drops it. Each waiting
# request also gets a queue number, increasing in the order SGLang appends to `waiting_queue` (a sync numbers
# the queue it is given in its order): apart from the requests Feather moved to the head in a pass, the queue
# stays sorted by it, so the runtime finds a request there by bisection (`seq`). The mirror also keeps those
# numbers for the sorted part in a compact array (`in_order`): a request's rank in it is its place in that part
# of the queue, found without reading the `Req`s a bisection over the queue passes (each a cache miss after
# the rest of the scheduler's step). It follows the queue's own events (appends, requests leaving, Feather's
# moves and put-backs) and is rebuilt by every `sync`; it is a hint, which the runtime checks by identity. A
# queue small enough that a pass's picks are over 1/8 of it has its tail rebuilt instead (one pass that reads
# every `Req` there): the array is then not kept until the next sync, and put-backs bisect the queue. A
# planned block is moved, and taken out of the array, by one slice rewrite of each (`take_out_block`: the
# others in the span keep their order, picked out by `itertools.compress`) instead of two list shifts and an
# array shift per request.


_REQ = attrgetter("req")


def namespace_of(req: Any) -> str | None:
    """LoRA id and SGLang's `extra_key` / `cache_salt`: requests that differ in any of them never share."""
    parts = (getattr(req, "lora_id", None), getattr(req, "extra_key", None), getattr(req, "cache_salt", None))
    if all(part is None for part in parts):
        return None
    return json.dumps(parts, default=str)


def token_ids_of(req: Any) -> Sequence[int]:
    """What a waiting request must (re)compute: its prompt plus any output kept across a retraction."""
    if not len(req.output_ids):
        return req.origin_input_ids
    ids = array("q", req.origin_input_ids)
    ids.extend(req.output_ids)
    return ids


def num_tokens_of(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


class _QueueNumbers(dict):
    """`Req` -> queue number; -1 for a `Req` not numbered. Its `__getitem__` is the bisection key: a C call."""

    def __missing__(self, req: Any) -> int:
        return -1


@dataclass(slots=True)
class _Entry:
    req: Any
    num_tokens: int


class QueueMirror:
    """The set of SGLang requests Feather tracks, and the admission events that keep the tree equal to it."""

    def __init__(self, admission: Any) -> None:
        self.admission = admission
        self._entries: dict[Any, _Entry] = {}
        self._seqs = _QueueNumbers()
        self.seq = self._seqs.__getitem__
        """`seq(req)`: `req`'s queue number (-1 for a `Req` the mirror does not track as this object)."""
        self._num_changes = 0
        self._next_seq = 0
        self._in_order: array | None = array("q")
        """The queue numbers of the requests in the sorted part of SGLang's waiting queue, ascending (None: not
        kept until the next sync)."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: Any) -> bool:
        return rid in self._entries

    def request(self, rid: Any) -> Any:
        return self._entries[rid].req

    def requests(self, rids: Iterable[Any]) -> list[Any]:
        """`request` of each."""
        return list(map(_REQ, map(self._entries.__getitem__, rids)))

    def tracked(self) -> Iterable[Any]:
        return self._entries.keys()

    def queued(self, req: Any) -> None:
        """`req` entered SGLang's waiting queue (a new request, or a retracted one)."""
        self._ensure_waiting(req)
        self._number(req)

    def _number(self, req: Any) -> None:
        """`req` was appended to the queue: it takes the next queue number (the end of the sorted part)."""
        entry = self._entries.get(req.rid)
        if entry is not None and entry.req is req:
            self.take_out(req)
            self._seqs[req] = self._next_seq
            if self._in_order is not None:
                self._in_order.append(self._next_seq)
            self._next_seq += 1

    @property
    def knows_order(self) -> bool:
        """Whether `in_order` is kept: from every `sync` until the runtime rebuilds the queue's tail
        (`forget_order`)."""
        return self._in_order is not None

    def forget_order(self) -> None:
        """The runtime rebuilt the queue's tail (a block of picks over 1/8 of it, in one C-speed pass that reads
        every `Req` there): `in_order` is not kept until the next `sync` (recounting it would cost about as
        much as the rebuild; `rank` is not asked and put-backs bisect the queue meanwhile)."""
        self._in_order = None

    def rank(self, req: Any) -> int | None:
        """Where `req` is in the sorted part of the queue (its queue number's place in `in_order`; None while
        that is not kept)."""
        in_order = self._in_order
        return None if in_order is None else bisect_left(in_order, self._seqs[req])

    def take_out(self, req: Any) -> int | None:
        """`req` left the sorted part of the queue (Feather moved it to the head, or it left the queue);
        returns where it was there (None: not kept, or not in it)."""
        seq, in_order = self._seqs[req], self._in_order
        if seq < 0 or in_order is None:
            return None
        i = bisect_left(in_order, seq)
        if i < len(in_order) and in_order[i] == seq:
            del in_order[i]
            return i
        return None

    def take_out_block(self, queue: list[Any], slot: int, rids: Iterable[Any]) -> list[Any] | None:
        """Move the requests of `rids`, all in the queue's sorted part (which starts at `queue[slot]`), to
        `queue[slot:]` in their order and take them out of that part: one slice rewrite of the queue and one of
        `in_order` over the span up to the deepest of them, with a Python step per request, not per queue
        entry; returns their `Req`s. None, with nothing changed, when `in_order` is not kept or a request is not
        where its rank says (checked by identity)."""
        in_order = self._in_order
        if in_order is None:
            return None
        reqs = list(map(_REQ, map(self._entries.__getitem__, rids)))  # `requests`, without its frame
        if not reqs:
            return reqs
        seqs = list(map(self._seqs.__getitem__, reqs))
        ranks = list(map(bisect_left, repeat(in_order, len(seqs)), seqs))
        span = max(ranks) + 1
        if span > len(in_order) or slot + span > len(queue) or len(set(ranks)) != len(ranks):
            return None
        part, numbers = queue[slot : slot + span], in_order[:span]
        if not (
            all(map(eq, map(numbers.__getitem__, ranks), seqs))
            and all(map(is_, map(part.__getitem__, ranks), reqs))
        ):
            return None
        keep = bytearray(b"\x01") * span
        for rank in ranks:
            keep[rank] = 0
        queue[slot : slot + span] = reqs + list(compress(part, keep))
        in_order[:span] = array("q", compress(numbers, keep))
        return reqs

    def put_in(self, req: Any) -> int | None:
        """`req` goes back into the sorted part of the queue; returns its place there (None: not kept)."""
        seq, in_order = self._seqs[req], self._in_order
        if seq < 0 or in_order is None:
            return None
        i = bisect_left(in_order, seq)
        if not (i < len(in_order) and in_order[i] == seq):
            in_order.insert(i, seq)
        return i

    @property
    def num_in_order(self) -> int:
        return 0 if self._in_order is None else len(self._in_order)

    def check_in_order(self, sorted_part: Sequence[Any]) -> None:
        """Invariant: while kept, `in_order` holds the queue numbers of `sorted_part` (the waiting queue less the
        requests Feather moved to its head), in its order, ascending; ValueError otherwise."""
        if self._in_order is None:
            return
        seqs = [self._seqs[req] for req in sorted_part]
        if list(self._in_order) != seqs or any(map(int.__ge__, seqs, seqs[1:])):
            raise ValueError(
                f"the mirror's sorted part {list(self._in_order)[:8]} is not the queue's {seqs[:8]}"
            )

    def left(self, req: Any) -> bool:
        """`req` left for good (finished or aborted); False if the mirror did not track this `Req`."""
        entry = self._entries.get(req.rid)
        if entry is None or entry.req is not req:
            return False
        self._drop(req.rid)
        return True

    def sync(self, waiting: Sequence[Any], running: Iterable[Any], *, complete: bool) -> int:
        """Make the tree hold exactly `waiting` (as WAITING) and `running` (as ACTIVE); returns the number of
        corrections (requests enqueued, dropped, activated, retracted or re-enqueued).

        `complete=False` (mid-pass: the chunked request may be in flight) keeps an absent active request
        unless its `Req` has finished; `complete=True` removes every absent request.
        """
        self._num_changes = 0
        self._in_order = array("q")  # renumbered below, in the queue's order
        waiting_ids = {req.rid for req in waiting}
        running = list(running)
        running_ids = {req.rid for req in running}
        for rid in [rid for rid in self._entries if rid not in waiting_ids and rid not in running_ids]:
            entry = self._entries[rid]
            if complete or entry.req.finished() or not self.admission.is_active(rid):
                self._drop(rid)
        for req in running:
            self._ensure_active(req)
        for req in waiting:
            self._ensure_waiting(req)
            self._number(req)
        return self._num_changes

    def clear(self) -> None:
        for rid in list(self._entries):
            self._drop(rid)

    def forget(self) -> None:
        """Forget every request without telling the admission component (which forgot them itself), as a new
        mirror would start."""
        self._entries.clear()
        self._seqs.clear()
        self._num_changes = 0
        self._next_seq = 0
        self._in_order = array("q")

    def _ensure_waiting(self, req: Any) -> None:
        entry = self._entries.get(req.rid)
        if entry is None:
            self._enqueue(req)
        elif entry.req is not req or entry.num_tokens != num_tokens_of(req):
            self._enqueue(req, again=True)
        elif self.admission.is_active(req.rid):
            self.admission.retract(req.rid)
            self._num_changes += 1

    def _ensure_active(self, req: Any) -> None:
        entry = self._entries.get(req.rid)
        if entry is not None and entry.req is not req:
            self._drop(req.rid)
            entry = None
        if entry is None and not self._enqueue(req):
            return
        if self.admission.is_waiting(req.rid):
            self.admission.activate(req.rid)
            self._num_changes += 1

    def _enqueue(self, req: Any, *, again: bool = False) -> bool:
        """Insert as WAITING; `again` replaces a known request's prompt and keeps its arrival time."""
        ids = token_ids_of(req)
        if not len(ids):
            if again:
                self._drop(req.rid)
            return False
        namespace = namespace_of(req)
        if again:
            self.admission.requeue(req.rid, ids, namespace=namespace)
        else:
            self.admission.enqueue(req.rid, ids, namespace=namespace)
        replaced = self._entries.get(req.rid)
        if replaced is not None:
            self.take_out(replaced.req)
            self._seqs.pop(replaced.req, None)
        self._entries[req.rid] = _Entry(req=req, num_tokens=num_tokens_of(req))
        self._num_changes += 1
        return True

    def _drop(self, rid: Any) -> None:
        req = self._entries.pop(rid).req
        self.take_out(req)
        self._seqs.pop(req, None)
        self._num_changes += 1
        self.admission.leave(rid)
