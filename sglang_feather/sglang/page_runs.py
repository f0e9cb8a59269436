"""SGLang's KV-cache pages as the CHT's chunks: each stored chain of pages keeps its hashing state."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import xxhash

from sglang_feather.cht.errors import InvalidPages
from sglang_feather.cht.hashing import token_bytes
from sglang_feather.types import ChunkHash

# How it works. An engine that pages its KV cache reports a stored chain of pages (below a parent page, with
# their token ids) and the pages it evicts, each named by the engine's opaque 64-bit hash; the cache tier wants
# chunk hashes (the xxh64 of every token up to a chunk boundary). Each stored chain becomes a `_Run`: its start
# offset, the xxh64 state over every token before it, the chunk that ends at or before its start, its token
# bytes, and the hash of every chunk that ends inside it. A page hash maps to its run (one dict, filled and
# emptied a whole event at a time by C-level calls: no Python frame per page), and the run knows the page's
# index. A chain below a page of an earlier run resumes that run's state at the page's end, so an event costs
# O(its pages + tokens + one chunk), never a re-hash of its prefix. A chunk is cached once the page holding its
# last token is; evicting a page uncaches the chunk its first token belongs to, if that chunk ends in the
# page's run (the cache tier drops whatever extends it); a span of consecutive pages of one run (how SGLang
# lists an evicted node) takes one step per chunk, not per page. A run goes with its last mapped page. Every
# event is checked here, once, before anything changes: page hashes are integers (SGLang's are signed 64-bit
# ints; numpy integers count, bools and floats do not: a float equal to a page's hash would name it), a page
# size an integer in [1, 2**32), token ids as the CHT's insert takes them, the tokens fill the pages and no
# page repeats within a chain; anything else raises the CHT's `InvalidPages` or `InvalidTokens` with nothing
# changed. A chain below a page the translator does not
# hold (stored before it started, or past its run's tokens) is well formed but cannot be placed: `store`
# returns None.

_Stored = tuple[list[ChunkHash], ChunkHash | None]
_INT = {int}


def checked_pages(pages: Iterable[int] | np.ndarray) -> list[int]:
    """An event's page hashes as a list of ints: each an integer (an int or a numpy integer; not a bool, a
    float or anything else), else `InvalidPages`. The engine's hashes are opaque keys, so any integer names a
    page; a list of ints is checked by one C-level pass over the types of its items."""
    if isinstance(pages, np.ndarray):
        if pages.ndim != 1 or (pages.size and pages.dtype.kind not in "iu"):
            raise InvalidPages(f"page hashes must be 1-D integers, got {pages.dtype} of shape {pages.shape}")
        return pages.tolist()
    if isinstance(pages, str | bytes):
        raise InvalidPages(f"page hashes must be a sequence of integers, got {type(pages).__name__}")
    try:
        listed = pages if type(pages) is list else list(pages)
    except TypeError:
        raise InvalidPages(
            f"page hashes must be a sequence of integers, got {type(pages).__name__}"
        ) from None
    types = set(map(type, listed))
    if types <= _INT:
        return listed
    if not all(issubclass(kind, np.integer) or kind is int for kind in types):
        odd = next(kind for kind in types if not (kind is int or issubclass(kind, np.integer)))
        raise InvalidPages(f"page hashes must be integers, got a {odd.__name__}")
    return list(map(int, listed))


def checked_page_size(page_size: int) -> int:
    """Tokens per page: an integer in [1, 2**32), else `InvalidPages`."""
    try:
        size = operator.index(page_size)
    except TypeError:
        raise InvalidPages(f"a page size is an integer, got {page_size!r}") from None
    if not 1 <= size < 2**32:
        raise InvalidPages(f"a page size lies in [1, 2**32), got {size}")
    return size


def checked_parent(parent: int | None) -> int | None:
    """A chain's parent page: None (a prompt's start) or a page hash (an integer, as `checked_pages` takes
    them), else `InvalidPages`."""
    if parent is None or type(parent) is int:
        return parent
    if not isinstance(parent, np.integer):
        raise InvalidPages(f"a parent page is an integer or None, got {parent!r}")
    return int(parent)


@dataclass(slots=True, eq=False)
class _Run:
    """One stored chain of pages."""

    start: int
    """Token offset of its first page."""
    state: Any
    """xxh64 over every token before `start`."""
    chunk_before: ChunkHash | None
    """The chunk that ends at or before `start` (None when no chunk does)."""
    tokens: bytes
    """Its token ids, 4-byte little-endian (what the CHT hashes)."""
    pages: list[int]
    page_size: int
    chunks: dict[int, ChunkHash] = field(default_factory=dict)
    """End offset -> hash of every chunk that ends inside this run."""
    positions: dict[int, int] | None = None
    """Page hash -> its index in `pages`, built on the first lookup past the first page."""

    def index(self, page: int) -> int:
        if self.pages[0] == page:  # a whole chain evicted, or a chain below its first page: no map needed
            return 0
        if self.positions is None:
            self.positions = dict(zip(self.pages, range(len(self.pages)), strict=True))
        return self.positions[page]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens) // 4

    def hash_chunks(self, chunk_size: int) -> dict[int, ChunkHash]:
        """End offset -> hash of every chunk that ends in this run, from its state and tokens (what a store
        records, and what `check_invariants` recomputes)."""
        state, hashes, offset = self.state.copy(), {}, self.start
        data = memoryview(self.tokens)
        for boundary in range(self.start - self.start % chunk_size + chunk_size, self.end + 1, chunk_size):
            state.update(data[4 * (offset - self.start) : 4 * (boundary - self.start)])
            offset = boundary
            hashes[boundary] = ChunkHash(state.intdigest())
        return hashes

    def resume(self, end: int, chunk_size: int) -> tuple[Any, ChunkHash | None]:
        """The xxh64 state over every token before `end` (inside this run) and the chunk that ends at or
        before `end`."""
        state = self.state.copy()
        state.update(memoryview(self.tokens)[: 4 * (end - self.start)])
        boundary = end - end % chunk_size
        return state, self.chunks[boundary] if boundary > self.start else self.chunk_before


class PageRuns:
    """Page chains -> chunk chains (see "how it works" above)."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.chunk_size = chunk_size
        self._runs: dict[int, _Run] = {}
        """Page hash -> the run holding that page."""

    @property
    def num_pages(self) -> int:
        return len(self._runs)

    def store(
        self, parent: int | None, pages: Sequence[int], tokens: Sequence[int], page_size: int
    ) -> _Stored | None:
        """The engine stored `pages` (holding `tokens`) below the page `parent` (None: at a prompt's start):
        the hashes of the chunks that end in the chain and the chunk before it; None when `parent` is a page
        it cannot place. `InvalidPages` / `InvalidTokens` for a malformed event, with nothing changed."""
        pages = checked_pages(pages)
        size = checked_page_size(page_size)
        parent = checked_parent(parent)
        data = token_bytes(tokens)
        num_tokens = len(data) // 4
        if not (len(pages) - 1) * size < num_tokens <= len(pages) * size:
            raise InvalidPages(f"{num_tokens} tokens do not fill {len(pages)} page(s) of {size}")
        run = _Run(0, None, None, data, list(pages), size)  # its own copy: the event's list is the engine's
        mapped = dict.fromkeys(pages, run)
        if len(mapped) != len(pages):
            raise InvalidPages("a page repeats within one stored chain")
        chunk = self.chunk_size
        if parent is None:
            run.state = xxhash.xxh64(seed=0)
        else:
            above = self._runs.get(parent)
            if above is None:
                return None
            run.start = above.start + (above.index(parent) + 1) * above.page_size
            if run.start > above.end:
                return None
            run.state, run.chunk_before = above.resume(run.start, chunk)
        run.chunks = run.hash_chunks(chunk)
        self._runs.update(mapped)
        return list(run.chunks.values()), run.chunk_before

    def remove(self, pages: Iterable[int]) -> list[ChunkHash]:
        """The engine evicted `pages`: the chunk hashes that uncaches, each once, in first-seen order (pages it
        does not hold are ignored). `InvalidPages` for a page hash that is not an integer (`checked_pages`), with
        nothing changed."""
        pages = checked_pages(pages)
        runs = list(map(self._runs.pop, pages, repeat(None, len(pages))))  # one C-level pass
        gone: dict[ChunkHash, None] = {}
        i = 0
        while i < len(pages):
            run = runs[i]
            if run is None:
                i += 1
                continue
            i += self._uncache_span(run, pages, runs, i, gone)
        return list(gone)

    def clear(self) -> None:
        self._runs.clear()

    def check_invariants(self) -> None:
        """Every mapped page is its run's, and every run's chunk hashes are its tokens' (re-hashed)."""
        from sglang_feather.cht.invariants import InvariantError

        held = {id(run): set(run.pages) for run in self._runs.values()}
        for page, run in self._runs.items():
            if page not in held[id(run)] or len(held[id(run)]) != len(run.pages):
                raise InvariantError("a page maps to a run that does not hold it once")
        for run in {id(run): run for run in self._runs.values()}.values():
            if run.hash_chunks(self.chunk_size) != run.chunks:
                raise InvariantError("a run's chunk hashes are not those of its tokens")

    def _uncache_span(
        self, run: _Run, pages: list[int], runs: list[_Run | None], i: int, gone: dict[ChunkHash, None]
    ) -> int:
        """Collect the chunks that evicting `pages[i:]` uncaches while they are consecutive pages of `run`
        (SGLang lists an evicted node's pages in order); returns how many pages that was (at least 1). Each
        page uncaches the chunk its first token belongs to, so a span takes one step per chunk where a chunk is a
        whole number of pages (as SGLang's are), and the span is found by C-level comparisons, not a loop per
        page."""
        chunk, size = self.chunk_size, run.page_size
        first = run.index(pages[i])
        span = min(len(run.pages) - first, len(pages) - i)
        if span > 1 and not (
            runs[i : i + span].count(run) == span and pages[i : i + span] == run.pages[first : first + span]
        ):
            span = 1
        lo = run.start + first * size
        hi = run.start + (first + span - 1) * size
        ends: Iterable[int]
        if chunk % size == 0:
            ends = range(lo - lo % chunk + chunk, hi - hi % chunk + chunk + 1, chunk)
        else:  # pages straddle chunk ends: only the chunks holding a page's first token go
            ends = dict.fromkeys(o - o % chunk + chunk for o in range(lo, hi + 1, size))
        for boundary in ends:
            chunk_hash = run.chunks.get(boundary)
            if chunk_hash is not None:
                gone[chunk_hash] = None
        return span
