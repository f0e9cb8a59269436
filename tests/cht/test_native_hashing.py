"""The compiled core hashes prompts itself: its digests must equal `chunk_hashes` (the xxhash package)."""

from array import array

import numpy as np
import pytest

from sglang_feather.cht import chunk_hashes, namespace_seed


@pytest.fixture
def core(native_cls):
    from sglang_feather.cht._native import _core

    return _core


@pytest.mark.parametrize("num_tokens", [1, 3, 7, 8, 31, 32, 33, 64, 100, 1000, 10240])
@pytest.mark.parametrize("chunk_size", [1, 2, 7, 8, 64, 100])
def test_digests_equal_the_python_hashing(core, num_tokens, chunk_size):
    tokens = (np.arange(num_tokens, dtype=np.int64) * 7919 + 13) % 50_000
    expected = chunk_hashes(tokens, chunk_size)
    assert core.chunk_hashes(tokens, chunk_size, 0) == expected
    assert core.chunk_hashes(tokens.astype(np.uint32), chunk_size, 0) == expected
    assert core.chunk_hashes(array("q", tokens.tolist()), chunk_size, 0) == expected


def test_seeds_and_strided_buffers(core):
    tokens = np.arange(2000, dtype=np.int64)
    seed = namespace_seed("lora-a")
    assert core.chunk_hashes(tokens.astype(np.int32), 64, seed) == chunk_hashes(tokens, 64, "lora-a")
    assert core.chunk_hashes(tokens[::3], 16, 0) == chunk_hashes(tokens[::3].copy(), 16)


def test_tree_insert_uses_the_same_digests(native_cls):
    tree = native_cls(chunk_size=64)
    tokens = np.arange(5000, dtype=np.int64)
    tree.insert("a", tokens, namespace="ns")
    assert tree.path_hashes("a") == tuple(chunk_hashes(tokens, 64, "ns"))
