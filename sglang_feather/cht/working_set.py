"""The Python tree's working set: the running requests, their prefix groups and the prefix all of them hold."""

from __future__ import annotations

from sglang_feather.cht.nodes import PrefixNode, TrackedRequest
from sglang_feather.cht.paths import last_depth
from sglang_feather.types import RequestId


class WorkingSet:
    """The running requests and what they hold: each node's `num_active`, the prefix groups (first chunks a
    running request holds) and the shared depth (chunks every running request holds, found by binary search
    along one path, since `num_active` never grows with depth)."""

    def __init__(self) -> None:
        self.requests: dict[RequestId, TrackedRequest] = {}
        self.num_groups = 0
        self.shared_depth = 0
        """Chunks every running request holds; 0 when nothing runs."""

    def enter(self, req: TrackedRequest) -> int:
        """A waiting request joins: its nodes count it as running, not waiting. Returns the depth of the first
        node that entered the working set uncached (a node now covered that was not), `len(path)` if none."""
        self.requests[req.id] = req
        path = req.path
        first_entered = len(path)
        for depth, node in enumerate(path):
            node.num_waiting -= 1
            node.num_active += 1
            if node.num_active == 1 and not node.cached and depth < first_entered:
                first_entered = depth
        if path and path[0].num_active == 1:
            self.num_groups += 1
        if len(self.requests) == 1:
            self.shared_depth = len(path)
        else:
            self.shared_depth = last_depth(path, min(len(path), self.shared_depth), len(self.requests))
        return first_entered

    def leave(self, req: TrackedRequest) -> list[PrefixNode]:
        """A running request leaves the working set; returns the nodes that left coverage, deepest first."""
        del self.requests[req.id]
        left = []
        for node in req.path:
            node.num_active -= 1
            if node.num_active == 0 and not node.cached:
                left.append(node)
        if req.path and req.path[0].num_active == 0:
            self.num_groups -= 1
        left.reverse()
        if self.requests:
            path = next(iter(self.requests.values())).path
            self.shared_depth = last_depth(path, len(path), len(self.requests))
        else:
            self.shared_depth = 0
        return left
