"""The cache tier: what the engine's KV cache holds ranks requests, on both trees, from store/remove/clear events."""

import pytest

from sglang_feather.cht import Candidate, HashChainError, chunk_hashes

CHUNK = 4
DOC = list(range(100, 132))
"""A 32-token document: 8 chunks."""


def prompt(doc, question):
    return doc + [question] * 6


def cache_prompt(tree, tokens):
    """What an engine's events say once it has cached `tokens`' whole chunks."""
    hashes = chunk_hashes(tokens, CHUNK)
    return tree.cache_store(hashes[: len(tokens) // CHUNK])


class TestRanking:
    def test_a_cached_document_beats_an_earlier_stranger(self, tree_cls):
        tree = tree_cls(CHUNK)
        tree.insert("stranger", list(range(500, 540)), arrival=1.0)
        tree.insert("rag", prompt(DOC, 7), arrival=2.0)
        assert tree.best().request_id == "stranger", "nothing cached yet: first come, first served"
        assert cache_prompt(tree, prompt(DOC, 3)) == 9
        best = tree.best()
        assert best == Candidate("rag", 10, 2, 0, 8, 10, 10, 0, arrival=2.0)
        tree.check_invariants()

    def test_the_prefix_a_finished_request_left_in_the_cache_still_counts(self, tree_cls):
        tree = tree_cls(CHUNK)
        tree.insert("turn1", prompt(DOC, 1))
        tree.activate("turn1")
        cache_prompt(tree, prompt(DOC, 1))
        tree.finish("turn1")
        tree.insert("stranger", list(range(500, 540)), arrival=-1.0)
        tree.insert("turn2", prompt(DOC, 1) + [9] * 8)
        assert tree.best().request_id == "turn2" and tree.best().depth_cached == 9
        tree.check_invariants()

    def test_deepest_cached_prefix_first_then_heaviest_group_then_arrival(self, tree_cls):
        tree = tree_cls(CHUNK)
        other = list(range(200, 232))
        cache_prompt(tree, DOC)
        cache_prompt(tree, other)
        cache_prompt(tree, DOC[:16])
        tree.insert("shallow", DOC[:16] + [5] * 30, arrival=0.0)
        tree.insert("doc-late-long", prompt(DOC, 1) + [1] * 40, arrival=3.0)
        tree.insert("other-1", prompt(other, 1), arrival=1.0)
        tree.insert("other-2", prompt(other, 2), arrival=2.0)
        tree.insert("doc-early", prompt(DOC, 2), arrival=4.0)
        tree.insert("doc-third", prompt(DOC, 3), arrival=5.0)
        order = []
        while tree.best() is not None:
            order.append(tree.best().request_id)
            tree.activate(order[-1])
        assert order == ["doc-late-long", "doc-early", "doc-third", "other-1", "other-2", "shallow"], (
            "equal depth: the group of three first (its admitted requests still count), each group by arrival "
            "whatever the prompt length"
        )
        tree.check_invariants()

    def test_at_equal_depth_a_running_group_beats_a_heavier_group_only_cached(self, tree_cls):
        tree = tree_cls(CHUNK)
        other = list(range(200, 232))
        cache_prompt(tree, DOC)
        cache_prompt(tree, other)
        for i in range(3):
            tree.insert(f"other-{i}", prompt(other, i), arrival=float(i))
        tree.insert("doc-running", prompt(DOC, 9), arrival=10.0)
        tree.insert("doc-waiting", prompt(DOC, 8), arrival=11.0)
        assert tree.best().request_id == "other-0", "nothing runs yet: the heavier cached group first"
        tree.activate("doc-running")
        assert tree.best().request_id == "doc-waiting", (
            "its group's prefix is already in the running batch: admitting it adds no prefix KV to decode"
        )
        tree.check_invariants()
        tree.finish("doc-running")
        assert tree.best().request_id == "other-0", "its group no longer runs: back to the heavier group"
        tree.check_invariants()

    def test_no_length_bias_within_a_group(self, tree_cls):
        tree = tree_cls(CHUNK)
        cache_prompt(tree, DOC)
        tree.insert("long", DOC + list(range(1000, 1400)), arrival=1.0)
        tree.insert("short", DOC + [1], arrival=2.0)
        assert tree.best().request_id == "long"

    def test_eviction_sends_a_group_back_to_arrival_order(self, tree_cls):
        tree = tree_cls(CHUNK)
        tree.insert("stranger", list(range(500, 540)), arrival=1.0)
        tree.insert("rag", prompt(DOC, 7), arrival=2.0)
        cache_prompt(tree, DOC)
        hashes = chunk_hashes(DOC, CHUNK)
        assert tree.best().request_id == "rag"
        assert tree.cache_remove([hashes[4]]) == 4, "the evicted prefix and the 3 that extend it"
        assert tree.best() == Candidate("rag", 10, 6, 0, 4, 10, 10, 0, arrival=2.0)
        tree.cache_remove([hashes[0]])
        assert tree.best().request_id == "stranger"
        tree.check_invariants()

    def test_running_requests_still_cover_what_the_cache_dropped(self, tree_cls):
        tree = tree_cls(CHUNK)
        tree.insert("run", prompt(DOC, 1))
        tree.activate("run")
        cache_prompt(tree, DOC)
        tree.insert("stranger", list(range(500, 540)), arrival=-5.0)
        tree.insert("sharer", prompt(DOC, 2))
        tree.cache_clear()
        assert tree.num_cached == 0
        assert tree.best() == Candidate("sharer", 10, 2, 8, 0, 8, 8, 0, arrival=2.0)
        tree.finish("run")
        assert tree.best().request_id == "stranger"
        tree.check_invariants()


class TestEvents:
    def test_a_chain_below_an_uncached_prefix_is_ignored(self, tree_cls):
        tree = tree_cls(CHUNK)
        hashes = chunk_hashes(DOC, CHUNK)
        assert tree.cache_store(hashes[4:], parent=hashes[3]) == 0
        assert tree.cache_store(hashes[:4]) == 4
        assert tree.cache_store(hashes[4:], parent=hashes[3]) == 4
        assert tree.cache_store(hashes[2:6], parent=hashes[1]) == 0, "already cached"
        assert tree.num_cached == 8 and tree.is_cached(hashes[7])

    def test_unknown_evictions_are_ignored(self, tree_cls):
        tree = tree_cls(CHUNK)
        assert tree.cache_remove([1, 2, 3]) == 0
        tree.check_invariants()

    def test_events_for_prefixes_no_request_holds_keep_no_tree_state(self, tree_cls):
        tree = tree_cls(CHUNK)
        for i in range(100):
            cache_prompt(tree, [i] * 16)
        assert tree.num_cached == 400 and tree.num_nodes == 0
        tree.cache_clear()
        assert tree.num_cached == 0

    def test_a_store_into_a_waiting_prompt_covers_it(self, tree_cls):
        """The engine may report a prefix after the request that shares it was enqueued."""
        tree = tree_cls(CHUNK)
        long = DOC + list(range(300, 700))
        tree.insert("stranger", list(range(500, 540)), arrival=-1.0)
        tree.insert("late-news", long)
        hashes = chunk_hashes(long, CHUNK)
        tree.cache_store(hashes[:30])
        assert tree.best() == Candidate(
            "late-news", len(hashes), len(hashes) - 30, 0, 30, *[len(hashes)] * 2, 0, arrival=1.0
        )
        tree.cache_remove([hashes[12]])
        assert tree.best().depth_cached == 12
        tree.check_invariants()

    @pytest.mark.parametrize(
        "chain, parent",
        [
            ([3, 3], None),
            ([1, 2], 99),
            ([-1], None),
            (["x"], None),
        ],
    )
    def test_bad_chains_are_refused_or_ignored_and_change_nothing(self, tree_cls, chain, parent):
        tree = tree_cls(CHUNK)
        tree.cache_store([1, 2])
        if parent == 99:
            assert tree.cache_store(chain, parent) == 0
        else:
            with pytest.raises(HashChainError):
                tree.cache_store(chain, parent)
        assert tree.num_cached == 2
        tree.check_invariants()

    def test_a_hash_cached_or_tracked_under_another_parent_is_refused(self, tree_cls):
        tree = tree_cls(CHUNK)
        tree.cache_store([1, 2])
        with pytest.raises(HashChainError):
            tree.cache_store([2])
        tree.insert_hashes("r", [7, 8])
        with pytest.raises(HashChainError):
            tree.cache_store([1, 8])
        assert tree.num_cached == 2 and not tree.is_cached(8)
        tree.check_invariants()
