"""The Chunked Hash Tree's invariant checker: recount everything from the requests and compare."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from sglang_feather.cht.nodes import PrefixNode
    from sglang_feather.cht.tree import PythonTree


class InvariantError(AssertionError):
    """The tree's bookkeeping disagrees with a recount from its requests."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        _fail(message)


def _fail(message: str) -> NoReturn:
    raise InvariantError(message)


def check_tree(tree: PythonTree) -> None:
    """Counts, paths, node registry, shared prefix, and the lower-bound property of every lazy heap entry."""
    from sglang_feather.cht.nodes import RequestState

    num_active: Counter = Counter()
    num_waiting: Counter = Counter()
    active, nodes = tree._running.requests, tree._trie.nodes
    for rid, req in tree._requests.items():
        _require(req.id == rid, f"request {rid!r} is filed under another id")
        _require(req.state in (RequestState.WAITING, RequestState.ACTIVE), f"request {rid!r} has no state")
        _require((rid in active) == (req.state is RequestState.ACTIVE), f"active map wrong for {rid!r}")
        parent: PrefixNode | None = None
        for depth, node in enumerate(req.path, start=1):
            _require(node.is_alive and nodes.get(node.hash) is node, f"dead/unregistered node in {rid!r}")
            _require(
                node.parent is parent and node.depth == depth, f"broken chain in {rid!r} at depth {depth}"
            )
            (num_active if req.state is RequestState.ACTIVE else num_waiting)[id(node)] += 1
            parent = node
    _require(len(active) <= len(tree._requests), "more active than requests")
    for node in nodes.values():
        _require(node.num_active == num_active[id(node)], f"num_active wrong at depth {node.depth}")
        _require(node.num_waiting == num_waiting[id(node)], f"num_waiting wrong at depth {node.depth}")
        _require(node.num_active + node.num_waiting > 0, f"unreferenced node kept at depth {node.depth}")
    num_groups = sum(1 for node in nodes.values() if node.depth == 1 and node.num_active > 0)
    _require(
        tree.num_running_groups == num_groups,
        f"{tree.num_running_groups} running groups counted, recount says {num_groups}",
    )
    num_idle_cached = sum(
        1 for node in nodes.values() if node.cached and node.num_active == 0 and node.num_waiting > 0
    )
    _require(
        tree._num_idle_cached == num_idle_cached,
        f"{tree._num_idle_cached} idle cached nodes with waiting requests counted, recount says {num_idle_cached}",
    )
    _check_shared(tree)
    _check_cache(tree)
    _check_suspended(tree)
    _check_bounds(tree)
    _check_lower_bounds(tree)


def _check_shared(tree: PythonTree) -> None:
    paths = [req.path for req in tree._running.requests.values()]
    if not paths:
        _require(tree.shared_depth == 0, "shared prefix set with no running request")
        return
    depth = 0
    while all(len(p) > depth for p in paths) and len({id(p[depth]) for p in paths}) == 1:
        depth += 1
    _require(tree.shared_depth == depth, f"shared depth {tree.shared_depth}, recount says {depth}")


def _check_cache(tree: PythonTree) -> None:
    """The cache tier is closed under prefixes, its child sets match it, and every node's flag follows it."""
    cache, children = tree._tier.parents, tree._tier.children()
    recount: dict = {}
    for chunk_hash, parent in cache.items():
        _require(parent is None or parent in cache, f"cached hash {chunk_hash!r} has an uncached parent")
        if parent is not None:
            recount.setdefault(parent, set()).add(chunk_hash)
    _require(recount == children, "the cache tier's child sets disagree with its parents")
    for node in tree._trie.nodes.values():
        up = node.parent
        above = None if up is None else up.hash
        expected = cache.get(node.hash, ()) == above and (up is None or up.cached)
        _require(node.cached == expected, f"cached flag wrong at depth {node.depth}")


def _check_suspended(tree: PythonTree) -> None:
    from sglang_feather.cht.nodes import RequestState

    for rid, req in tree._suspended.items():
        _require(tree._requests.get(rid) is req, f"suspended {rid!r} is not tracked")
        _require(req.state is RequestState.WAITING and req.suspended, f"suspended {rid!r} is not waiting")
    flagged = sum(req.suspended for req in tree._requests.values())
    _require(flagged == len(tree._suspended), "suspended flags disagree with the suspended map")


def _check_bounds(tree: PythonTree) -> None:
    """Every heap is bounded by the live items it indexes (the compaction thresholds)."""
    from sglang_feather.cht.nodes import COMPACT_MIN

    nodes = tree._trie.nodes
    for node in nodes.values():
        live = node.num_waiting + node.num_active
        _require(len(node.candidates) <= 4 * live + COMPACT_MIN, f"candidate heap unbounded at {node.depth}")
        _require((node.arrivals is not None) == (node.depth == 1), "arrival heap on a deeper node")
        if node.arrivals is not None:
            _require(len(node.arrivals) <= 4 * live + COMPACT_MIN, "arrival heap unbounded")
        else:
            _require(node.stranger_key is None, "stranger key on a deeper node")
    global_heap, strangers, by_arrival = tree._ranking.heaps()
    _require(len(global_heap) <= 2 * len(nodes) + COMPACT_MIN, "global heap unbounded")
    _require(len(strangers) <= 2 * len(nodes) + COMPACT_MIN, "stranger heap unbounded")
    _require(len(by_arrival) <= 2 * len(tree._requests) + COMPACT_MIN, "arrival order unbounded")


def _check_lower_bounds(tree: PythonTree) -> None:
    """Every waiting, unsuspended request is findable through entries `_settle` keeps.

    Tier 1: its leaf holds its own entry; each hop up to its deepest covered node holds an entry whose key
    is exactly the child's cached `best` (anything else `_settle` discards) and that key bounds the
    request's; the covered node's live global entry bounds its rank. Tier 2 (uncovered first node): the first
    node's arrival heap holds it and the node's live stranger entry bounds its arrival. `oldest()`: the
    arrival order holds it.
    """
    from sglang_feather.cht.nodes import RequestState

    entries: dict[tuple[int, int], set[tuple]] = {}
    nodes = tree._trie.nodes
    for node in nodes.values():
        for entry in node.candidates:
            entries.setdefault((id(node), id(entry[3])), set()).add(entry[:2])
    global_heap, strangers, by_arrival = tree._ranking.heaps()
    live_global = _live_entries(global_heap, 6, 5, "global_key")
    live_strangers = _live_entries(strangers, 3, 2, "stranger_key")
    for node in nodes.values():
        _require(
            node.global_key is None or live_global.get(id(node)) == node.global_key,
            f"node at depth {node.depth} records a global key with no entry in the global heap",
        )
        _require(
            node.stranger_key is None or live_strangers.get(id(node)) == node.stranger_key,
            "a first-level node records a stranger key with no entry in the stranger heap",
        )
    in_order = {id(entry[2]) for entry in by_arrival if entry[:2] == (entry[2].arrival, entry[2].seq)}
    for req in tree._requests.values():
        if req.state is not RequestState.WAITING or req.suspended:
            continue
        _require(id(req) in in_order, f"{req.id!r} missing from the arrival order")
        key = req.key
        first = req.path[0]
        if not first.is_covered:
            _require(
                first.arrivals is not None and (req.arrival, req.seq, req) in first.arrivals,
                f"{req.id!r} missing from its arrival heap",
            )
            bound = first.stranger_key
            _require(
                bound is not None and bound <= (req.arrival, req.seq), f"no stranger entry bounds {req.id!r}"
            )
            continue
        leaf = req.path[-1]
        _require(key in entries.get((id(leaf), id(req)), ()), f"no leaf entry for {req.id!r}")
        node = leaf
        while not node.is_covered:
            best, parent = node.best, node.parent
            if best is None or not best[:2] <= key:
                _fail(f"cached best does not bound {req.id!r} at {node.depth}")
            _require(
                best[:2] in entries.get((id(parent), id(node)), ()),
                f"{req.id!r} unreachable above depth {node.depth}",
            )
            if parent is None:
                _fail(f"{req.id!r} has no covered node above depth {node.depth}")
            node = parent
        bound = live_global.get(id(node))
        _require(
            bound is not None and bound <= tree._ranking.global_key(node, key),
            f"no global entry bounds {req.id!r} (covered node at depth {node.depth})",
        )


def _live_entries(heap: list[tuple], item_at: int, key_len: int, attr: str) -> dict[int, tuple]:
    """Entries whose key is their item's recorded key (the only ones a pop accepts), by item."""
    live: dict[int, tuple] = {}
    for entry in heap:
        item = entry[item_at]
        if entry[:key_len] == getattr(item, attr):
            _require(item.is_alive, "a live heap entry names a released node")
            live[id(item)] = entry[:key_len]
    return live
