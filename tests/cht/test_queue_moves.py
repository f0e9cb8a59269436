"""`gather_to` (queue_moves.cpp) against moving the requests one at a time, and refusing what it cannot do."""

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cht.conftest import native_tree


def gather_to():
    native_tree()  # fails loudly (or skips under SGLANG_FEATHER_CHT=python) when the core is not built
    from sglang_feather.cht._native._core import gather_to

    return gather_to


def one_at_a_time(queue: list, slot: int, reqs: list, in_order: array) -> None:
    """The reference: each request popped and inserted at the next slot, its queue number deleted."""
    seq = {id(req): num for req, num in zip(queue[slot:], in_order, strict=True)}
    for req in reqs:
        queue.insert(slot, queue.pop(queue.index(req, slot)))
        del in_order[in_order.index(seq[id(req)])]
        slot += 1


@st.composite
def blocks(draw):
    """(requests before the sorted part, its queue numbers, the ranks of the block's requests in plan order)."""
    num_head = draw(st.integers(0, 5))
    num_sorted = draw(st.integers(1, 60))
    gaps = draw(
        st.lists(st.integers(1, 1000), min_size=num_sorted, max_size=num_sorted)
    )  # requests that left
    numbers = array("q", [sum(gaps[: i + 1]) for i in range(num_sorted)])
    ranks = draw(st.lists(st.integers(0, num_sorted - 1), unique=True, max_size=num_sorted))
    return num_head, numbers, ranks


@settings(max_examples=300, deadline=None)
@given(blocks())
def test_a_block_lands_as_if_moved_one_at_a_time(block):
    num_head, in_order, ranks = block
    queue = [object() for _ in range(num_head + len(in_order))]
    reqs = [queue[num_head + rank] for rank in ranks]
    seqs = [in_order[rank] for rank in ranks]
    expected_queue, expected_order = list(queue), array("q", in_order)
    one_at_a_time(expected_queue, num_head, reqs, expected_order)
    assert gather_to()(queue, num_head, reqs, in_order, seqs)
    del in_order[len(in_order) - len(reqs) :]
    assert all(a is b for a, b in zip(queue, expected_queue, strict=True))
    assert in_order == expected_order


@settings(max_examples=200, deadline=None)
@given(blocks(), st.data())
def test_a_request_not_where_its_number_says_changes_nothing(block, data):
    num_head, in_order, ranks = block
    if not ranks:
        return
    num_sorted = len(in_order)
    queue = [object() for _ in range(num_head + num_sorted)]
    reqs = [queue[num_head + rank] for rank in ranks]
    wrong = list(ranks)
    i = data.draw(st.integers(0, len(ranks) - 1))
    wrong[i] = data.draw(st.sampled_from([r for r in range(-1, num_sorted + 2) if r != ranks[i]]))
    before_queue, before_order = list(queue), array("q", in_order)
    seqs = [in_order[rank] for rank in ranks]
    misplaced = [queue[num_head + rank] if 0 <= rank < num_sorted else object() for rank in wrong]
    assert not gather_to()(queue, num_head, misplaced, in_order, seqs), "a request not where its number is"
    absent = [seq + 1 if i == j else seq for j, seq in enumerate(seqs)]  # numbers are at least 1 apart
    assert (absent[i] in in_order) or not gather_to()(queue, num_head, reqs, in_order, absent), (
        "a number not there"
    )
    assert all(a is b for a, b in zip(queue, before_queue, strict=True)) and in_order == before_order
