"""`Candidate`: what `best()` reports about the next waiting request."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_feather.types import RequestId


@dataclass(frozen=True, slots=True)
class Candidate:
    """The best waiting request, how much of it is already computed, and what admitting it would do to the
    batch's shared prefix (all in chunks)."""

    request_id: RequestId
    num_chunks: int
    num_missing: int
    """Chunks neither a running request nor the engine's cache holds: what its prefill computes."""
    depth_running: int
    """Its longest prefix held by running requests (0: it shares nothing with the batch)."""
    depth_cached: int
    """Its longest prefix the engine's cache holds, as the cache tier knows it (0 without cache events)."""
    depth_before: int
    """Shared-prefix depth of the running batch now. A batch of one request shares nothing yet, so it has
    nothing to lose: then `depth_before == depth_after`; an empty batch gives the candidate's `num_chunks`."""
    depth_after: int
    num_sharing: int
    """`w`: other waiting requests that hold the prefix of depth `depth_after` (0 when that depth is 0)."""

    @property
    def delta(self) -> int:
        return self.depth_before - self.depth_after

    @property
    def adds_group(self) -> bool:
        """No running request holds even its first chunk: admitting it adds a prefix group to the batch."""
        return self.depth_running == 0
