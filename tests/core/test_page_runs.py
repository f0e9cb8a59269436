"""The two page translators (compiled `PageRuns`, Python twin) against a brute-force model, event by event."""

from __future__ import annotations

import os
import struct

import pytest
import xxhash
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from sglang_feather.sglang.page_runs import NativePageRuns, PythonPageRuns

INT64 = range(-(2**63), 2**63)


def digest(tokens) -> int:
    return xxhash.xxh64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens))


class PageModel:
    """Brute force: each page's whole chain (every token from the prompt's start to its chain's end) and its
    offset; every hash is the xxh64 of a whole prefix, computed from scratch."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk = chunk_size
        self.pages: dict[int, tuple[tuple[int, ...], int, int]] = {}

    def store(self, parent, pages, tokens, page_size):
        ok_pages = (
            pages and all(type(p) is int and p in INT64 for p in pages) and len(set(pages)) == len(pages)
        )
        ok_tokens = all(type(t) is int and 0 <= t < 2**32 for t in tokens)
        if (
            not ok_pages
            or not ok_tokens
            or not (len(pages) - 1) * page_size < len(tokens) <= len(pages) * page_size
        ):
            return None
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
        gone = []
        for page in pages:
            if type(page) is not int or page not in self.pages:
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


class TwinsVsModel(RuleBasedStateMachine):
    @initialize(chunk=st.sampled_from([1, 3, 4, 8, 12, 16]), page=st.sampled_from([1, 2, 3, 4]))
    def start(self, chunk, page):
        self.page = page
        self.twins = [PythonPageRuns(chunk), NativePageRuns(chunk)]
        self.model = PageModel(chunk)
        self.next_page = 0
        self.runs: list[list[int]] = []

    def new_pages(self, n):
        pages = [spread(self.next_page + i) for i in range(n)]
        self.next_page += n
        return pages

    def store(self, parent, pages, tokens, page_size=None):
        size = self.page if page_size is None else page_size
        expected = self.model.store(parent, pages, tokens, size)
        for twin in self.twins:
            assert twin.store(parent, pages, tokens, size) == expected, type(twin).__name__
        if expected is not None:
            self.runs.append(list(pages))

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
        """Refused whole, by all three alike: an unknown parent, unfilled pages, a page twice, bad token ids."""
        n = max(1, -(-len(tokens) // self.page))
        pages = self.new_pages(n)
        kind = data.draw(st.sampled_from(["unknown parent", "short", "long", "twice", "bad id", "any"]))
        if kind == "unknown parent":
            self.store(spread(10**9 + self.next_page), pages, tokens)
        elif kind == "short":
            self.store(None, pages + self.new_pages(1), tokens)
        elif kind == "long":
            self.store(None, pages, tokens + [1] * self.page)
        elif kind == "twice":
            self.store(None, pages + [pages[0]], tokens + [1] * self.page)
        elif kind == "bad id":
            self.store(None, pages, tokens[:-1] + [data.draw(st.sampled_from([-1, 2**32, 2**40]))])
        else:
            self.store(None, pages, tokens)  # well formed or not, as drawn

    @rule(data=st.data())
    def remove_chain_part(self, data):
        """A stored chain's consecutive pages from some point on (an evicted node after a split)."""
        if not self.runs:
            return
        run = data.draw(st.sampled_from(self.runs))
        lo = data.draw(st.integers(0, len(run) - 1))
        hi = data.draw(st.integers(lo + 1, len(run)))
        self.remove(run[lo:hi])

    @rule(data=st.data())
    def remove_any(self, data):
        known = sorted(self.model.pages)
        pool = known + [spread(10**9 + 1), 2**70, None, [1]]
        self.remove(data.draw(st.lists(st.sampled_from(pool), max_size=8)))

    def remove(self, pages):
        expected = self.model.remove(pages)
        for twin in self.twins:
            assert twin.remove(pages) == expected, type(twin).__name__

    @rule()
    def clear(self):
        self.model.clear()
        for twin in self.twins:
            twin.clear()

    @invariant()
    def agree(self):
        if not hasattr(self, "twins"):
            return
        for twin in self.twins:
            twin.check_invariants()
            assert twin.num_pages == len(self.model.pages), type(twin).__name__


MAX_EXAMPLES = 50 if os.environ.get("FEATHER_TEST_FAST") == "1" else 150
"""Sequences per run: each drives both twins and hashes every page's whole prefix from scratch in the model."""


def test_twins_match_the_model():
    run_state_machine_as_test(
        TwinsVsModel,
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize("twin", [PythonPageRuns, NativePageRuns])
def test_a_resume_mid_chain_gives_the_prefix_hashes(twin):
    """A chain stored below a page inside an earlier chain (SGLang split a node there) hashes as the whole
    prefix does, with the chunk before it, on a chunk size that is no multiple of xxh64's 8-token stripe."""
    runs = twin(5)
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


@pytest.mark.parametrize("twin", [PythonPageRuns, NativePageRuns])
def test_memory_goes_with_the_last_page(twin):
    runs = twin(4)
    for n in range(200):
        runs.store(None, [n * 10 + i for i in range(8)], [n] * 32, 4)
        assert runs.remove([n * 10 + i for i in range(8)])
    assert runs.num_pages == 0
    if twin is NativePageRuns:
        assert runs._runs.num_runs == 0
    else:
        assert not runs._runs


def test_the_compiled_twin_refuses_page_hashes_outside_int64():
    """SGLang's page hashes are signed 64-bit ints; the compiled twin refuses anything else whole (the Python
    twin keys a dict by whatever it is given)."""
    runs = NativePageRuns(4)
    for bad in (2**63, -(2**63) - 1, 2**70, 1.0, True, "1"):
        assert runs.store(None, [1, bad], [5] * 8, 4) is None
        assert runs.store(bad, [2], [5] * 4, 4) is None
    assert runs.num_pages == 0
    assert PythonPageRuns(4).store(None, [1, [2]], [5] * 8, 4) is None, "an unhashable page, refused"
    assert runs.store(None, [2**63 - 1, -(2**63)], [5] * 8, 4) == ([digest([5] * 4), digest([5] * 8)], None)
    assert runs.remove([2**70, None, [1], 2**63 - 1]) == [digest([5] * 4)]
    runs.check_invariants()
