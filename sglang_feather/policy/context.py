"""Discretised decision contexts shared by the learning stoppers: the authors' buckets plus the new-group costs."""

from __future__ import annotations

from typing import NamedTuple

from sglang_feather.policy.base import Observation

# How it works.
#
# A context is a tuple of small bucket numbers that a learning stopper keeps one table row for. The first three
# are the authors' (batch size, Δ, w). They decide the paper's case, a candidate that cuts the shared prefix
# of a homogeneous batch; under continuous batching the running batch mixes groups, its shared depth is 0
# and so are Δ and w, so on their own they tell a learner nothing. The last four are zero unless the
# candidate adds a prefix group to the running batch (`Observation.adds_group`), and then say what that
# costs: how many groups a decode step already reads (log2 buckets), how much KV the candidate adds to each
# step's read (by its new chunks: up to 1K, 4K, 8K tokens of 64-token chunks, or more), how much of the KV
# pool the engine can still give out, and how many waiting requests of its group would share what it brings.
# A context without the last four equals the authors' (a saved three-number context loads as one).

BUCKET_WIDTH = 4
"""Batch size and `w` are bucketed by integer division by 4 ..."""
MAX_BUCKET = 10
"""... and capped at bucket 10 (40 requests and more share a bucket)."""
DELTA_CLAMP = 5
"""Δ is clamped to [-5, 5] chunks (our Δ is never negative, so in effect [0, 5])."""
MAX_GROUPS_BUCKET = 6
"""Groups running, for a new-group candidate: 1 + floor(log2(groups)), capped at 6 (32 groups and more)."""
NEW_CHUNK_EDGES = (16, 64, 128)
"""New chunks up to 16, 64, 128 (1K, 4K, 8K tokens at the default 64-token chunk) or more: buckets 1-4."""
ROOM_EDGES = (0.1, 0.3)
"""KV pool share still free: under 10 %, under 30 %, or more (buckets 1-3; 0 when the engine did not say)."""
PEER_EDGES = (1, 4, 16)
"""Waiting requests of the candidate's group: none, 1-3, 4-15, 16 or more (buckets 1-4)."""
NUM_FIELDS = 7
AUTHORS_FIELDS = 3


class Context(NamedTuple):
    batch_bucket: int
    delta: int
    sharing_bucket: int
    groups_bucket: int = 0
    """0: the candidate's group runs already; else 1 + floor(log2(groups running)), capped."""
    new_kv_bucket: int = 0
    room_bucket: int = 0
    peers_bucket: int = 0


def _edge_bucket(value: float, edges: tuple[float, ...]) -> int:
    """1 + how many edges `value` reaches (edges ascending)."""
    return 1 + sum(value >= edge for edge in edges)


def context_of(obs: Observation) -> Context:
    """The one place contexts come from: (min(bs // 4, 10), clamp(Δ, -5, 5), min(w // 4, 10)) as in the
    authors' bandit, then, for a candidate that adds a prefix group, the buckets of its costs."""
    authors = (
        min(obs.batch_size // BUCKET_WIDTH, MAX_BUCKET),
        max(-DELTA_CLAMP, min(DELTA_CLAMP, obs.delta)),
        min(obs.num_sharing // BUCKET_WIDTH, MAX_BUCKET),
    )
    if not obs.adds_group:
        return Context(*authors)
    room = obs.kv_free_fraction
    return Context(
        *authors,
        groups_bucket=1 + min(MAX_GROUPS_BUCKET - 1, max(obs.num_groups_running, 1).bit_length() - 1),
        new_kv_bucket=1 + sum(obs.num_new_chunks > edge for edge in NEW_CHUNK_EDGES),
        room_bucket=0 if room is None else _edge_bucket(room, ROOM_EDGES),
        peers_bucket=_edge_bucket(obs.num_group_waiting, PEER_EDGES),
    )


def is_forced(obs: Observation) -> bool:
    """No choice to learn: nothing is at stake. That is an empty batch, or a candidate whose prefix group
    already runs and that cuts no shared prefix (Δ = 0): its chunks are either held by running requests or
    its own private tail, which it needs whenever it runs, so a STOP would only postpone it.

    A candidate that adds a prefix group is never forced, whatever Δ (under continuous batching the running
    batch mixes groups, so Δ is 0 for everyone and a Δ rule would never ask). The aging guard's admissions
    never reach the stopper (`Admission`).
    """
    return is_forced_case(obs.batch_size, obs.adds_group, obs.delta)


def is_forced_case(batch_size: int, adds_group: bool, delta: int) -> bool:
    """`is_forced` from the three fields it reads (for a caller that builds no `Observation`)."""
    return batch_size == 0 or (not adds_group and delta == 0)


def parse_context(raw: object) -> Context:
    """A context read back from JSON (three or seven ints; three is the authors' context); ValueError otherwise."""
    if not (
        isinstance(raw, list | tuple)
        and len(raw) in (AUTHORS_FIELDS, NUM_FIELDS)
        and all(type(v) is int for v in raw)
    ):
        raise ValueError(f"a context must be {AUTHORS_FIELDS} or {NUM_FIELDS} ints, got {raw!r}")
    return Context(*raw)
