"""The running groups' waiting demand: how many waiting requests belong to a prefix group some request runs."""

from __future__ import annotations

from sglang_feather.cht import ChunkedHashTree
from sglang_feather.types import RequestId

# How it works.
#
# The concentration rule holds a candidate back only while a request of a running group waits (else the room
# it leaves would go unused), so it asks for their number at every decision that weighs a new prefix. The
# tree counts the running and waiting requests through each chunk (`num_holding`, `num_waiting_holding`), so
# a request's group runs when a running request holds its first chunk, and the number is kept from the
# lifecycle's events in at most two such O(1) queries each: a request that starts waiting counts when its
# group runs; one that joins the batch stops counting, and when its group did not run, the group's other
# waiting requests start to; the last running request of a group to leave takes the group's waiting requests
# with it. A pass planned ahead admits only requests of running groups, so it books its admissions as one
# subtraction, with no query (`joined_running`).


class WaitingDemand:
    """`num_waiting_running`: waiting requests whose prefix group (first chunk) a running request holds."""

    def __init__(self) -> None:
        self.num_waiting_running = 0

    def reset(self) -> None:
        self.num_waiting_running = 0

    def waits(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """The request started waiting (call after the tree knows it as waiting)."""
        if tree.num_holding(request_id, 1):
            self.num_waiting_running += 1

    def stops_waiting(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """A waiting request leaves without running (call while the tree still holds it)."""
        if tree.num_holding(request_id, 1):
            self.num_waiting_running -= 1

    def joining(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """A waiting request is about to run (call before the tree activates it)."""
        if tree.num_holding(request_id, 1):
            self.num_waiting_running -= 1
        else:  # its group starts running: the group's other waiting requests count from now on
            self.num_waiting_running += tree.num_waiting_holding(request_id, 1) - 1

    def joined_running(self, num_requests: int) -> None:
        """`num_requests` waiting requests of running groups joined the batch (a planned pass's admissions)."""
        self.num_waiting_running -= num_requests

    def leaving(self, tree: ChunkedHashTree, request_id: RequestId) -> None:
        """A running request is about to stop running (call before the tree finishes or deactivates it)."""
        if tree.num_holding(request_id, 1) == 1:  # the group's last: its waiting requests stop counting
            self.num_waiting_running -= tree.num_waiting_holding(request_id, 1)

    @classmethod
    def recount(cls, tree: ChunkedHashTree) -> WaitingDemand:
        """The demand of the requests `tree` holds now, counted from scratch (O(waiting requests))."""
        demand = cls()
        demand.num_waiting_running = sum(bool(tree.num_holding(rid, 1)) for rid in tree.waiting_ids())
        return demand
