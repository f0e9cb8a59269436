"""SGLang's KV-cache events (one hash per page) as the cache tier's chunk events, and the tap that drains them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import xxhash

from sglang_feather.cht.hashing import token_bytes
from sglang_feather.types import ChunkHash

logger = logging.getLogger(__name__)

# How it works.
#
# SGLang's tree cache (the Rust tree core or the Python one) records `BlockStored` (a chain of pages below a
# parent page, with their token ids), `BlockRemoved` (the pages of an evicted node) and `AllBlocksCleared`
# once its recorder is enabled; the plugin enables it for `--schedule-policy feather`. Page hashes are
# SGLang's own (SHA-256, position-aware), so they cannot be turned into the CHT's chunk hashes by themselves:
# each stored chain becomes a `_Run` that keeps its start offset, the xxh64 state over every token before it
# (the CHT's chunk hash of a prefix is the xxh64 of all its tokens), the chunk that ends at or before its start,
# its token bytes, and the chunk hashes that end inside it. A chain below a page of an earlier run resumes that
# run's state at the page's end, so each event costs O(its tokens), never a re-hash of its prefix. A chunk is
# cached once the page holding its last token is: evicting a page uncaches the chunk that page's first token
# belongs to (the cache tier drops the chunks that extend it). Events for another storage medium (HiCache's host
# tier), a cache salt or a LoRA adapter's namespace, and chains below a page never seen, are counted and
# skipped: Feather ranks only default-namespace prompts by what the device cache holds.

GPU_MEDIUM = "GPU"


@dataclass(slots=True, eq=False)
class _Run:
    """One stored chain of pages."""

    start: int
    """Token offset of its first page."""
    state: Any
    """xxh64 over every token before `start`."""
    chunk_before: ChunkHash | None
    """The chunk that ends at or before `start` (None at the start of a prompt)."""
    tokens: bytes
    """Its token ids, 4-byte little-endian (what the CHT hashes)."""
    pages: list[int]
    page_size: int
    chunks: dict[int, ChunkHash] = field(default_factory=dict)
    """End offset -> hash of every chunk that ends inside this run."""
    positions: dict[int, int] | None = None

    def index(self, page: int) -> int:
        if self.positions is None:
            if self.pages[0] == page:  # a whole chain evicted: no map needed
                return 0
            self.positions = dict(zip(self.pages, range(len(self.pages)), strict=True))
        return self.positions[page]

    def resume(self, end: int, chunk_size: int) -> tuple[Any, ChunkHash | None]:
        """The xxh64 state over every token before `end` (inside this run) and the chunk that ends at or
        before `end`."""
        state = self.state.copy()
        state.update(self.tokens[: 4 * (end - self.start)])
        boundary = end - end % chunk_size
        return state, self.chunks[boundary] if boundary > self.start else self.chunk_before


@dataclass
class EventCounts:
    """What the translator did with the events it saw (for metrics and tests)."""

    num_stored: int = 0
    num_removed: int = 0
    num_cleared: int = 0
    num_skipped: int = 0


class EventTranslator:
    """Keeps the admission component's cache tier equal to SGLang's device cache, from its KV events."""

    def __init__(self, admission: Any, chunk_size: int) -> None:
        self.admission = admission
        self.chunk_size = chunk_size
        self.counts = EventCounts()
        self._runs: dict[int, _Run] = {}
        """SGLang page hash -> the run holding that page."""
        self._handlers: dict[str, Callable[[Any], None]] = {
            "BlockStored": self._stored,
            "BlockRemoved": self._removed,
            "AllBlocksCleared": self._cleared,
        }

    @property
    def num_pages(self) -> int:
        return len(self._runs)

    def feed(self, events: Iterable[Any]) -> None:
        for event in events:
            handler = self._handlers.get(type(event).__name__)
            if handler is None:
                self.counts.num_skipped += 1
            else:
                handler(event)

    def _stored(self, event: Any) -> None:
        if not _on_device(event) or event.cache_salt or getattr(event, "lora_name", None):
            self.counts.num_skipped += 1
            return
        chunk = self.chunk_size
        if event.parent_block_hash is None:
            start, state, chunk_before = 0, xxhash.xxh64(seed=0), None
        else:
            parent = self._runs.get(event.parent_block_hash)
            if parent is None:
                self.counts.num_skipped += 1
                return
            start = parent.start + (parent.index(event.parent_block_hash) + 1) * parent.page_size
            state, chunk_before = parent.resume(start, chunk)
        try:
            tokens = token_bytes(event.token_ids)
        except (ValueError, TypeError):
            self.counts.num_skipped += 1  # bigram (EAGLE) pages carry token pairs
            return
        run = _Run(start, state.copy(), chunk_before, tokens, list(event.block_hashes), event.block_size)
        end = start + len(tokens) // 4
        chain = []
        offset = start
        for boundary in range(start - start % chunk + chunk, end + 1, chunk):
            state.update(tokens[4 * (offset - start) : 4 * (boundary - start)])
            offset = boundary
            chunk_hash = ChunkHash(state.intdigest())
            run.chunks[boundary] = chunk_hash
            chain.append(chunk_hash)
        self._runs.update(dict.fromkeys(run.pages, run))
        self.counts.num_stored += 1
        if chain:
            self.admission.cache_stored(chain, chunk_before)

    def _removed(self, event: Any) -> None:
        if not _on_device(event):
            self.counts.num_skipped += 1
            return
        pages = list(event.block_hashes)
        runs = list(map(self._runs.pop, pages, repeat(None, len(pages))))
        gone: dict[ChunkHash, None] = {}
        i = 0
        while i < len(pages):
            run = runs[i]
            if run is None:
                i += 1
                continue
            i += self._uncache_span(run, pages, runs, i, gone)
        self.counts.num_removed += 1
        if gone:
            self.admission.cache_removed(list(gone))

    def _uncache_span(
        self, run: _Run, pages: list[int], runs: list[_Run | None], i: int, gone: dict[ChunkHash, None]
    ) -> int:
        """Collect the chunks that evicting `pages[i:]` uncaches while they are consecutive pages of `run`
        (SGLang lists an evicted node's pages in order); returns how many pages that was (at least 1). Each
        page uncaches the chunk its first token belongs to, so a span takes one step per chunk (a chunk is a
        whole number of pages), and the span is found by C-level slice comparisons, not a loop per page."""
        chunk, size = self.chunk_size, run.page_size
        first = run.index(pages[i])
        span = min(len(run.pages) - first, len(pages) - i)
        if span > 1 and not (
            runs[i : i + span].count(run) == span and pages[i : i + span] == run.pages[first : first + span]
        ):
            span = 1
        lo = run.start + first * size
        hi = run.start + (first + span - 1) * size
        for boundary in range(lo - lo % chunk + chunk, hi - hi % chunk + chunk + 1, chunk):
            chunk_hash = run.chunks.get(boundary)
            if chunk_hash is not None:
                gone[chunk_hash] = None
        return span

    def _cleared(self, _event: Any) -> None:
        self._runs.clear()
        self.counts.num_cleared += 1
        self.admission.cache_cleared()


def _on_device(event: Any) -> bool:
    medium = getattr(event, "medium", None)
    return medium is None or str(getattr(medium, "value", medium)).upper() == GPU_MEDIUM


class EventTap:
    """Drains a tree cache's KV events into the translator, and still hands them to SGLang's own publisher
    (`--kv-events-config`) when it is on: the cache's `take_events` is replaced by one that drains first."""

    def __init__(self, tree_cache: Any, translator: EventTranslator, *, publish: bool) -> None:
        self.translator = translator
        self._cache = tree_cache
        self._take = tree_cache.take_events
        self._publish = publish
        self._pending: list[Any] = []
        tree_cache.take_events = self.take_for_publisher

    def close(self) -> None:
        """Hand the cache its own `take_events` back; events not drained yet stay in the cache's queue for
        whoever drains it next (the scheduler replaces its startup runtime before serving: the new one gets
        them)."""
        if self._cache.__dict__.get("take_events") == self.take_for_publisher:
            del self._cache.take_events

    def drain(self) -> None:
        events = self._take()
        if not events:
            return
        self.translator.feed(events)
        if self._publish:
            self._pending.extend(events)

    def take_for_publisher(self) -> list[Any]:
        self.drain()
        events, self._pending = self._pending, []
        return events


def events_enabled(tree_cache: Any) -> bool:
    """Whether the tree cache records KV events (its recorder was built enabled)."""
    if tree_cache is None or getattr(tree_cache, "disable", False):
        return False
    owner = getattr(tree_cache, "tree_core", tree_cache)
    recorder = getattr(owner, "kv_events", None)
    return bool(getattr(recorder, "enabled", False))
