"""The page translator (`PageRuns`) against a brute-force model, event by event, and its checks of SGLang's input."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from sglang_feather.cht.errors import InvalidPages, InvalidTokens
from sglang_feather.sglang.page_runs import PageRuns


def digest(tokens) -> int:
    return xxhash.xxh64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens))


def is_page(page) -> bool:
    """A page hash is any integer, an int or a numpy integer (SGLang's are signed 64-bit); not a bool."""
    return (type(page) is int) or isinstance(page, np.integer)


class PageModel:
    """Brute force: each page's whole chain (every token from the prompt's start to its chain's end) and its
    offset; every hash is the xxh64 of a whole prefix, computed from scratch. A malformed event returns the
    error class the translator must raise."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk = chunk_size
        self.pages: dict[int, tuple[tuple[int, ...], int, int]] = {}

    def store(self, parent, pages, tokens, page_size):
        if not all(map(is_page, pages)) or not (parent is None or is_page(parent)):
            return InvalidPages
        if not (type(page_size) is int and 1 <= page_size < 2**32):
            return InvalidPages
        if not all(isinstance(t, int | np.integer) and 0 <= t < 2**32 for t in tokens):
            return InvalidTokens
        if not (len(pages) - 1) * page_size < len(tokens) <= len(pages) * page_size:
            return InvalidPages
        if len(set(map(int, pages))) != len(pages):
            return InvalidPages
        pages = list(map(int, pages))
        if parent is None:
            before = ()
        else:
            if parent not in self.pages:
                return None
            chain, offset, size = self.pages[parent]
            if offset + size > len(chain):
                return None
            before = chain[: offset + size]
        full, start, c = before + tuple(tokens), len(before), self.chunk
        stored = [digest(full[:b]) for b in range(c, len(full) + 1, c) if b > start]
        ends_before = [b for b in range(c, start + 1, c)]
        for i, page in enumerate(pages):
            self.pages[page] = (full, start + i * page_size, page_size)
        return stored, digest(full[: ends_before[-1]]) if ends_before else None

    def remove(self, pages):
        if not all(map(is_page, pages)):
            return InvalidPages
        gone = []
        for page in map(int, pages):
            if page not in self.pages:
                continue
            chain, offset, _size = self.pages.pop(page)
            end = offset - offset % self.chunk + self.chunk
            if end <= len(chain) and digest(chain[:end]) not in gone:
                gone.append(digest(chain[:end]))
        return gone

    def clear(self):
        self.pages.clear()


def spread(n: int) -> int:
    """Page id n as an int64 that uses every bit (negative half included), as SGLang's hashes do."""
    return ((n * 0x9E3779B97F4A7C15) & (2**64 - 1)) - 2**63


tokens_st = st.lists(st.integers(0, 5) | st.integers(2**30 - 2, 2**32 - 1), min_size=1, max_size=40)


def applied(event, *args):
    """What the translator's event returns, or the class of the CHT error it raised."""
    try:
        return event(*args)
    except (InvalidPages, InvalidTokens) as err:
        return type(err)


class TranslatorVsModel(RuleBasedStateMachine):
    @initialize(chunk=st.sampled_from([1, 3, 4, 8, 12, 16]), page=st.sampled_from([1, 2, 3, 4]))
    def start(self, chunk, page):
        self.page = page
        self.runs = PageRuns(chunk)
        self.model = PageModel(chunk)
        self.next_page = 0
        self.chains: list[list[int]] = []

    def new_pages(self, n):
        pages = [spread(self.next_page + i) for i in range(n)]
        self.next_page += n
        return pages

    def store(self, parent, pages, tokens, page_size=None):
        size = self.page if page_size is None else page_size
        expected = self.model.store(parent, pages, tokens, size)
        assert applied(self.runs.store, parent, pages, tokens, size) == expected
        if isinstance(expected, tuple):
            self.chains.append(list(pages))

    def filled(self, n, data):
        """Tokens that fill n pages (the last one partly or wholly)."""
        extra = data.draw(st.integers(1, self.page))
        return data.draw(
            st.lists(
                st.integers(0, 5), min_size=(n - 1) * self.page + extra, max_size=(n - 1) * self.page + extra
            )
        )

    @rule(n=st.integers(1, 6), data=st.data())
    def store_at_start(self, n, data):
        self.store(None, self.new_pages(n), self.filled(n, data))

    @rule(n=st.integers(1, 6), data=st.data())
    def store_below(self, n, data):
        if not self.model.pages:
            return
        parent = data.draw(st.sampled_from(sorted(self.model.pages)))
        self.store(parent, self.new_pages(n), self.filled(n, data))

    @rule(n=st.integers(1, 3), data=st.data())
    def store_again(self, n, data):
        """Pages already mapped stored again (they move to the new chain)."""
        if not self.model.pages:
            return
        known = sorted(self.model.pages)
        pages = data.draw(
            st.lists(st.sampled_from(known), min_size=1, max_size=min(n, len(known)), unique=True)
        )
        parent = data.draw(st.none() | st.sampled_from(sorted(self.model.pages)))
        self.store(parent, pages, self.filled(len(pages), data))

    @rule(tokens=tokens_st, data=st.data())
    def store_malformed(self, tokens, data):
        """Refused whole, by the translator as by the model: an unknown parent (None), unfilled pages, a page
        twice, bad token ids, bad page hashes or page sizes (the CHT's errors); numpy integers are integers."""
        n = max(1, -(-len(tokens) // self.page))
        pages = self.new_pages(n)
        kinds = ["unknown parent", "short", "long", "twice", "bad id", "bad page", "bad size", "numpy", "any"]
        kind = data.draw(st.sampled_from(kinds))
        if kind == "unknown parent":
            self.store(spread(10**9 + self.next_page), pages, tokens)
        elif kind == "short":
            self.store(None, pages + self.new_pages(1), tokens)
        elif kind == "long":
            self.store(None, pages, tokens + [1] * self.page)
        elif kind == "twice":
            self.store(None, pages + [pages[0]], tokens + [1] * self.page)
        elif kind == "bad id":
            self.store(None, pages, tokens[:-1] + [data.draw(st.sampled_from([-1, 2**32, 2**40, 1.0]))])
        elif kind == "bad page":
            bad = data.draw(st.sampled_from([1.0, float(pages[0]), None, "1", [1], True, np.float64(2)]))
            self.store(None, pages[:-1] + [bad], tokens)
        elif kind == "bad size":
            self.store(None, pages, tokens, data.draw(st.sampled_from([0, -1, 1.5, float(self.page), 2**32])))
        elif kind == "numpy":
            parent = data.draw(st.none() | st.sampled_from(sorted(self.model.pages) or [None]))
            self.store(None if parent is None else np.int64(parent), [np.int64(p) for p in pages], tokens)
        else:
            self.store(None, pages, tokens)  # well formed or not, as drawn

    @rule(data=st.data())
    def remove_chain_part(self, data):
        """A stored chain's consecutive pages from some point on (an evicted node after a split)."""
        if not self.chains:
            return
        run = data.draw(st.sampled_from(self.chains))
        lo = data.draw(st.integers(0, len(run) - 1))
        hi = data.draw(st.integers(lo + 1, len(run)))
        self.remove(run[lo:hi])

    @rule(data=st.data())
    def remove_any(self, data):
        known = sorted(self.model.pages)
        pool = known + [spread(10**9 + 1), 2**70, None, [1], 1.0, True] + [np.int64(p) for p in known[:2]]
        pool += [float(p) for p in known[:2]]
        self.remove(data.draw(st.lists(st.sampled_from(pool), max_size=8)))

    def remove(self, pages):
        assert applied(self.runs.remove, pages) == self.model.remove(pages)

    @rule()
    def clear(self):
        self.model.clear()
        self.runs.clear()

    @invariant()
    def agree(self):
        if not hasattr(self, "runs"):
            return
        self.runs.check_invariants()
        assert self.runs.num_pages == len(self.model.pages)


MAX_EXAMPLES = 50 if os.environ.get("FEATHER_TEST_FAST") == "1" else 150
"""Sequences per run: each drives the translator and hashes every page's whole prefix from scratch in the model."""


def test_the_translator_matches_the_model():
    run_state_machine_as_test(
        TranslatorVsModel,
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_a_resume_mid_chain_gives_the_prefix_hashes():
    """A chain stored below a page inside an earlier chain (SGLang split a node there) hashes as the whole
    prefix does, with the chunk before it, on a chunk size that is no multiple of xxh64's 8-token stripe."""
    runs = PageRuns(5)
    first = list(range(100, 123))
    assert runs.store(None, [1, 2, 3, 4, 5, 6], first, 4) == (
        [digest(first[:b]) for b in (5, 10, 15, 20)],
        None,
    )
    chain, before = runs.store(3, [7, 8], [9] * 8, 4)  # below page 3: tokens [0, 12) then 8 new ones
    assert before == digest(first[:10])
    assert chain == [digest(first[:12] + [9] * 3), digest(first[:12] + [9] * 8)]
    assert runs.remove([4, 5, 6]) == [digest(first[:15]), digest(first[:20])]
    assert runs.remove([4]) == [] and runs.num_pages == 5
    runs.check_invariants()


def test_memory_goes_with_the_last_page():
    runs = PageRuns(4)
    for n in range(200):
        runs.store(None, [n * 10 + i for i in range(8)], [n] * 32, 4)
        assert runs.remove([n * 10 + i for i in range(8)])
    assert runs.num_pages == 0 and not runs._runs


def stored_pages(runs: PageRuns) -> dict:
    return {page: id(run) for page, run in runs._runs.items()}


def test_numpy_integer_page_hashes_are_page_hashes():
    """A page hash is an integer, whatever its Python type: numpy integers (a list of them, or an array) name
    the same pages as ints, as a parent too, and evict them; so does an int beyond int64."""
    as_ints, as_numpy = PageRuns(4), PageRuns(4)
    expected = as_ints.store(None, [1, -(2**63)], [5] * 8, 4)
    assert as_numpy.store(None, [np.int64(1), np.int64(-(2**63))], [5] * 8, 4) == expected
    assert as_ints.store(1, [3], [6] * 4, 4) == as_numpy.store(
        np.int64(1), np.array([3], np.uint64), [6] * 4, 4
    )
    assert (
        as_numpy.remove(np.array([1, 3]))
        == as_ints.remove([1, 3])
        == [digest([5] * 4), digest([5] * 4 + [6] * 4)]
    )
    assert as_numpy.num_pages == as_ints.num_pages == 1
    assert as_ints.store(None, [2**70], [7] * 4, 4) == ([digest([7] * 4)], None)
    assert as_ints.remove([2**70]) == [digest([7] * 4)]


@pytest.mark.parametrize(
    "pages",
    [
        [1, 2.0],
        [1.0, 2],
        [1, True],
        [1, None],
        [1, "2"],
        [1, [2]],
        "12",
        np.array([1.0, 2.0]),
        12,
    ],
)
def test_a_store_with_pages_that_are_no_integers_raises_and_changes_nothing(pages):
    runs = PageRuns(4)
    runs.store(None, [7], [1] * 4, 4)
    before = stored_pages(runs)
    with pytest.raises(InvalidPages, match="page hashes"):
        runs.store(None, pages, [5] * 8, 4)
    assert stored_pages(runs) == before


@pytest.mark.parametrize("page_size", [1.5, 4.0, 0, -4, 2**32, None, "4"])
def test_a_page_size_that_is_no_integer_in_range_raises_and_changes_nothing(page_size):
    """`page_size=1.5` was stored by one twin and refused by the other: now both of its uses refuse it alike."""
    runs = PageRuns(4)
    with pytest.raises(InvalidPages, match="page size"):
        runs.store(None, [1, 2], [5] * 3, page_size)
    assert runs.num_pages == 0


def test_float_page_hashes_evict_nothing():
    """A float that equals a stored page's hash evicted it on one twin only: now the event raises, and the page
    stays cached."""
    runs = PageRuns(4)
    runs.store(None, [1, 2], [5] * 8, 4)
    for pages in ([1.0], [2, 1.0], np.array([1.0])):
        with pytest.raises(InvalidPages):
            runs.remove(pages)
    assert runs.num_pages == 2
    assert runs.remove([2, 1]) == [digest([5] * 8), digest([5] * 4)]


@pytest.mark.parametrize(
    ("tokens", "error", "match"),
    [
        ([5] * 9, InvalidPages, "do not fill"),
        ([5] * 4, InvalidPages, "do not fill"),
        ([5] * 7 + [2**32], InvalidTokens, "2\\*\\*32"),
        ([5] * 7 + [1.0], InvalidTokens, "integers"),
        ([5] * 7 + [-1], InvalidTokens, "2\\*\\*32"),
    ],
)
def test_tokens_that_do_not_fill_the_pages_or_are_no_token_ids_raise(tokens, error, match):
    runs = PageRuns(4)
    with pytest.raises(error, match=match):
        runs.store(None, [1, 2], tokens, 4)
    with pytest.raises(InvalidPages, match="repeats"):
        runs.store(None, [1, 1], [5] * 8, 4)
    assert runs.num_pages == 0


def test_a_chain_below_a_page_it_does_not_hold_is_not_placed():
    """Well formed but not placeable (SGLang stored the parent before the translator started): None, nothing
    changed; a parent that is no integer is malformed."""
    runs = PageRuns(4)
    assert runs.store(99, [1], [5] * 4, 4) is None
    with pytest.raises(InvalidPages, match="parent"):
        runs.store(1.0, [1], [5] * 4, 4)
    with pytest.raises(InvalidPages, match="parent"):
        runs.store("1", [1], [5] * 4, 4)
    assert runs.num_pages == 0
