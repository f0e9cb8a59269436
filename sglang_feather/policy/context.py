"""Discretised decision contexts shared by the learning stoppers (the authors' bucketing)."""

from __future__ import annotations

from typing import NamedTuple

from sglang_feather.policy.base import Observation

BUCKET_WIDTH = 4
"""Batch size and `w` are bucketed by integer division by 4 ..."""
MAX_BUCKET = 10
"""... and capped at bucket 10 (40 requests and more share a bucket)."""
DELTA_CLAMP = 5
"""Δ is clamped to [-5, 5] chunks (our Δ is never negative, so in effect [0, 5])."""


class Context(NamedTuple):
    batch_bucket: int
    delta: int
    sharing_bucket: int


def context_of(obs: Observation) -> Context:
    """(min(bs // 4, 10), clamp(Δ, -5, 5), min(w // 4, 10)), as in the authors' bandit."""
    return Context(
        min(obs.batch_size // BUCKET_WIDTH, MAX_BUCKET),
        max(-DELTA_CLAMP, min(DELTA_CLAMP, obs.delta)),
        min(obs.num_sharing // BUCKET_WIDTH, MAX_BUCKET),
    )


def is_forced(obs: Observation) -> bool:
    """No choice to learn: an empty batch, or a candidate that cuts no shared prefix (Δ = 0).

    Δ = 0 at depth 0 is forced too: the batch already shares nothing, so a STOP protects no prefix and
    only postpones a request (a learning stopper would otherwise explore STOP once per new context, which
    on a fresh server stops about one pass in two; docs/sglang.md, "The demo").
    """
    return obs.batch_size == 0 or obs.delta == 0


def parse_context(raw: object) -> Context:
    """A context read back from JSON (a list of three ints); ValueError otherwise."""
    if not (isinstance(raw, list | tuple) and len(raw) == 3 and all(type(v) is int for v in raw)):
        raise ValueError(f"a context must be three ints, got {raw!r}")
    return Context(*raw)
