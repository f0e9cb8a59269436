"""Cumulative chunk hashing: one xxh64 digest per chunk boundary of a prompt."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import numpy as np
import xxhash

from sglang_feather.cht.errors import EmptyPrompt, InvalidNamespace, InvalidTokens
from sglang_feather.types import ChunkHash

DEFAULT_CHUNK_SIZE = 64
"""Tokens per chunk. 64 keeps hashing a 10K-token prompt at ~40 µs and a best() candidate's depth
resolution at 64 tokens; see docs/overhead.md for the measured sweep (16..512) behind the choice."""

_MAX_TOKEN = 2**32


def namespace_seed(namespace: str | None) -> int:
    """The xxh64 seed for a namespace (LoRA id, cache salt); `None` is the shared default namespace 0."""
    if namespace is None:
        return 0
    if not isinstance(namespace, str):
        raise InvalidNamespace(f"a namespace is a str or None, got {type(namespace).__name__}")
    return xxhash.xxh64_intdigest(namespace.encode("utf-8"), seed=0x5EED) or 1


def token_bytes(token_ids: Sequence[int] | array | np.ndarray) -> bytes:
    """Token ids as 4-byte little-endian unsigned integers; raises `InvalidTokens` for ids outside [0, 2**32)."""
    if isinstance(token_ids, np.ndarray | array):
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise InvalidTokens(
                f"token ids must be a 1-D integer sequence, got {ids.dtype} of shape {ids.shape}"
            )
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= _MAX_TOKEN):
            raise InvalidTokens("token ids must lie in [0, 2**32)")
        return ids.astype("<u4", copy=False).tobytes()
    try:
        return struct.pack(f"<{len(token_ids)}I", *token_ids)
    except TypeError:
        raise InvalidTokens(
            f"token ids must be a sequence of integers, got {type(token_ids).__name__}"
        ) from None
    except struct.error as err:
        raise InvalidTokens(f"token ids must be integers in [0, 2**32): {err}") from None


def chunk_hashes(
    token_ids: Sequence[int] | array | np.ndarray,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    namespace: str | None = None,
) -> list[ChunkHash]:
    """Cumulative hashes of a prompt: element i is xxh64 over tokens [0, (i+1)·chunk_size).

    One digest per full chunk plus one for a final partial chunk, so a prompt of n tokens yields
    ceil(n / chunk_size) hashes. Requests in different namespaces never share a hash.

    >>> len(chunk_hashes(list(range(130)), chunk_size=64))
    3
    >>> chunk_hashes([1, 2, 3], 2)[0] == chunk_hashes([1, 2, 9], 2)[0]
    True
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    data = memoryview(token_bytes(token_ids))
    if not data:
        raise EmptyPrompt("a prompt needs at least one token")
    state = xxhash.xxh64(seed=namespace_seed(namespace))
    step = 4 * chunk_size
    hashes = []
    for start in range(0, len(data), step):
        state.update(data[start : start + step])
        hashes.append(ChunkHash(state.intdigest()))
    return hashes
