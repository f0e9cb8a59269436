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


def _check_lower_bounds(tree: ChunkedHashTree) -> None:
    """Every waiting request is findable: each hop toward the global heap carries a key <= its own."""
    from sglang_feather.cht.nodes import RequestState

    smallest: dict[tuple[int, int], tuple] = {}
    for node in [tree._root, *tree._nodes.values()]:
        for entry in node.candidates:
            slot = (id(node), id(entry[4]))
            if slot not in smallest or entry[:3] < smallest[slot]:
                smallest[slot] = entry[:3]
    live_global: dict[int, tuple] = {}
    for entry in tree._global:
        node = entry[4]
        if entry[:3] == node.global_key:
            live_global[id(node)] = entry[:3]
    for node in [tree._root, *tree._nodes.values()]:
        _require(
            node.global_key is None or live_global.get(id(node)) == node.global_key,
            f"node at depth {node.depth} records a global key with no entry in the global heap",
        )
    for req in tree._requests.values():
        if req.state is not RequestState.WAITING:
            continue
        key = req.key
        leaf = req.path[-1]
        _require(smallest.get((id(leaf), id(req)), (float("inf"),)) <= key, f"no leaf entry for {req.id!r}")
        node = leaf
        while node.parent is not None and node.num_active == 0:
            parent = node.parent
            hop = smallest.get((id(parent), id(node)))
            _require(hop is not None and hop <= key, f"{req.id!r} unreachable above depth {node.depth}")
            node = parent
        bound = live_global.get(id(node))
        _require(
            bound is not None and bound <= (key[0] - node.depth, *key[1:]),
            f"no global entry bounds {req.id!r} (working-set node at depth {node.depth})",
        )
