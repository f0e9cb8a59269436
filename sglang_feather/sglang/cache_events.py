"""SGLang's KV-cache events (one hash per page) as the cache tier's chunk events, and the tap that drains them."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sglang_feather.cht.errors import InvalidPages, InvalidTokens
from sglang_feather.sglang.page_runs import PageRuns

logger = logging.getLogger(__name__)

# How it works.
#
# SGLang's tree cache (its Rust radix tree or its Python one) records `BlockStored` (a chain of pages below a
# parent page, with their token ids), `BlockRemoved` (the pages of an evicted node) and `AllBlocksCleared`
# once its recorder is enabled; the plugin enables it for `--schedule-policy feather`. Page hashes are
# SGLang's own (SHA-256, position-aware), so they cannot be turned into the CHT's chunk hashes by themselves:
# the translator hands each event's pages and tokens to `PageRuns` (page_runs.py), which checks the event,
# keeps every stored chain's hashing state and returns the chunk chain a store caches, or the chunks an
# eviction uncaches, in O(the event's pages and tokens + one chunk). SGLang's Rust radix tree reports a node per
# event, the Python one a page per event. Events for another storage medium (HiCache's host tier), a cache
# salt or a LoRA adapter's namespace, chains below a page never seen, and malformed events (`PageRuns` raises
# the CHT's `InvalidPages` or `InvalidTokens`: bigram (EAGLE) pages, tokens that do not fill their pages, page
# hashes that are no int64) are counted and skipped: Feather ranks only default-namespace prompts by what the
# device cache holds.

GPU_MEDIUM = "GPU"


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
        self.runs = PageRuns(chunk_size)
        self._handlers: dict[str, Callable[[Any], None]] = {
            "BlockStored": self._stored,
            "BlockRemoved": self._removed,
            "AllBlocksCleared": self._cleared,
        }

    @property
    def num_pages(self) -> int:
        return self.runs.num_pages

    def feed(self, events: Iterable[Any]) -> None:
        for event in events:
            handler = self._handlers.get(type(event).__name__)
            if handler is None:
                self.counts.num_skipped += 1
            else:
                handler(event)

    def _stored(self, event: Any) -> None:
        stored = None
        if _on_device(event) and not event.cache_salt and not getattr(event, "lora_name", None):
            try:
                stored = self.runs.store(
                    event.parent_block_hash, event.block_hashes, event.token_ids, event.block_size
                )
            except (InvalidPages, InvalidTokens) as err:
                logger.debug("Feather skipped a malformed BlockStored event: %s", err)
        if stored is None:
            self.counts.num_skipped += 1
            return
        self.counts.num_stored += 1
        chain, chunk_before = stored
        if chain:
            self.admission.cache_stored(chain, chunk_before)

    def _removed(self, event: Any) -> None:
        if not _on_device(event):
            self.counts.num_skipped += 1
            return
        try:
            gone = self.runs.remove(event.block_hashes)
        except InvalidPages as err:
            logger.debug("Feather skipped a malformed BlockRemoved event: %s", err)
            self.counts.num_skipped += 1
            return
        self.counts.num_removed += 1
        if gone:
            self.admission.cache_removed(gone)

    def _cleared(self, _event: Any) -> None:
        self.runs.clear()
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
        source = event_source(tree_cache)
        self._take, self._convert = source.take, source.convert
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
        if self._convert is not None:
            events = self._convert(events)
        self.translator.feed(events)
        if self._publish:
            self._pending.extend(events)

    def take_for_publisher(self) -> list[Any]:
        self.drain()
        events, self._pending = self._pending, []
        return events


RUST_EVENT_PATH = (
    "UnifiedRadixCache.take_events",
    "RustUnifiedTreeCore.take_events",
    "_RustKVCacheEventRecorder.take",
)
"""The calls SGLang 0.5.23's `take_events` makes down to the event queue of SGLang's Rust radix tree, by qualified name."""


@dataclass(frozen=True)
class EventSource:
    """Where a drain reads the cache's KV events: `take()` returns them as the queue holds them, and `convert`
    (None: they need nothing) turns a non-empty batch into what the cache's `take_events` returns."""

    take: Callable[[], list[Any]]
    convert: Callable[[list[Any]], list[Any]] | None = None


def event_source(tree_cache: Any) -> EventSource:
    """What drains the cache's KV events, returning what its `take_events` would: on SGLang 0.5.23's Rust radix
    tree, its binding's queue, converted by SGLang's own converter only when it holds events (a drain that
    finds none, most of them, then costs one call into Rust instead of four Python frames: about 10 µs of a
    cold pass); on any other cache, or any other path down to that queue, `take_events` itself."""
    tree_core = getattr(tree_cache, "tree_core", None)
    recorder = getattr(tree_core, "kv_events", None)
    path = tuple(
        getattr(getattr(type(owner), name, None), "__qualname__", None)
        for owner, name in ((tree_cache, "take_events"), (tree_core, "take_events"), (recorder, "take"))
    )
    binding = getattr(recorder, "_binding", None)
    convert = getattr(sys.modules.get(type(recorder).__module__), "_kv_event_from_tagged", None)
    if path != RUST_EVENT_PATH or recorder is None or binding is None or convert is None:
        return EventSource(tree_cache.take_events)

    def converted(raw: list[Any]) -> list[Any]:
        return [convert(event, recorder._lora_names, recorder._dynamo_format) for event in raw]

    return EventSource(binding.take_events, converted)


def events_enabled(tree_cache: Any) -> bool:
    """Whether the tree cache records KV events (its recorder was built enabled)."""
    if tree_cache is None or getattr(tree_cache, "disable", False):
        return False
    owner = getattr(tree_cache, "tree_core", tree_cache)
    recorder = getattr(owner, "kv_events", None)
    return bool(getattr(recorder, "enabled", False))
