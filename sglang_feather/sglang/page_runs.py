"""An engine's KV-cache pages as the CHT's chunks: the Python twin of the compiled `PageRuns` (page_runs.cpp)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

import xxhash

from sglang_feather.cht.errors import InvalidTokens
from sglang_feather.cht.hashing import token_bytes
from sglang_feather.types import ChunkHash

# How it works (page_runs.cpp says the same of the compiled twin). An engine that pages its KV cache reports
# a stored chain of pages (below a parent page, with their token ids) and the pages it evicts, each named by
# the engine's opaque 64-bit hash; the cache tier wants chunk hashes (the xxh64 of every token up to a chunk
# boundary). Each stored chain becomes a `_Run`: its start offset, the xxh64 state over every token before
# it, the chunk that ends at or before its start, its token bytes, and the hash of every chunk that ends
# inside it. A page hash maps to its run, and the run knows the page's index. A chain below a page of an
# earlier run resumes that run's state at the page's end. A chunk is cached once the page holding its last
# token is; evicting a page uncaches the chunk its first token belongs to, if that chunk ends in the page's
# run (the cache tier drops whatever extends it). A run goes with its last mapped page. Malformed events
# (tokens that do not fill the pages, a page named twice, a parent page never seen or past its run's
# tokens, ids outside [0, 2**32)) are refused whole and change nothing. Page hashes are the engine's int64s
# (SGLang's are signed 64-bit); the compiled twin refuses any other, this one keys a dict by whatever comes
# (checking each one cost more than the rest of a page-size-1 store).

_Stored = tuple[list[ChunkHash], ChunkHash | None]


class PageRunsLike(Protocol):
    """What both twins offer (`PythonPageRuns` here, `NativePageRuns` on the compiled one)."""

    @property
    def num_pages(self) -> int: ...
    def store(
        self, parent: int | None, pages: Sequence[int], tokens: Sequence[int], page_size: int
    ) -> _Stored | None: ...
    def remove(self, pages: Sequence[int]) -> list[ChunkHash]: ...
    def clear(self) -> None: ...
    def check_invariants(self) -> None: ...


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
        for boundary in range(self.start - self.start % chunk_size + chunk_size, self.end + 1, chunk_size):
            state.update(self.tokens[4 * (offset - self.start) : 4 * (boundary - self.start)])
            offset = boundary
            hashes[boundary] = ChunkHash(state.intdigest())
        return hashes

    def resume(self, end: int, chunk_size: int) -> tuple[Any, ChunkHash | None]:
        """The xxh64 state over every token before `end` (inside this run) and the chunk that ends at or
        before `end`."""
        state = self.state.copy()
        state.update(self.tokens[: 4 * (end - self.start)])
        boundary = end - end % chunk_size
        return state, self.chunks[boundary] if boundary > self.start else self.chunk_before


class PythonPageRuns:
    """Page chains -> chunk chains, in Python (the reference the compiled twin is tested against)."""

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
        the hashes of the chunks that end in the chain and the chunk before it, or None if refused."""
        pages = _listed(pages)
        if not pages or not 1 <= page_size < 2**32:
            return None
        try:
            data = token_bytes(tokens)
        except (InvalidTokens, TypeError):
            return None
        num_tokens = len(data) // 4
        if not (len(pages) - 1) * page_size < num_tokens <= len(pages) * page_size:
            return None
        chunk = self.chunk_size
        if parent is None:
            start, state, chunk_before = 0, xxhash.xxh64(seed=0), None
        else:
            above = self._runs.get(parent) if type(parent) is int else None
            if above is None:
                return None
            start = above.start + (above.index(parent) + 1) * above.page_size
            if start > above.end:
                return None
            state, chunk_before = above.resume(start, chunk)
        run = _Run(start, state, chunk_before, data, pages, page_size)
        try:
            mapped = dict.fromkeys(pages, run)
        except TypeError:  # an unhashable page
            return None
        if len(mapped) != len(pages):
            return None
        run.chunks = run.hash_chunks(chunk)
        self._runs.update(mapped)
        return list(run.chunks.values()), chunk_before

    def remove(self, pages: Sequence[int]) -> list[ChunkHash]:
        """The engine evicted `pages`: the chunk hashes that uncaches, each once, in first-seen order."""
        pages = _listed(pages) or []
        if set(map(type, pages)) <= {int}:  # an engine's pages (one C-level pass, then one to pop)
            runs = list(map(self._runs.pop, pages, repeat(None, len(pages))))
        else:
            runs = [self._pop(page) for page in pages]
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

    def _pop(self, page: Any) -> _Run | None:
        try:
            return self._runs.pop(page, None)
        except TypeError:  # unhashable: names no page
            return None

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
        if chunk % size == 0:
            ends = range(lo - lo % chunk + chunk, hi - hi % chunk + chunk + 1, chunk)
        else:  # pages straddle chunk ends: only the chunks holding a page's first token go
            ends = dict.fromkeys(o - o % chunk + chunk for o in range(lo, hi + 1, size))
        for boundary in ends:
            chunk_hash = run.chunks.get(boundary)
            if chunk_hash is not None:
                gone[chunk_hash] = None
        return span


def _listed(pages: Any) -> list[Any] | None:
    try:
        return list(pages)
    except TypeError:
        return None


class NativePageRuns:
    """The compiled `PageRuns` with `check_invariants` raising like the Python twin's."""

    def __init__(self, chunk_size: int) -> None:
        from sglang_feather.cht._native._core import PageRuns

        self._runs = PageRuns(chunk_size)
        self.chunk_size = chunk_size
        self.store = self._runs.store
        self.remove = self._runs.remove
        self.clear = self._runs.clear

    @property
    def num_pages(self) -> int:
        return self._runs.num_pages

    def check_invariants(self) -> None:
        from sglang_feather.cht.invariants import InvariantError

        problem = self._runs._check()
        if problem:
            raise InvariantError(problem)


def page_runs(chunk_size: int) -> PageRunsLike:
    """The twin that matches the CHT core in use (`cht.backend`): compiled with the compiled core."""
    from sglang_feather.cht.backend import backend_name

    return NativePageRuns(chunk_size) if backend_name() == "native" else PythonPageRuns(chunk_size)
