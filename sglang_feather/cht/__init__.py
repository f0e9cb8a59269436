"""The Chunked Hash Tree: prefix-sharing bookkeeping for waiting and running requests."""

from sglang_feather.cht.errors import (
    CHTError,
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidTokens,
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, chunk_hashes, namespace_seed
from sglang_feather.cht.tree import Candidate, ChunkedHashTree, RequestState

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "CHTError",
    "Candidate",
    "ChunkedHashTree",
    "DuplicateRequest",
    "EmptyPrompt",
    "HashChainError",
    "InvalidTokens",
    "InvalidTransition",
    "RequestState",
    "UnknownRequest",
    "chunk_hashes",
    "namespace_seed",
]
