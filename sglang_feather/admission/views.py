"""Read-only views of the admission's Chunked Hash Tree: what engine adapters may ask without touching it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sglang_feather.admission.refresh import prefixes_to_refresh
from sglang_feather.cht import ChunkedHashTree, RequestState
from sglang_feather.types import ChunkHash, RequestId


class TreeViews:
    """Mixed into `Admission`: every question an adapter asks about tracked requests goes through these."""

    tree: ChunkedHashTree

    @property
    def chunk_size(self) -> int:
        return self.tree.chunk_size

    @property
    def num_waiting(self) -> int:
        return self.tree.num_waiting

    @property
    def num_active(self) -> int:
        return self.tree.num_active

    @property
    def num_running_groups(self) -> int:
        """Prefix groups (first chunks) the running requests belong to."""
        return self.tree.num_running_groups

    def state(self, request_id: RequestId) -> RequestState | None:
        """WAITING, ACTIVE, or None for a request Feather does not track."""
        return self.tree.state(request_id)

    def is_waiting(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.WAITING

    def is_active(self, request_id: RequestId) -> bool:
        return self.tree.state(request_id) is RequestState.ACTIVE

    def is_skipped(self, request_id: RequestId) -> bool:
        """Skipped for the rest of this pass (deferred, or passed over by the engine's loop)."""
        return self.tree.is_suspended(request_id)

    def prefix_hash(self, request_id: RequestId) -> ChunkHash:
        """The hash of a request's first chunk: its prefix group."""
        return self.tree.prefix_hash(request_id)

    def covered_tokens(self, request_id: RequestId) -> int:
        """Prompt tokens of a tracked request that running requests or the engine's cache hold (whole chunks,
        as the cache tier knows them): what its prefill will not compute. For engines' load reports."""
        tree = self.tree
        return (tree.num_chunks(request_id) - tree.num_missing(request_id)) * tree.chunk_size

    def prefixes_to_refresh(self, queue_head: Iterable[RequestId]) -> list[RequestId]:
        """The waiting requests whose cached prefixes the engine should refresh in its LRU this pass, in that
        order, from its waiting queue's ids in queue order (at most `REFRESH_WINDOW` of them read; `refresh.py`)."""
        return prefixes_to_refresh(self.tree, queue_head)

    def prefix_order(self, request_ids: Sequence[RequestId]) -> list[RequestId]:
        """The tracked ones of `request_ids` with requests sharing a prefix contiguous at every depth."""
        tree = self.tree
        return tree.prefix_order([rid for rid in request_ids if rid in tree])
