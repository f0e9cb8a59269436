"""Block hashes of token sequences and the static decomposition of each prompt into shared prefix nodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# How it works.
#
# A sequence is cut into blocks of `block_size` tokens (the last may be partial) and block i is named by the
# CHT's chunk hash (`cht.chunk_hashes`: xxh64 over every token up to the block's end), so a hash names a
# whole prefix. Counting, over the whole trace, how many prompts hold each block hash, a prompt splits into
# maximal runs of blocks with the same holder count; along any prefix the count never rises and strictly drops where two prompts diverge, so two
# prompts share exactly the runs (nodes) up to their divergence. Runs held by one prompt are private. The
# cost model uses these nodes to see which KV the requests of a decode batch share.

DEFAULT_BLOCK_SIZE = 16


def block_ends(num_tokens: int, block_size: int) -> list[int]:
    """Token offset just past each block of a `num_tokens`-long sequence."""
    return [min(e, num_tokens) for e in range(block_size, num_tokens + block_size, block_size)]


@dataclass(frozen=True)
class SharedNode:
    """A run of prompt blocks held by the same set of prompts; `key` is the hash of the run's last block."""

    key: int
    num_tokens: int


@dataclass(frozen=True)
class Decomposition:
    nodes: tuple[SharedNode, ...]
    num_private: int
    """Prompt tokens held by this prompt alone."""


def decompose(
    hash_lists: Sequence[Sequence[int]], lengths: Sequence[int], block_size: int
) -> list[Decomposition]:
    counts = Counter(h for hs in hash_lists for h in set(hs))
    out = []
    for hs, n in zip(hash_lists, lengths, strict=True):
        ends = block_ends(n, block_size)
        nodes: list[SharedNode] = []
        private = 0
        run_start = 0
        for i, h in enumerate(hs):
            last = i + 1 == len(hs) or counts[hs[i + 1]] != counts[h]
            if not last:
                continue
            tokens = ends[i] - (ends[run_start - 1] if run_start else 0)
            if counts[h] >= 2:
                nodes.append(SharedNode(h, tokens))
            else:
                private += tokens
            run_start = i + 1
        out.append(Decomposition(tuple(nodes), private))
    return out
