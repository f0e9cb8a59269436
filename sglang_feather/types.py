"""Small shared types: chunk hashes and request ids."""

from collections.abc import Hashable
from typing import NewType

ChunkHash = NewType("ChunkHash", int)
"""A cumulative 64-bit hash of a prompt prefix that ends at a chunk boundary (or at the prompt's end).

Two requests hold the same `ChunkHash` exactly when they share every token up to that point (and the
namespace), so a hash names a prefix, not a chunk's content. Kept distinct from `int` so that token ids,
counts and hashes cannot be mixed up silently."""

RequestId = Hashable
"""Whatever the engine uses to name a request (SGLang `rid`, vLLM `request_id`, simulator index)."""
