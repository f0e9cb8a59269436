"""Hypothesis state machine: the Chunked Hash Tree against the brute-force reference after every operation."""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sglang_feather.cht import ChunkedHashTree, RequestState, chunk_hashes
from sglang_feather.cht.reference import ReferenceTree

CHUNK = 2
# Few distinct prefixes over a tiny alphabet, so requests share, nest and collide in every possible way.
prompts = st.lists(st.integers(0, 2), min_size=1, max_size=12).map(
    lambda tail: [7, 7, 1, 1] * 2 + tail
) | st.lists(st.integers(0, 3), min_size=1, max_size=9)


class TreeVsReference(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.tree = ChunkedHashTree(chunk_size=CHUNK)
        self.ref = ReferenceTree()
        self.next_id = 0

    def ids(self, state):
        return sorted(self.ref.ids(state))

    @rule(tokens=prompts)
    def insert(self, tokens):
        hashes = chunk_hashes(tokens, CHUNK)
        assert self.tree.insert(self.next_id, tokens) == self.ref.insert_hashes(self.next_id, hashes)
        self.next_id += 1

    @precondition(lambda self: self.ref.ids(RequestState.WAITING))
    @rule(data=st.data())
    def activate(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.WAITING)))
        self.tree.activate(rid)
        self.ref.activate(rid)

    @precondition(lambda self: self.ref.ids(RequestState.WAITING))
    @rule()
    def activate_best(self):
        best = self.tree.best()
        assert best == self.ref.best()
        self.tree.activate(best.request_id)
        self.ref.activate(best.request_id)

    @precondition(lambda self: self.ref.ids(RequestState.ACTIVE))
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.ACTIVE)))
        self.tree.finish(rid)
        self.ref.finish(rid)

    @precondition(lambda self: self.ref.ids(RequestState.ACTIVE))
    @rule(data=st.data())
    def deactivate(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.ACTIVE)))
        self.tree.deactivate(rid)
        self.ref.deactivate(rid)

    @precondition(lambda self: self.ref.ids(RequestState.WAITING))
    @rule(data=st.data())
    def remove(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.WAITING)))
        self.tree.remove(rid)
        self.ref.remove(rid)

    @rule()
    def best(self):
        assert self.tree.best() == self.ref.best()

    @precondition(lambda self: self.ref.ids(RequestState.WAITING))
    @rule(data=st.data())
    def describe_any(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.WAITING)))
        assert self.tree.candidate(rid) == self.ref.describe(rid)
        assert self.tree.num_missing(rid) == self.ref.num_missing(rid)

    @invariant()
    def agrees(self):
        self.tree.check_invariants()
        assert self.tree.shared_depth == self.ref.shared_depth()
        assert self.tree.num_active == len(self.ref.ids(RequestState.ACTIVE))
        assert self.tree.num_waiting == len(self.ref.ids(RequestState.WAITING))
        waiting = self.ref.ids(RequestState.WAITING)
        oldest = min(waiting, key=lambda r: self.ref.order[r]) if waiting else None
        assert self.tree.oldest() == oldest


TreeVsReference.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_tree_matches_reference = TreeVsReference.TestCase
