"""Chunked Hash Tree: hashing, hand-made scenarios and bad input (every error leaves the tree unchanged)."""

from array import array

import numpy as np
import pytest

from sglang_feather.cht import (
    Candidate,
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidArrival,
    InvalidTokens,
    InvalidTransition,
    RequestState,
    UnknownRequest,
    chunk_hashes,
)


def snapshot(tree):
    return (
        sorted(map(str, tree.waiting_ids())),
        sorted(map(str, tree.active_ids())),
        tree.num_nodes,
        tree.shared_depth,
        tree.best(),
    )


class TestHashing:
    def test_one_digest_per_chunk_plus_partial(self):
        assert len(chunk_hashes(list(range(128)), 64)) == 2
        assert len(chunk_hashes(list(range(129)), 64)) == 3
        assert len(chunk_hashes([5], 64)) == 1

    def test_cumulative(self):
        a = chunk_hashes([1, 2, 3, 4, 5, 6], 2)
        b = chunk_hashes([1, 2, 3, 4, 9, 9], 2)
        assert a[:2] == b[:2] and a[2] != b[2]
        c = chunk_hashes([0, 2, 3, 4], 2)
        assert c[1] != a[1], "a different first chunk must change every later hash"

    def test_partial_chunk_differs_from_full_chunk_prefix(self):
        assert chunk_hashes([1, 2, 3], 2)[1] != chunk_hashes([1, 2, 3, 4], 2)[1]

    def test_input_types_agree(self):
        ids = list(range(1000, 1300))
        expected = chunk_hashes(ids, 64)
        assert chunk_hashes(array("q", ids), 64) == expected
        assert chunk_hashes(array("i", ids), 64) == expected
        assert chunk_hashes(np.array(ids, dtype=np.int64), 64) == expected
        assert chunk_hashes(np.array(ids, dtype=np.uint32), 64) == expected

    def test_little_endian_4_byte_layout(self):
        import xxhash

        assert chunk_hashes([1, 258], 2) == [
            xxhash.xxh64_intdigest(b"\x01\x00\x00\x00\x02\x01\x00\x00", seed=0)
        ]

    def test_namespaces_never_share(self):
        ids = list(range(200))
        assert set(chunk_hashes(ids, 64, "lora-a")).isdisjoint(chunk_hashes(ids, 64, "lora-b"))
        assert set(chunk_hashes(ids, 64, "lora-a")).isdisjoint(chunk_hashes(ids, 64))

    @pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], ["a"], np.array([[1, 2]]), np.array([0.5])])
    def test_invalid_tokens(self, bad):
        with pytest.raises(InvalidTokens):
            chunk_hashes(bad, 4)

    def test_empty_and_bad_chunk_size(self):
        with pytest.raises(EmptyPrompt):
            chunk_hashes([], 4)
        with pytest.raises(ValueError):
            chunk_hashes([1], 0)


class TestScenarios:
    def test_group_member_beats_stranger_and_fcfs_breaks_ties(self, tree_cls):
        tree = tree_cls(chunk_size=4)
        system = list(range(100, 116))
        tree.insert("a0", system + [1, 2, 3, 4])
        tree.insert("x", list(range(500, 520)))
        tree.insert("a1", system + [5, 6, 7, 8])
        tree.insert("a2", system + [9, 9, 9, 9])
        assert tree.best().request_id == "a0"
        tree.activate("a0")
        best = tree.best()
        assert best == Candidate("a1", 5, 1, 4, 0, 4, 4, 1, arrival=2.0), (
            "a batch of one shares nothing yet: nothing to lose"
        )
        assert best.delta == 0
        tree.activate("a1")
        assert tree.shared_depth == 4
        tree.insert("a3", system[:8] + [0] * 12)
        assert tree.best() == Candidate("a2", 5, 1, 4, 0, 4, 4, 0, arrival=3.0), "deeper covered prefix first"
        tree.activate("a2")
        assert tree.best() == Candidate("a3", 5, 3, 2, 0, 4, 2, 0, arrival=4.0)
        assert tree.best().delta == 2

    def test_retraction_keeps_arrival_order(self, tree_cls):
        tree = tree_cls(chunk_size=2)
        tree.insert("old", [1, 2, 3])
        tree.insert("new", [1, 2, 3])
        tree.activate("old")
        tree.deactivate("old")
        assert tree.state("old") is RequestState.WAITING
        assert tree.best().request_id == "old"
        assert tree.oldest() == "old"

    def test_deep_paths_do_not_recurse(self, tree_cls):
        tree = tree_cls(chunk_size=1)
        long = list(range(20_000))
        tree.insert("a", long)
        tree.insert("b", long[:-1] + [7])
        tree.activate("b")
        tree.remove("a")
        tree.insert("c", long)
        tree.finish("b")
        tree.check_invariants()
        assert tree.best().request_id == "c"

    def test_million_token_prompt(self, tree_cls):
        tree = tree_cls(chunk_size=256)
        assert tree.insert("huge", np.arange(1_000_000)) == 3907
        tree.insert("small", [1])
        tree.activate("huge")
        assert tree.best() == Candidate("small", 1, 1, 0, 0, 0, 0, 0, arrival=1.0)
        tree.finish("huge")
        tree.check_invariants()
        assert tree.num_nodes == 1

    def test_prompt_shorter_than_a_chunk_is_one_partial_chunk(self, tree_cls):
        tree = tree_cls(chunk_size=64)
        assert tree.insert("tiny", [3, 1, 4]) == 1
        tree.insert("twin", [3, 1, 4])
        tree.activate("tiny")
        assert tree.best() == Candidate("twin", 1, 0, 1, 0, 1, 1, 0, arrival=1.0)

    def test_nodes_are_released(self, tree_cls):
        tree = tree_cls(chunk_size=2)
        for i in range(50):
            tree.insert(i, [i % 3] * 10 + [i])
        for i in range(0, 50, 2):
            tree.activate(i)
        for i in range(50):
            tree.discard(i)
        assert len(tree) == 0 and tree.num_nodes == 0 and tree.best() is None and tree.shared_depth == 0
        tree.check_invariants()


class TestBadInput:
    @pytest.fixture
    def tree(self, tree_cls):
        tree = tree_cls(chunk_size=2)
        tree.insert("w", [1, 2, 3])
        tree.insert("a", [1, 2, 4])
        tree.activate("a")
        return tree

    @pytest.mark.parametrize(
        "call, error",
        [
            (lambda t: t.insert("w", [9]), DuplicateRequest),
            (lambda t: t.insert("a", [9]), DuplicateRequest),
            (lambda t: t.insert("e", []), EmptyPrompt),
            (lambda t: t.insert("e", [-5]), InvalidTokens),
            (lambda t: t.insert_hashes("e", []), EmptyPrompt),
            (lambda t: t.insert("e", [9, 9, 9], arrival="soon"), InvalidArrival),
            (lambda t: t.insert_hashes("e", [77, 78], arrival=object()), InvalidArrival),
            (lambda t: t.insert("e", [9, 9, 9], arrival=float("nan")), InvalidArrival),
            (lambda t: t.activate("a"), InvalidTransition),
            (lambda t: t.activate("nope"), UnknownRequest),
            (lambda t: t.finish("w"), InvalidTransition),
            (lambda t: t.deactivate("w"), InvalidTransition),
            (lambda t: t.remove("a"), InvalidTransition),
            (lambda t: t.remove("nope"), UnknownRequest),
            (lambda t: t.candidate("a"), InvalidTransition),
            (lambda t: t.num_missing("nope"), UnknownRequest),
            (lambda t: t.prefix_hash("nope"), UnknownRequest),
            (lambda t: t.prefix_hash("w", 0), ValueError),
            (lambda t: t.prefix_hash("w", 3), ValueError),
        ],
    )
    def test_refused_without_change(self, tree, call, error):
        before = snapshot(tree)
        with pytest.raises(error):
            call(tree)
        tree.check_invariants()
        assert snapshot(tree) == before

    def test_non_cumulative_hashes_refused(self, tree):
        before = snapshot(tree)
        existing = chunk_hashes([1, 2, 3], 2)
        with pytest.raises(HashChainError):
            tree.insert_hashes("x", [existing[1]])
        with pytest.raises(HashChainError):
            tree.insert_hashes("y", [11, 12, 11])
        tree.check_invariants()
        assert snapshot(tree) == before

    @pytest.mark.parametrize(
        "hashes",
        [
            [11, -12],
            array("q", [11, -12]),
            np.array([11, -12], dtype=np.int8),
            np.array([1.0, 2.0]),
            np.array([True, False]),
            np.array([[11, 12]], dtype=np.uint64),
            b"\x0b\x0c",
            bytearray(b"\x0b\x0c"),
            [2**64],
        ],
    )
    def test_bad_hash_values_refused(self, tree, hashes):
        before = snapshot(tree)
        with pytest.raises(HashChainError):
            tree.insert_hashes("x", hashes)
        tree.check_invariants()
        assert snapshot(tree) == before

    @pytest.mark.parametrize(
        "hashes",
        [
            [11, 12, 2**64 - 1],
            array("Q", [11, 12, 2**64 - 1]),
            np.array([11, 12, 2**64 - 1], dtype=np.uint64),
            np.array([11, 12, 2**64 - 1], dtype=">u8"),
            np.array([11, 0, 12, 0, 2**64 - 1], dtype=np.uint64)[::2],
        ],
    )
    def test_hash_buffers_read_like_sequences(self, tree_cls, hashes):
        tree = tree_cls(chunk_size=2)
        assert tree.insert_hashes("x", hashes) == 3
        assert tree.path_hashes("x") == (11, 12, 2**64 - 1)
        tree.check_invariants()

    def test_discard_unknown_is_false(self, tree):
        assert tree.discard("nope") is False

    def test_bad_chunk_size(self, tree_cls):
        with pytest.raises(ValueError):
            tree_cls(chunk_size=0)
