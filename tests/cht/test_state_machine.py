"""Hypothesis state machine: the Chunked Hash Tree against the brute-force reference after every operation."""

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sglang_feather.cht import HashChainError, InvalidTransition, PythonTree, RequestState, chunk_hashes
from sglang_feather.cht.reference import ReferenceTree

CHUNK = 2
# Few distinct prefixes over a tiny alphabet, so requests share, nest and collide in every possible way.
prompts = st.lists(st.integers(0, 2), min_size=1, max_size=12).map(
    lambda tail: [7, 7, 1, 1] * 2 + tail
) | st.lists(st.integers(0, 3), min_size=1, max_size=9)


class TreeVsReference(RuleBasedStateMachine):
    tree_cls = PythonTree

    @initialize()
    def start(self):
        self.tree = self.tree_cls(chunk_size=CHUNK)
        self.ref = ReferenceTree()
        self.next_id = 0

    def ids(self, state):
        return sorted(self.ref.ids(state))

    @rule(tokens=prompts)
    def insert(self, tokens):
        hashes = chunk_hashes(tokens, CHUNK)
        assert self.tree.insert(self.next_id, tokens) == self.ref.insert_hashes(self.next_id, hashes)
        assert self.tree.path_hashes(self.next_id) == tuple(hashes)
        assert [self.tree.prefix_hash(self.next_id, d) for d in range(1, len(hashes) + 1)] == hashes
        self.next_id += 1

    @rule(tokens=prompts)
    def insert_engine_hashes(self, tokens):
        """The same chain as an engine's hashes (the compiled tree then indexes every chunk of every tail)."""
        hashes = chunk_hashes(tokens, CHUNK)
        assert self.tree.insert_hashes(self.next_id, hashes) == self.ref.insert_hashes(self.next_id, hashes)
        self.next_id += 1

    @rule(tokens=prompts, arrival=st.integers(-3, 3))
    def insert_with_arrival(self, tokens, arrival):
        hashes = chunk_hashes(tokens, CHUNK)
        assert self.tree.insert(self.next_id, tokens, arrival=arrival) == self.ref.insert_hashes(
            self.next_id, hashes, arrival
        )
        self.next_id += 1

    @precondition(lambda self: self.ref.eligible())
    @rule(data=st.data())
    def suspend(self, data):
        rid = data.draw(st.sampled_from(sorted(self.ref.eligible())))
        self.tree.suspend(rid)
        self.ref.suspend(rid)
        assert self.tree.is_suspended(rid) and self.tree.state(rid) is RequestState.WAITING

    @precondition(lambda self: self.ref.suspended)
    @rule(data=st.data())
    def resume(self, data):
        rid = data.draw(st.sampled_from(sorted(self.ref.suspended)))
        self.tree.resume(rid)
        self.ref.resume(rid)

    @rule()
    def resume_all(self):
        self.tree.resume_all()
        self.ref.resume_all()

    @precondition(lambda self: self.ref.states)
    @rule(data=st.data())
    def refused_transition(self, data):
        rid = data.draw(st.sampled_from(sorted(self.ref.states)))
        call = data.draw(st.sampled_from(["suspend", "resume"]))
        try:
            getattr(self.ref, call)(rid)
        except InvalidTransition:
            with pytest.raises(InvalidTransition):
                getattr(self.tree, call)(rid)
        else:
            getattr(self.tree, call)(rid)

    @rule(tokens=prompts, data=st.data())
    def cache_store(self, tokens, data):
        """The engine caches a prefix of a prompt (tracked or not), from its start or below a cached prefix."""
        hashes = chunk_hashes(tokens, CHUNK)
        end = data.draw(st.integers(1, len(hashes)))
        start = data.draw(st.integers(0, end - 1))
        parent = hashes[start - 1] if start else None
        assert self.tree.cache_store(hashes[start:end], parent) == self.ref.cache_store(
            hashes[start:end], parent
        )
        assert self.tree.num_cached == len(self.ref.cache)

    @precondition(lambda self: self.ref.cache)
    @rule(data=st.data())
    def cache_remove(self, data):
        """The engine evicts cached prefixes (their extensions go too); unknown hashes are ignored."""
        doomed = data.draw(st.lists(st.sampled_from(sorted(self.ref.cache)), min_size=1, max_size=3))
        doomed.append(12345)
        assert self.tree.cache_remove(doomed) == self.ref.cache_remove(doomed)

    @precondition(lambda self: self.ref.cache)
    @rule()
    def cache_clear(self):
        self.tree.cache_clear()
        self.ref.cache_clear()
        assert self.tree.num_cached == 0

    @precondition(lambda self: self.ref.cache)
    @rule(data=st.data())
    def refused_cache_chain(self, data):
        """A cached hash offered under another parent is refused and changes nothing."""
        chunk_hash = data.draw(st.sampled_from(sorted(self.ref.cache)))
        chain = [chunk_hash] if self.ref.cache[chunk_hash] is not None else [chunk_hash ^ 1, chunk_hash]
        before = self.tree.num_cached
        with pytest.raises(HashChainError):
            self.tree.cache_store(chain)
        assert self.tree.num_cached == before

    @precondition(lambda self: self.ref.states)
    @rule(data=st.data())
    def prefix_order(self, data):
        rids = data.draw(st.lists(st.sampled_from(sorted(self.ref.states)), min_size=1, unique=True))
        assert self.tree.prefix_order(rids) == self.ref.prefix_order(rids)

    @precondition(lambda self: self.ref.ids(RequestState.WAITING))
    @rule(data=st.data())
    def activate(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.WAITING)))
        self.tree.activate(rid)
        self.ref.activate(rid)

    @precondition(lambda self: self.ref.eligible())
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

    @rule(
        max_picks=st.integers(0, 4),
        skip=st.booleans(),
        max_missing=st.none() | st.integers(1, 12),
        data=st.data(),
    )
    def take_picks(self, max_picks, skip, max_missing, data):
        """A planned pass's block of picks (after a given first one, the aging guard's due request, or not):
        the same as candidate / best / suspend / activate one at a time."""
        eligible = [r for r in self.ids(RequestState.WAITING) if r not in self.ref.suspended]
        first = data.draw(st.none() | st.sampled_from(eligible)) if eligible else None
        taken = self.tree.take_picks(max_picks, skip, max_missing, first)
        assert taken == self.ref.take_picks(max_picks, skip, max_missing, first)
        if first is not None and max_picks:
            assert (taken.candidates[:1] == [] and taken.skipped == [first]) or (
                taken.candidates[0].request_id == first
            )
        missing = [c.num_missing for c in taken.candidates]
        if max_missing is not None:
            assert sum(missing[:-1]) < max_missing, "the pick that reaches max_missing is the last"

    @rule()
    def best(self):
        assert self.tree.best() == self.ref.best()

    @precondition(lambda self: self.ref.ids(RequestState.WAITING))
    @rule(data=st.data())
    def describe_any(self, data):
        rid = data.draw(st.sampled_from(self.ids(RequestState.WAITING)))
        assert self.tree.candidate(rid) == self.ref.describe(rid)
        assert self.tree.num_missing(rid) == self.ref.num_missing(rid)
        assert self.tree.arrival(rid) == self.ref.arrival(rid)

    @invariant()
    def agrees(self):
        self.tree.check_invariants()
        assert self.tree.shared_depth == self.ref.shared_depth()
        assert self.tree.num_active == len(self.ref.ids(RequestState.ACTIVE))
        assert self.tree.num_running_groups == self.ref.num_running_groups()
        assert self.tree.num_waiting == len(self.ref.ids(RequestState.WAITING))
        assert self.tree.num_suspended == len(self.ref.suspended)
        assert self.tree.oldest() == self.ref.oldest()
        assert self.tree.oldest_stranger() == self.ref.oldest_stranger()
        assert self.tree.num_cached == len(self.ref.cache)


MAX_EXAMPLES = 100 if os.environ.get("FEATHER_TEST_FAST") == "1" else 200
"""`make test` runs 200 sequences per tree (300 took 201 s and 147 s of a 21-minute CI run); `make test-fast`
(FEATHER_TEST_FAST=1) 100. The deeper runs of the
same comparison are `make test` and the seeded stress run against the same reference (`make stress`: 1M
operations; tests/cht/test_stress.py: 30k per seed and tree)."""

SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_tree_matches_reference(tree_cls):
    machine = type(f"{tree_cls.__name__}VsReference", (TreeVsReference,), {"tree_cls": tree_cls})
    run_state_machine_as_test(machine, settings=SETTINGS)
