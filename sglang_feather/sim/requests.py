"""Per-request simulator state: tokens, block hashes, shared nodes, KV held and the request's timeline."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sglang_feather.cht.hashing import chunk_hashes
from sglang_feather.sim.sharing import SharedNode, block_ends, decompose
from sglang_feather.sim.trace import SimRequest, TokenSource, validate
from sglang_feather.types import ChunkHash
from sglang_feather.workload import Segment


class Phase(enum.Enum):
    PENDING = "pending"
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class ReqState:
    spec: SimRequest
    tokens: np.ndarray
    hashes: list[ChunkHash]
    ends: list[int]
    nodes: tuple[SharedNode, ...]
    group: str
    phase: Phase = Phase.PENDING
    num_out: int = 0
    fill_len: int = 0
    num_filled: int = 0
    num_private: int = 0
    locked: list[ChunkHash] = field(default_factory=list)
    arrival_t: float | None = None
    admit_t: float | None = None
    first_token_t: float | None = None
    finish_t: float | None = None
    num_prefills: int = 0
    cache_hit: int = 0
    cache_miss: int = 0

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def prompt_len(self) -> int:
        return len(self.tokens)

    @property
    def remaining_out(self) -> int:
        """Output tokens the engine still reserves room for: the request's cap less those generated."""
        return self.spec.max_new - self.num_out

    def served_times(self) -> tuple[float, float, float]:
        """Arrival, admission and first-token times of a request that has produced its first token."""
        if self.arrival_t is None or self.admit_t is None or self.first_token_t is None:
            raise RuntimeError(f"request {self.rid} has not arrived, been admitted and produced a token")
        return self.arrival_t, self.admit_t, self.first_token_t

    def cost_nodes(self) -> tuple[tuple[int, int], ...]:
        return tuple((n.key, n.num_tokens) for n in self.nodes)

    def private_kv_tokens(self) -> int:
        """KV tokens of this request not shared with any other prompt (unique prompt tail plus outputs)."""
        return self.prompt_len - sum(n.num_tokens for n in self.nodes) + self.num_out


def output_tokens(src: TokenSource, req: ReqState) -> np.ndarray:
    return src.segment(Segment(req.spec.output_key or f"out:{req.rid}", req.spec.output_len))


def build_states(requests: Sequence[SimRequest], src: TokenSource, block_size: int) -> list[ReqState]:
    """Materialise prompts, hash their blocks and find the prefix nodes they share (once per trace)."""
    validate(requests)
    tokens = [src.prompt(r) for r in requests]
    hashes = [chunk_hashes(t, block_size) for t in tokens]
    decs = decompose(hashes, [len(t) for t in tokens], block_size)
    out = []
    for r, t, h, d in zip(requests, tokens, hashes, decs, strict=True):
        group = (
            r.group if r.group is not None else (f"node:{d.nodes[0].key:x}" if d.nodes else f"solo:{r.rid}")
        )
        out.append(ReqState(r, t, h, block_ends(len(t), block_size), d.nodes, group))
    return out
