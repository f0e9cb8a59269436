"""`PythonTree`'s API on the compiled core (sglang_feather/cht/_native/core.cpp); import fails if it is not built."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from sglang_feather.cht._native import _core
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

# How it works. The C++ core numbers requests with u32 handles (reused after a request leaves). `NativeTree`
# subclasses the compiled `Core`, so the per-step calls (best, activate, finish, deactivate, remove, suspend,
# resume, candidate) are the core's own methods, with no Python frame: the core holds this wrapper's request
# id -> handle dict and handle -> request id list, builds the `Candidate`, keeps the one-slot `best()` cache
# and raises the same exceptions as the Python core (every check happens before the first mutation there
# too). Inserts and queries go through the Python methods below, which map ids to handles. Token buffers
# (numpy, array.array) go to the core without a copy; other sequences are packed and validated by
# `token_bytes` first, exactly as the Python core does.

_STATES = (None, RequestState.WAITING, RequestState.ACTIVE)
_BUFFERS = (np.ndarray, array)


class NativeTree(_core.Core):
    """The compiled Chunked Hash Tree; same methods, results and errors as `PythonTree`."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        super().__init__(chunk_size)
        self.chunk_size = chunk_size
        self._handles: dict[RequestId, int] = {}
        self._ids: list[RequestId] = []
        self._bind(self._handles, self._ids, Candidate, UnknownRequest, InvalidTransition)

    # ----------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._handles

    @property
    def num_waiting(self) -> int:
        return len(self._handles) - self.num_active

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

    def num_missing(self, request_id: RequestId) -> int:
        return self._num_missing(self._handle(request_id))

    def num_holding(self, request_id: RequestId, depth: int) -> int:
        return self._num_holding(self._handle(request_id), depth)

    def shares_prefix(self, request_id: RequestId, other_id: RequestId, depth: int) -> bool:
        return self._shares_prefix(self._handle(request_id), self._handle(other_id), depth)

    def oldest(self) -> RequestId | None:
        handle = self._oldest()
        return None if handle < 0 else self._ids[handle]

    def prefix_order(self, request_ids: Iterable[RequestId]) -> list[RequestId]:
        handles = [self._handle(rid) for rid in request_ids]
        ids = self._ids
        return [ids[h] for h in self._prefix_order(handles)]

    # ----------------------------------------------------------------- mutations

    def insert(
        self,
        request_id: RequestId,
        token_ids: Sequence[int] | array | np.ndarray,
        *,
        namespace: str | None = None,
        arrival: float | None = None,
    ) -> int:
        if request_id in self._handles:
            raise DuplicateRequest(f"request {request_id!r} is already in the tree")
        if not isinstance(token_ids, _BUFFERS):
            token_ids = memoryview(token_bytes(token_ids)).cast("I")
        seed = namespace_seed(namespace) if namespace is not None else 0
        if arrival is None:
            code = self._insert_tokens(token_ids, self.chunk_size, seed, 0.0, False)
        else:
            code = self._insert_tokens(token_ids, self.chunk_size, seed, float(arrival), True)
        return self._added(request_id, code)

    def insert_hashes(
        self, request_id: RequestId, hashes: Sequence[ChunkHash], *, arrival: float | None = None
    ) -> int:
        if request_id in self._handles:
            raise DuplicateRequest(f"request {request_id!r} is already in the tree")
        if arrival is None:
            code = self._insert_hashes(hashes, 0.0, False)
        else:
            code = self._insert_hashes(hashes, float(arrival), True)
        return self._added(request_id, code)

    def check_invariants(self) -> None:
        """The core's own recount (core.cpp `check`) plus the id mapping kept here."""
        from sglang_feather.cht.invariants import InvariantError

        problem = self._check()
        if problem:
            raise InvariantError(problem)
        if self._num_requests != len(self._handles):
            raise InvariantError("the id map and the core disagree on the number of requests")
        for rid, handle in self._handles.items():
            if self._ids[handle] != rid or self._state(handle) == 0:
                raise InvariantError(f"request {rid!r} maps to a handle the core does not hold")

    # ----------------------------------------------------------------- internals

    def _handle(self, request_id: RequestId) -> int:
        try:
            return self._handles[request_id]
        except KeyError:
            raise UnknownRequest(f"request {request_id!r} is not in the tree") from None

    def _added(self, request_id: RequestId, code: int) -> int:
        if code < 0:
            raise _INSERT_ERRORS[code](request_id)
        handle = code & 0xFFFFFFFF
        ids = self._ids
        if handle == len(ids):
            ids.append(request_id)
        else:
            ids[handle] = request_id
        self._handles[request_id] = handle
        return code >> 32


_INSERT_ERRORS = {
    _core.EMPTY: lambda rid: EmptyPrompt(f"request {rid!r} has no chunks"),
    _core.INVALID_TOKENS: lambda rid: InvalidTokens(
        f"request {rid!r}: token ids must be a 1-D integer sequence in [0, 2**32)"
    ),
    _core.HASH_CHAIN: lambda rid: HashChainError(
        f"request {rid!r}: a hash repeats, skips a level or sits under another prefix: hashes are not "
        "cumulative or two prefixes collide"
    ),
    _core.BAD_HASH: lambda rid: HashChainError(
        f"request {rid!r}: chunk hashes must be integers in [0, 2**64)"
    ),
    _core.BAD_ARRIVAL: lambda rid: InvalidArrival(f"request {rid!r} has arrival NaN"),
}
