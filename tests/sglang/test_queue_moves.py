"""`QueueMirror.take_out_block` against moving the requests one at a time, and refusing what it cannot do."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_feather.sglang.mirror import QueueMirror


class _Admission:
    """What the mirror tells the admission component, ignored: only the queue numbers matter here."""

    def enqueue(self, rid, ids, namespace=None) -> None: ...

    def leave(self, rid) -> None: ...

    def is_active(self, rid) -> bool:
        return False


@dataclass(eq=False)
class _Req:
    rid: int
    origin_input_ids: list = field(default_factory=lambda: [1, 2, 3])
    output_ids: list = field(default_factory=list)


@st.composite
def blocks(draw):
    """(requests before the sorted part, which requests left the queue, the ranks of the block's requests)."""
    num_head = draw(st.integers(0, 5))
    num_queued = draw(st.integers(1, 60))
    left = draw(st.lists(st.booleans(), min_size=num_queued, max_size=num_queued))
    num_sorted = num_queued - sum(left)
    ranks = draw(st.lists(st.integers(0, max(num_sorted - 1, 0)), unique=True, max_size=num_sorted))
    return num_head, left, ranks


def mirrored(num_head: int, left: list[bool]) -> tuple[QueueMirror, list]:
    """A mirror of a queue of `len(left)` requests (those marked left gone again, leaving gaps in the queue
    numbers) behind `num_head` requests Feather moved to its head."""
    mirror = QueueMirror(_Admission())
    head = [_Req(-1 - i) for i in range(num_head)]
    queue = []
    for rid, gone in enumerate(left):
        req = _Req(rid)
        mirror.queued(req)
        if gone:
            mirror.left(req)
        else:
            queue.append(req)
    return mirror, head + queue


def one_at_a_time(queue: list, slot: int, reqs: list, mirror: QueueMirror) -> array:
    """The reference: each request popped and inserted at the next slot, its queue number deleted."""
    in_order = array("q", (mirror.seq(req) for req in queue[slot:]))
    for req in reqs:
        queue.insert(slot, queue.pop(queue.index(req, slot)))
        del in_order[in_order.index(mirror.seq(req))]
        slot += 1
    return in_order


@settings(max_examples=300, deadline=None)
@given(blocks())
def test_a_block_lands_as_if_moved_one_at_a_time(block):
    num_head, left, ranks = block
    mirror, queue = mirrored(num_head, left)
    reqs = [queue[num_head + rank] for rank in ranks]
    expected_queue = list(queue)
    expected_order = one_at_a_time(expected_queue, num_head, reqs, mirror)
    assert mirror.take_out_block(queue, num_head, [req.rid for req in reqs]) == reqs
    assert all(a is b for a, b in zip(queue, expected_queue, strict=True))
    mirror.check_in_order(queue[num_head + len(reqs) :])
    assert [mirror.seq(req) for req in queue[num_head + len(reqs) :]] == list(expected_order)


@settings(max_examples=200, deadline=None)
@given(blocks(), st.data())
def test_a_request_not_where_its_number_says_changes_nothing(block, data):
    num_head, left, ranks = block
    mirror, queue = mirrored(num_head, left)
    if not ranks:
        return
    reqs = [queue[num_head + rank] for rank in ranks]
    i = data.draw(st.integers(0, len(ranks) - 1))
    where = data.draw(st.sampled_from(["out of place", "taken out", "not kept"]))
    if where == "out of place":  # SGLang's loop moved it: it is no longer where its rank says
        j = queue.index(reqs[i])
        queue.insert(data.draw(st.sampled_from([0, len(queue)])), queue.pop(j))
    elif where == "taken out":  # Feather moved it to the head already: the mirror has no number for it
        mirror.take_out(reqs[i])
    else:
        mirror.forget_order()
    before = list(queue)
    numbers = [mirror.seq(req) for req in queue]
    moved = mirror.take_out_block(queue, num_head, [req.rid for req in reqs])
    if moved is not None:  # a request moved to where it already was (or to an end it already had) still fits
        assert where == "out of place"
        return
    assert all(a is b for a, b in zip(queue, before, strict=True))
    assert [mirror.seq(req) for req in queue] == numbers
