"""The Python tree's trie of prefix nodes: building a request's path, releasing it, depths along a path."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

from sglang_feather.cht.errors import HashChainError
from sglang_feather.cht.nodes import PrefixNode, TrackedRequest, keep_bounded
from sglang_feather.types import ChunkHash, RequestId

NOT_CACHED = object()


class Trie:
    """The prefix nodes by chunk hash (first-level nodes have no parent): it owns them and their creation order."""

    def __init__(self) -> None:
        self.nodes: dict[ChunkHash, PrefixNode] = {}
        self._num_created = 0

    def build_path(
        self, hashes: Sequence[ChunkHash], cached: Mapping[ChunkHash, ChunkHash | None]
    ) -> tuple[list[PrefixNode], int]:
        """The nodes for `hashes` and how many already existed; refuses anything that is not one chain.

        Existing nodes must form a prefix of the list, each the child of the one before (so a hash known at
        another depth or under another parent is refused), and the rest must be new and distinct. A new node
        is cached when `cached` (the cache tier: hash -> parent hash) holds its hash under its parent's and its
        parent is cached.
        """
        nodes = self.nodes
        path: list[PrefixNode] = []
        parent: PrefixNode | None = None
        for chunk_hash in hashes:
            node = nodes.get(chunk_hash)
            if node is None:
                break
            if node.parent is not parent:
                raise HashChainError(
                    f"hash {chunk_hash!r} at depth {len(path) + 1} is already at depth {node.depth} under "
                    "another prefix: hashes are not cumulative or two prefixes collide"
                )
            path.append(node)
            parent = node
        num_existing = len(path)
        fresh = hashes[num_existing:]
        if len(set(fresh)) != len(fresh) or any(h in nodes for h in fresh):
            raise HashChainError(
                "a hash repeats or skips a level within one request: hashes are not cumulative"
            )
        serial = self._num_created
        is_cached = parent is None or parent.cached
        above = None if parent is None else parent.hash
        for depth, chunk_hash in enumerate(fresh, start=num_existing + 1):
            is_cached = is_cached and cached.get(chunk_hash, NOT_CACHED) == above
            parent = nodes[chunk_hash] = PrefixNode(chunk_hash, parent, depth, serial)
            parent.cached = is_cached
            path.append(parent)
            above = chunk_hash
            serial += 1
        self._num_created = serial
        return path, num_existing

    def release(self, path: list[PrefixNode]) -> None:
        """Drop the nodes at the end of `path` that no request holds any more; bound the others' heaps."""
        for node in reversed(path):
            if node.num_active or node.num_waiting:
                break
            node.is_alive = False
            node.candidates = []
            node.arrivals = None
            node.best = None
            node.global_key = None
            node.stranger_key = None
            del self.nodes[node.hash]
        for node in path:
            if not node.is_alive:
                break
            keep_bounded(node)

    def parent_hash(self, chunk_hash: ChunkHash) -> tuple[bool, ChunkHash | None]:
        """(whether a node holds `chunk_hash`, the hash of its parent prefix: None at the first level)."""
        node = self.nodes.get(chunk_hash)
        if node is None:
            return False, None
        parent = node.parent
        return True, None if parent is None else parent.hash


def prefix_order(reqs: list[TrackedRequest]) -> list[RequestId]:
    """The requests in the trie's depth-first order, children first-seen first.

    Requests that share a prefix are contiguous at every depth, a request comes before those that extend
    its prompt, and equal paths keep their given order. Groups are split at their longest common prefix
    (binary search along each path), so the cost is O(R log n) per branching level, not O(R n).
    """
    order: list[RequestId] = []
    stack: list[tuple[list[TrackedRequest], int]] = [(reqs, 0)] if reqs else []
    while stack:
        group, depth = stack.pop()
        if len(group) == 1:
            order.append(group[0].id)
            continue
        first = group[0].path
        common = len(first)
        for req in group:
            path = req.path
            limit = min(common, len(path))
            if limit > depth and path[limit - 1] is not first[limit - 1]:
                lo, hi = depth, limit - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if path[mid - 1] is first[mid - 1]:
                        lo = mid
                    else:
                        hi = mid - 1
                limit = lo
            common = limit
        branches: dict[int, list[TrackedRequest]] = {}
        for req in group:
            if len(req.path) == common:
                order.append(req.id)
            else:
                branches.setdefault(req.path[common].serial, []).append(req)
        for serial in sorted(branches, reverse=True):
            stack.append((branches[serial], common + 1))
    return order


def last_depth(path: list[PrefixNode], limit: int, threshold: int) -> int:
    """Largest d <= limit with path[d-1].num_active >= threshold (0 if none); `num_active` falls with depth."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if path[mid - 1].num_active >= threshold:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _prefix_length(
    path: list[PrefixNode], holds: Callable[[PrefixNode], bool], limit: int | None = None
) -> int:
    """Largest d <= limit (default: the path's length) with holds(path[d-1]) (0 if none), for a property that
    holds on a prefix of every path."""
    lo, hi = 0, len(path) if limit is None else limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(path[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def cached_depth(path: list[PrefixNode]) -> int:
    """The request's prefix the cache tier holds (the cached nodes are a prefix of every path)."""
    return _prefix_length(path, _IS_CACHED)


def covered_depth(path: list[PrefixNode]) -> int:
    """The request's prefix held by running requests or the cache (a prefix of every path)."""
    return _prefix_length(path, _IS_COVERED)


def idle_cached_span(path: list[PrefixNode]) -> int:
    """The nodes of `path` the cache tier holds that no running request holds and a waiting request passes
    through: one run of the path, since being cached, held and passed through by a waiting request each holds
    on a prefix of every path."""
    cached = cached_depth(path)
    held = last_depth(path, cached, 1)
    return max(0, _prefix_length(path, _IS_WAITED_ON, cached) - held)


_IS_CACHED = attrgetter("cached")
_IS_COVERED = attrgetter("is_covered")
_IS_WAITED_ON = attrgetter("num_waiting")
