"""The compiled tree hashes prompts itself: its digests must equal `chunk_hashes` (the xxhash package)."""

from array import array

import numpy as np
import pytest

from sglang_feather.cht import (
    EmptyPrompt,
    HashChainError,
    InvalidTokens,
    PythonTree,
    chunk_hashes,
    namespace_seed,
)


@pytest.fixture
def native(native_cls):
    from sglang_feather.cht._native import _tree

    return _tree


@pytest.mark.parametrize("num_tokens", [1, 3, 7, 8, 31, 32, 33, 64, 100, 1000, 10240])
@pytest.mark.parametrize("chunk_size", [1, 2, 7, 8, 64, 100])
def test_digests_equal_the_python_hashing(native, num_tokens, chunk_size):
    tokens = (np.arange(num_tokens, dtype=np.int64) * 7919 + 13) % 50_000
    expected = chunk_hashes(tokens, chunk_size)
    assert native.chunk_hashes(tokens, chunk_size, 0) == expected
    assert native.chunk_hashes(tokens.astype(np.uint32), chunk_size, 0) == expected
    assert native.chunk_hashes(array("q", tokens.tolist()), chunk_size, 0) == expected


def test_seeds_and_strided_buffers(native):
    tokens = np.arange(2000, dtype=np.int64)
    seed = namespace_seed("lora-a")
    assert native.chunk_hashes(tokens.astype(np.int32), 64, seed) == chunk_hashes(tokens, 64, "lora-a")
    assert native.chunk_hashes(tokens[::3], 16, 0) == chunk_hashes(tokens[::3].copy(), 16)


def test_tree_insert_uses_the_same_digests(native_cls):
    tree = native_cls(chunk_size=64)
    tokens = np.arange(5000, dtype=np.int64)
    tree.insert("a", tokens, namespace="ns")
    assert tree.path_hashes("a") == tuple(chunk_hashes(tokens, 64, "ns"))


DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


@pytest.mark.parametrize("dtype", [">i2", ">u4", ">i8", ">u8"])
def test_other_byte_orders_are_read_by_value(native_cls, dtype):
    """A big-endian numpy array is not read in place (its bytes are not the ids): the insert packs it the
    way the Python tree does, so both trees agree on its digests and on refusing a negative id."""
    tokens = np.array([1, 2, 3, 7, 250, 9], dtype=dtype)
    for tree_cls in (PythonTree, native_cls):
        tree = tree_cls(chunk_size=2)
        tree.insert("a", tokens)
        assert tree.path_hashes("a") == tuple(chunk_hashes(tokens.astype(np.int64), 2))
        if dtype[1] == "i":
            with pytest.raises(InvalidTokens):
                tree.insert("b", -tokens)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 9, 63, 64, 65, 1001])
def test_every_integer_width_is_read_in_place(native, dtype, num_tokens):
    info = np.iinfo(dtype)
    high = min(int(info.max), 2**32 - 1)
    tokens = np.random.default_rng(num_tokens).integers(0, high, size=num_tokens, endpoint=True).astype(dtype)
    expected = chunk_hashes(tokens.astype(np.int64), 7)
    assert native.chunk_hashes(tokens, 7, 0) == expected
    assert native.chunk_hashes(tokens[::-1], 7, 0) == chunk_hashes(tokens[::-1].astype(np.int64), 7)
    assert native.chunk_hashes(np.repeat(tokens, 2)[::2], 7, 0) == expected


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
@pytest.mark.parametrize("at", [0, 5, 8, 62, 63, 64])
def test_a_negative_id_anywhere_is_refused(native_cls, dtype, at):
    tree = native_cls(chunk_size=8)
    tokens = np.arange(65, dtype=dtype) % 100
    tokens[at] = -1
    with pytest.raises(InvalidTokens):
        tree.insert("a", tokens)
    with pytest.raises(InvalidTokens):
        tree.insert("a", np.repeat(tokens, 2)[::2])
    assert len(tree) == 0 and tree.num_nodes == 0


@pytest.mark.parametrize("at", [0, 7, 64])
def test_an_id_at_or_above_2_32_is_refused(native_cls, at):
    tree = native_cls(chunk_size=8)
    tokens = np.arange(65, dtype=np.uint64)
    tokens[at] = 2**32
    with pytest.raises(InvalidTokens):
        tree.insert("a", tokens)
    tokens[at] = 2**32 - 1
    assert tree.insert("a", tokens) == 9


@pytest.mark.parametrize("num_words", [0, 1, 7, 8, 9, 1000, 10240])
def test_read_words_is_the_xor_of_the_buffer(native, num_words):
    words = np.random.default_rng(num_words).integers(0, 2**63, size=num_words, dtype=np.int64)
    expected = int(np.bitwise_xor.reduce(words.view(np.uint64))) if num_words else 0
    assert native.read_words(words) == expected
    assert native.read_words(array("q", words.tolist())) == expected


def test_read_words_refuses_strided_buffers(native):
    with pytest.raises(ValueError, match="contiguous"):
        native.read_words(np.arange(16, dtype=np.int64)[::2])


@pytest.mark.parametrize(
    "tokens",
    [
        [1, 2, 3],
        (1, 2, 3, 4, 5),
        [2**32 - 1, 0],
        [],
        [-1],
        [2**32],
        [1, 2**70],
        [1.5],
        ["a"],
        [-1, "a"],
        ["a", -1],
        [True, 2],
        [np.int64(3), 4],
        range(5),
    ],
    ids=repr,
)
def test_lists_are_read_like_token_bytes(native_cls, tokens):
    """Lists and tuples of ints are packed in the compiled tree (other items and sequences go through `token_bytes`):
    the same digests, or the same error, as the Python tree."""
    outcomes = []
    for tree_cls in (PythonTree, native_cls):
        tree = tree_cls(chunk_size=2)
        try:
            tree.insert("a", tokens)
            outcomes.append(tree.path_hashes("a"))
        except (InvalidTokens, EmptyPrompt) as err:
            outcomes.append(type(err))
    assert outcomes[0] == outcomes[1]


def _raising(*values):
    yield from values
    raise RuntimeError("the engine's iterator failed")


def _outcome(method, *args):
    try:
        return ("ok", method(*args))
    except Exception as err:  # the type is what both trees must agree on
        return (type(err).__name__,)


# Hash lists and parents as the cache events take them: what insert_hashes reads (buffers in place, other
# sequences item by item); anything array('Q', ...) refuses is HashChainError, anything else an iterator raises
# propagates.
CHAINS = [
    ([5, 6], None),
    ((5, 6), 2),
    (array("Q", [5, 6]), 2),
    (np.array([5, 6], dtype=np.int32), 2),
    (np.array([5, 6], dtype=">u8"), 2),
    (np.array([5.0]), None),
    (np.array([-1], dtype=np.int8), None),
    (np.ones((2, 2), dtype=np.int64), None),
    (range(5, 7), None),
    ([], 2),
    ([], None),
    ("ab", None),
    ("", None),
    (b"\x05", None),
    (None, None),
    (5, None),
    ([[5]], None),
    ([-1], None),
    ([2**64], None),
    ([1.0], None),
    ([np.uint64(5)], None),
    ([5], "x"),
    ([5], -1),
    ([5], 2**64),
    ([5], 2.0),
    ([5], np.uint64(2)),
    ([5], 77),
    ([8, 8], None),
    ([2], None),
    ([1, 3], None),
]


@pytest.mark.parametrize("chain, parent", CHAINS, ids=repr)
def test_cache_store_reads_chains_like_insert_hashes(native_cls, chain, parent):
    outcomes = []
    for tree_cls in (PythonTree, native_cls):
        tree = tree_cls(chunk_size=2)
        tree.cache_store([1, 2])
        tree.insert_hashes("r", [1, 2, 3])
        outcomes.append((_outcome(tree.cache_store, chain, parent), tree.num_cached, tree.best()))
        tree.check_invariants()
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(
    "hashes",
    [[2], [1.0], [np.uint64(2)], [True], ["a"], [-1], [2**70], [None], [[1]], 1, None, b"\x02", "ab"],
    ids=repr,
)
def test_cache_remove_looks_hashes_up_like_a_dict(native_cls, hashes):
    outcomes = []
    for tree_cls in (PythonTree, native_cls):
        tree = tree_cls(chunk_size=2)
        tree.cache_store([1, 2])
        tree.insert_hashes("r", [1, 2, 3])
        removed = _outcome(tree.cache_remove, hashes)
        looked_up = _outcome(tree.is_cached, hashes[0]) if isinstance(hashes, list) else None
        outcomes.append((removed, looked_up, tree.num_cached, tree.best()))
        tree.check_invariants()
    assert outcomes[0] == outcomes[1]


def test_an_iterator_that_raises_changes_nothing(native_cls):
    for tree_cls in (PythonTree, native_cls):
        tree = tree_cls(chunk_size=2)
        tree.cache_store([1, 2])
        tree.insert_hashes("r", [1, 2, 3])
        with pytest.raises(RuntimeError):
            tree.cache_remove(_raising(1))
        with pytest.raises(RuntimeError):
            tree.cache_store(_raising(1, 2))
        assert tree.num_cached == 2 and tree.best().depth_cached == 2
        tree.check_invariants()


def test_none_is_a_request_id_and_not_a_hash_list(native_cls):
    """The compiled tree's arguments accept None as the Python tree's do."""
    for tree_cls in (PythonTree, native_cls):
        tree = tree_cls(chunk_size=2)
        with pytest.raises(HashChainError):
            tree.insert_hashes("r", None)
        assert tree.insert_hashes(None, [1, 2]) == 2
        assert tree.best().request_id is None and tree.candidate(None).num_chunks == 2
        tree.activate(None)
        tree.finish(request_id=None)
        assert not tree.discard(None) and len(tree) == 0
        tree.check_invariants()
