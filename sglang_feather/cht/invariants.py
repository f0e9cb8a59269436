"""The Chunked Hash Tree's invariant checker: recount everything from the requests and compare."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_feather.cht.tree import ChunkedHashTree


class InvariantError(AssertionError):
    """The tree's bookkeeping disagrees with a recount from its requests."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantError(message)


def check_tree(tree: ChunkedHashTree) -> None:
    """Counts, paths, node registry, shared prefix, and the lower-bound property of every lazy heap entry."""
    from sglang_feather.cht.nodes import RequestState

    num_active: Counter = Counter()
    num_waiting: Counter = Counter()
    for rid, req in tree._requests.items():
        _require(req.id == rid, f"request {rid!r} is filed under another id")
        _require(req.state in (RequestState.WAITING, RequestState.ACTIVE), f"request {rid!r} has no state")
        _require((rid in tree._active) == (req.state is RequestState.ACTIVE), f"active map wrong for {rid!r}")
        parent = tree._root
        for depth, node in enumerate(req.path, start=1):
            _require(
                node.is_alive and tree._nodes.get(node.hash) is node, f"dead/unregistered node in {rid!r}"
            )
            _require(
                node.parent is parent and node.depth == depth, f"broken chain in {rid!r} at depth {depth}"
            )
            (num_active if req.state is RequestState.ACTIVE else num_waiting)[id(node)] += 1
            parent = node
    _require(len(tree._active) <= len(tree._requests), "more active than requests")
    for node in tree._nodes.values():
        _require(node.num_active == num_active[id(node)], f"num_active wrong at depth {node.depth}")
        _require(node.num_waiting == num_waiting[id(node)], f"num_waiting wrong at depth {node.depth}")
        _require(node.num_active + node.num_waiting > 0, f"unreferenced node kept at depth {node.depth}")
    _check_shared(tree)
    _check_suspended(tree)
    _check_bounds(tree)
    _check_lower_bounds(tree)


def _check_shared(tree: ChunkedHashTree) -> None:
    paths = [req.path for req in tree._active.values()]
    if not paths:
        _require(tree._shared is None, "shared prefix set with no running request")
        return
    depth = 0
    while all(len(p) > depth for p in paths) and len({id(p[depth]) for p in paths}) == 1:
        depth += 1
    _require(tree.shared_depth == depth, f"shared depth {tree.shared_depth}, recount says {depth}")


def _check_suspended(tree: ChunkedHashTree) -> None:
    from sglang_feather.cht.nodes import RequestState

    for rid, req in tree._suspended.items():
        _require(tree._requests.get(rid) is req, f"suspended {rid!r} is not tracked")
        _require(req.state is RequestState.WAITING and req.suspended, f"suspended {rid!r} is not waiting")
    flagged = sum(req.suspended for req in tree._requests.values())
    _require(flagged == len(tree._suspended), "suspended flags disagree with the suspended map")


def _check_bounds(tree: ChunkedHashTree) -> None:
    """Every heap is bounded by the live items it indexes (the compaction thresholds)."""
    from sglang_feather.cht.nodes import COMPACT_MIN

    _require(not tree._root.candidates, "the root has candidates: strangers are ranked by arrival")
    for node in tree._nodes.values():
        live = node.num_waiting + node.num_active
        _require(len(node.candidates) <= 4 * live + COMPACT_MIN, f"candidate heap unbounded at {node.depth}")
        _require((node.arrivals is not None) == (node.depth == 1), "arrival heap on a deeper node")
        if node.arrivals is not None:
            _require(len(node.arrivals) <= 4 * live + COMPACT_MIN, "arrival heap unbounded")
        else:
            _require(node.stranger_key is None, "stranger key on a deeper node")
    _require(len(tree._global) <= 2 * len(tree._nodes) + COMPACT_MIN, "global heap unbounded")
    _require(len(tree._strangers) <= 2 * len(tree._nodes) + COMPACT_MIN, "stranger heap unbounded")
    _require(len(tree._by_arrival) <= 2 * len(tree._requests) + COMPACT_MIN, "arrival order unbounded")


def _check_lower_bounds(tree: ChunkedHashTree) -> None:
    """Every waiting, unsuspended request is findable through entries `_settle` keeps.

    Tier 1: its leaf holds its own entry; each hop up to its working-set node holds an entry whose key is
    exactly the child's cached `best` (anything else `_settle` discards) and that key bounds the request's;
    the working-set node's live global entry bounds its missing count. Tier 2 (first node outside the working
    set): the first node's arrival heap holds it and the node's live stranger entry bounds its arrival.
    `oldest()`: the arrival order holds it.
    """
    from sglang_feather.cht.nodes import RequestState

    entries: dict[tuple[int, int], set[tuple]] = {}
    for node in [tree._root, *tree._nodes.values()]:
        for entry in node.candidates:
            entries.setdefault((id(node), id(entry[4])), set()).add(entry[:3])
    live_global = _live_entries(tree._global, 4, 3, "global_key")
    live_strangers = _live_entries(tree._strangers, 3, 2, "stranger_key")
    for node in tree._nodes.values():
        _require(
            node.global_key is None or live_global.get(id(node)) == node.global_key,
            f"node at depth {node.depth} records a global key with no entry in the global heap",
        )
        _require(
            node.stranger_key is None or live_strangers.get(id(node)) == node.stranger_key,
            "a first-level node records a stranger key with no entry in the stranger heap",
        )
    in_order = {id(entry[2]) for entry in tree._by_arrival if entry[:2] == (entry[2].arrival, entry[2].seq)}
    for req in tree._requests.values():
        if req.state is not RequestState.WAITING or req.suspended:
            continue
        _require(id(req) in in_order, f"{req.id!r} missing from the arrival order")
        key = req.key
        first = req.path[0]
        if first.num_active == 0:
            _require(
                (req.arrival, req.seq, req) in first.arrivals, f"{req.id!r} missing from its arrival heap"
            )
            bound = first.stranger_key
            _require(
                bound is not None and bound <= (req.arrival, req.seq), f"no stranger entry bounds {req.id!r}"
            )
            continue
        leaf = req.path[-1]
        _require(key in entries.get((id(leaf), id(req)), ()), f"no leaf entry for {req.id!r}")
        node = leaf
        while node.num_active == 0:
            best = node.best
            _require(
                best is not None and best[:3] <= key, f"cached best does not bound {req.id!r} at {node.depth}"
            )
            _require(
                best[:3] in entries.get((id(node.parent), id(node)), ()),
                f"{req.id!r} unreachable above depth {node.depth}",
            )
            node = node.parent
        bound = live_global.get(id(node))
        _require(
            bound is not None and bound <= (key[0] - node.depth, *key[1:]),
            f"no global entry bounds {req.id!r} (working-set node at depth {node.depth})",
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
