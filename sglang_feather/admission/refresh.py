"""Which waiting requests' cached prefixes an engine refreshes in its LRU each pass, so they outlive what no one waits for."""

from __future__ import annotations

from collections.abc import Iterable

from sglang_feather.cht import ChunkedHashTree
from sglang_feather.types import RequestId

REFRESH_WINDOW = 128
"""Queue entries looked at per pass: SGLang 0.5.23's bound on per-pass prefix work on the waiting queue
(`schedule_policy.WAITING_QUEUE_PREFIX_MATCH_MAX`)."""

# How it works.
#
# An engine's prefix cache evicts the least recently used unlocked prefix first, and a prefix is used when a
# request matches it. SGLang's cache-aware policies match every waiting request each pass, and its FCFS touches
# the head of the queue every 32 passes, so the prefixes a queue waits for stay young. Feather matches nothing:
# its ranking serves the groups that run first, and a group waiting for its turn then holds a cached prefix
# older than the private tails that finished requests leave behind, so LRU evicts the prefix a whole group
# will need and keeps tails no one will (where the pool binds: issue 49's two grid cells below 0.98). So each
# pass the engine refreshes, among the first REFRESH_WINDOW requests of its queue, the cached prefix of the
# first request of each distinct deepest cached chunk that holds more than running requests lock (a running
# prefix is locked, an uncached one has nothing to refresh), in the reverse of the order the ranking would
# serve them (the deepest, then the heaviest group, then the queue's head, is touched last), so LRU evicts
# what waits in the reverse of the order Feather will need it. A pass costs one tree query over at most
# REFRESH_WINDOW ids (`cached_frontier`, in the compiled tree one call) and one touch per prefix; while no
# cached prefix that no running request holds has a waiting request (the tree counts them), the query reads
# no id, so the queue's head is not read either (`queue_head` is consumed lazily).


def prefixes_to_refresh(tree: ChunkedHashTree, queue_head: Iterable[RequestId]) -> list[RequestId]:
    """Of the engine's waiting queue (its head, in queue order), one request per cached prefix to refresh, in
    refresh order: the last one the most recently (see "how it works"). Untracked or running ids are ignored."""
    return tree.cached_frontier(queue_head, REFRESH_WINDOW)[::-1]
