"""The Chunked Hash Tree: prefix-sharing bookkeeping for waiting and running requests."""

from sglang_feather.cht.backend import ChunkedHashTree, backend_name, new_tree
from sglang_feather.cht.candidate import TakenPicks
from sglang_feather.cht.errors import (
    CHTError,
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidArrival,
    InvalidTokens,
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, chunk_hashes, namespace_seed
from sglang_feather.cht.tree import Candidate, PythonTree, RequestState

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "CHTError",
    "Candidate",
    "ChunkedHashTree",
    "DuplicateRequest",
    "EmptyPrompt",
    "HashChainError",
    "InvalidArrival",
    "InvalidTokens",
    "InvalidTransition",
    "PythonTree",
    "RequestState",
    "TakenPicks",
    "UnknownRequest",
    "backend_name",
    "chunk_hashes",
    "namespace_seed",
    "new_tree",
]
