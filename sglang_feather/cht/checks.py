"""Argument checks both trees share, so that a bad argument raises the same CHT error on each."""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from sglang_feather.cht.errors import HashChainError, InvalidArrival, InvalidDepth
from sglang_feather.types import ChunkHash, RequestId

MAX_CHUNK_SIZE = 2**31
"""Tokens per chunk, exclusive bound (the compiled tree reads a chunk's bytes with 32-bit-safe arithmetic)."""


def _integer(name: str, value: Any, error: type[Exception]) -> int:
    """`value` as an int (anything with `__index__`); `error` naming `name` otherwise."""
    try:
        return operator.index(value)
    except TypeError:
        raise error(f"{name} must be an integer, got {value!r}") from None


def checked_chunk_size(chunk_size: int) -> int:
    """`chunk_size` as an int in [1, 2**31); `TypeError` for a non-integer, `ValueError` out of range."""
    value = _integer("chunk_size", chunk_size, TypeError)
    if not 1 <= value < MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size must lie in [1, 2**31), got {chunk_size}")
    return value


def checked_hashes(hashes: Sequence[ChunkHash]) -> array:
    """Chunk hashes as unsigned 64-bit integers; `HashChainError` for anything else."""
    try:
        return array("Q", hashes)
    except (TypeError, OverflowError, ValueError) as err:
        raise HashChainError(f"chunk hashes must be integers in [0, 2**64): {err}") from None


def checked_depth(request_id: RequestId, depth: int, lowest: int, num_chunks: int) -> int:
    """`depth` as an int in [lowest, num_chunks]; `InvalidDepth` for anything else."""
    value = _integer("depth", depth, InvalidDepth)
    if not lowest <= value <= num_chunks:
        raise InvalidDepth(
            f"depth must lie in [{lowest}, {num_chunks}] for request {request_id!r}, got {value}"
        )
    return value


def check_depth(request_id: RequestId, depth: int, num_chunks: int) -> int:
    """`depth` naming one of the request's prefixes (1 <= depth <= num_chunks); `InvalidDepth` otherwise."""
    return checked_depth(request_id, depth, 1, num_chunks)


def checked_share_depth(depth: int) -> int:
    """A depth for `shares_prefix`: any integer >= 0 (beyond a request's chunks it shares nothing)."""
    value = _integer("depth", depth, InvalidDepth)
    if value < 0:
        raise InvalidDepth(f"depth must be >= 0, got {value}")
    return value


def checked_arrival(request_id: RequestId, arrival: float | None) -> float | None:
    """`arrival` as a float (None stays None); `InvalidArrival` for NaN or anything `float()` refuses."""
    if arrival is None:
        return None
    try:
        value = float(arrival)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArrival(f"request {request_id!r} has arrival {arrival!r}, not a number") from None
    if value != value:
        raise InvalidArrival(f"request {request_id!r} has arrival NaN")
    return value


def checked_max_missing(max_missing: int | None) -> int:
    """`take_picks`'s `max_missing` as an int >= 1, `sys.maxsize` for None (no limit); `TypeError` for a
    non-integer, `ValueError` below 1."""
    if max_missing is None:
        return sys.maxsize
    value = _integer("max_missing", max_missing, TypeError)
    if value < 1:
        raise ValueError(f"max_missing must be >= 1, got {value}")
    return value


def checked_count(name: str, count: int) -> int:
    """A count argument as an int >= 0; `TypeError` for a non-integer, `ValueError` below 0."""
    value = _integer(name, count, TypeError)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value
