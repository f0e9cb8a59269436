"""`PythonTree`'s API on the compiled tree (sglang_feather/cht/_native/tree.cpp); import fails if it is not built."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

import numpy as np

from sglang_feather.cht._native import _tree
from sglang_feather.cht.candidate import TakenPicks, checked_picks
from sglang_feather.cht.checks import (
    check_depth,
    checked_chunk_size,
    checked_depth,
    checked_share_depth,
)
from sglang_feather.cht.errors import (
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidArrival,
    InvalidTokens,
    InvalidTransition,
    UnknownRequest,
)
from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE, namespace_seed, token_bytes
from sglang_feather.cht.nodes import RequestState
from sglang_feather.cht.tree import Candidate
from sglang_feather.types import ChunkHash, RequestId

# How it works. The C++ tree numbers requests with u32 handles (reused after a request leaves). `NativeTree`
# subclasses the compiled `Tree`, so every mutation (insert, insert_hashes, best, activate, finish,
# deactivate, remove, suspend, resume) and `candidate` are the compiled tree's own methods, with no Python frame:
# it holds this wrapper's request id -> handle dict and handle -> request id list, builds the `Candidate`,
# keeps the one-slot `best()` cache and raises the same exceptions as the Python tree (every check happens
# before the first mutation there too). Token buffers (numpy, array.array) are hashed in place, with no copy;
# other sequences are packed and validated by `token_bytes` first, exactly as the Python tree does. The cache
# tier's events and queries (`cache_store`, `cache_remove`, `cache_clear`, `is_cached`, `num_cached`) take
# hashes, not request ids, and are the compiled tree's own methods too. Queries by request id go through the Python
# methods below, which map ids to handles.

_STATES = (None, RequestState.WAITING, RequestState.ACTIVE)
_BUFFERS = (np.ndarray, array)


class NativeTree(_tree.Tree):
    """The compiled Chunked Hash Tree; same methods, results and errors as `PythonTree`."""

    backend = "native"
    """Which backend this is (`backend_name()` names the one `ChunkedHashTree` is)."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE):
        chunk_size = checked_chunk_size(chunk_size)
        super().__init__(chunk_size)
        self.chunk_size = chunk_size
        self._handles: dict[RequestId, int] = {}
        self._ids: list[RequestId] = []
        self._bind(self._handles, self._ids, Candidate, UnknownRequest, InvalidTransition)
        self._bind_insert(
            _BUFFERS,
            token_bytes,
            namespace_seed,
            DuplicateRequest,
            EmptyPrompt,
            InvalidTokens,
            HashChainError,
            InvalidArrival,
        )

    # ----------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._handles

    def state(self, request_id: RequestId) -> RequestState | None:
        handle = self._handles.get(request_id)
        return None if handle is None else _STATES[self._state(handle)]

    def is_suspended(self, request_id: RequestId) -> bool:
        return self._is_suspended(self._handle(request_id))

    def waiting_ids(self) -> Iterator[RequestId]:
        ids = self._ids
        return iter([ids[h] for h in self._waiting()])

    def active_ids(self) -> Iterator[RequestId]:
        ids = self._ids
        return iter([ids[h] for h in self._active()])

    def num_chunks(self, request_id: RequestId) -> int:
        return self._num_chunks(self._handle(request_id))

    def path_hashes(self, request_id: RequestId) -> tuple[ChunkHash, ...]:
        return tuple(self._path_hashes(self._handle(request_id)))

    def prefix_hash(self, request_id: RequestId, depth: int = 1) -> ChunkHash:
        handle = self._handle(request_id)
        return self._prefix_hash(handle, check_depth(request_id, depth, self._num_chunks(handle)))

    def arrival(self, request_id: RequestId) -> float:
        return self._arrival(self._handle(request_id))

    def num_missing(self, request_id: RequestId) -> int:
        return self._num_missing(self._handle(request_id))

    def num_holding(self, request_id: RequestId, depth: int) -> int:
        handle = self._handle(request_id)
        return self._num_holding(handle, checked_depth(request_id, depth, 0, self._num_chunks(handle)))

    def num_waiting_holding(self, request_id: RequestId, depth: int) -> int:
        handle = self._handle(request_id)
        return self._num_waiting_holding(
            handle, checked_depth(request_id, depth, 0, self._num_chunks(handle))
        )

    def shares_prefix(self, request_id: RequestId, other_id: RequestId, depth: int) -> bool:
        handle, other = self._handle(request_id), self._handle(other_id)
        depth = checked_share_depth(depth)
        if depth > min(self._num_chunks(handle), self._num_chunks(other)):
            return False
        return self._shares_prefix(handle, other, depth)

    def take_picks(
        self,
        max_picks: int,
        skip_running_uncached: bool,
        max_missing: int | None = None,
        first: RequestId | None = None,
    ) -> TakenPicks:
        """`take_picks_stepwise`'s picks (candidate.py), in one call into the compiled tree's own loop."""
        checked = checked_picks(max_picks, skip_running_uncached, max_missing)
        return TakenPicks(*self._take_picks(*checked, first))

    def oldest(self) -> RequestId | None:
        handle = self._oldest()
        return None if handle < 0 else self._ids[handle]

    def oldest_stranger(self) -> RequestId | None:
        handle = self._oldest_stranger()
        return None if handle < 0 else self._ids[handle]

    def cached_frontier(self, request_ids: Iterable[RequestId], limit: int) -> list[RequestId]:
        return self._cached_frontier(request_ids, limit)

    def prefix_order(self, request_ids: Iterable[RequestId]) -> list[RequestId]:
        handles = [self._handle(rid) for rid in request_ids]
        ids = self._ids
        return [ids[h] for h in self._prefix_order(handles)]

    # ----------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """The compiled tree's own recount (tree.cpp `check`) plus the id mapping kept here."""
        from sglang_feather.cht.invariants import InvariantError

        problem = self._check()
        if problem:
            raise InvariantError(problem)
        if self._num_requests != len(self._handles):
            raise InvariantError("the id map and the compiled tree disagree on the number of requests")
        for rid, handle in self._handles.items():
            if self._ids[handle] != rid or self._state(handle) == 0:
                raise InvariantError(f"request {rid!r} maps to a handle the compiled tree does not hold")

    # ----------------------------------------------------------------- internals

    def _handle(self, request_id: RequestId) -> int:
        try:
            return self._handles[request_id]
        except KeyError:
            raise UnknownRequest(f"request {request_id!r} is not in the tree") from None
