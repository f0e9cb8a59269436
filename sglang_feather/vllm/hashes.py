"""vLLM block hashes as CHT chunk hashes: no second hashing pass over the prompt."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from sglang_feather.types import ChunkHash, RequestId

_PRIVATE_SEED = 0xFEA7_0000_5EED
"""Seed of the private chunk hash of a prompt without a full block (distinct from every vLLM digest prefix
only by chance, at 2**-64 per pair, like any 64-bit chunk hash)."""


def chunk_hash(block_hash: bytes) -> ChunkHash:
    """The first 8 bytes of a vLLM `BlockHash`: vLLM's digests are already chained over the whole prefix."""
    if len(block_hash) < 8:
        raise ValueError(f"a vLLM block hash has at least 8 bytes, got {len(block_hash)}")
    return ChunkHash(int.from_bytes(block_hash[:8], "little"))


def request_chunk_hashes(request_id: RequestId, block_hashes: Sequence[bytes]) -> list[ChunkHash]:
    """A request's CHT path: one chunk per full vLLM block of its prompt.

    vLLM hashes only full blocks, so a prompt shorter than one block has no hash at all. It gets one private
    chunk derived from its request id: it shares nothing with anyone (which is true for vLLM's prefix cache
    too, which never reuses a partial block), costs one missing chunk, and is scheduled like any other.
    """
    if block_hashes:
        return [chunk_hash(h) for h in block_hashes]
    return [ChunkHash(xxhash.xxh64_intdigest(repr(request_id).encode("utf-8"), seed=_PRIVATE_SEED))]
