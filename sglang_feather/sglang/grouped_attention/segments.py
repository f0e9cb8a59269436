"""Prefix segments of a decode batch: which requests read the same KV slots, found once per forward.

How it works: SGLang's radix cache hands every request that matches a cached prefix the same physical KV
slots, so the `req_to_token` rows of a decode batch form a trie: requests whose rows agree on their first L
entries share L tokens of KV. The trie is built top-down. A set of requests starting at position `start`
is split by the slot each holds there; a subset of two or more extends its shared span as far as all its
rows agree, compared only up to its shortest member's `seq_len` (entries past it can be stale after a
retraction) and rounded down to a page boundary (the radix cache shares whole pages). That span becomes a
*shared segment*, read once for all of its members' queries, and the subset recurses from its end, so a
system prompt and a document under it are two nested segments. What is left of a request below its deepest
segment is its private *tail*. Every request's KV `[0, seq_len)` is thus cut into spans; attention over each
span gives a partial result and its log-sum-exp, and the partials merge exactly (`kernel.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Span:
    """KV positions `[start, end)` of batch row `row`, read once for the queries of `members`."""

    row: int
    start: int
    end: int
    members: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def is_shared(self) -> bool:
        return len(self.members) > 1


@dataclass(frozen=True, slots=True)
class BatchSegments:
    """A decode batch cut into spans: shared segments (every nesting level) and private tails."""

    spans: tuple[Span, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    @property
    def num_shared_segments(self) -> int:
        """Distinct shared prefix segments a step reads once each (a nested prefix counts per level)."""
        return sum(1 for span in self.spans if span.is_shared)

    @property
    def num_shared_reads_per_request(self) -> int:
        """Shared segments read by a kernel that attends request by request: each member reads each one."""
        return sum(len(span.members) for span in self.spans if span.is_shared)

    @property
    def num_tokens_read(self) -> int:
        """KV tokens read with every span read once."""
        return sum(span.num_tokens for span in self.spans)

    @property
    def num_tokens_logical(self) -> int:
        """KV tokens read request by request (the sum of sequence lengths)."""
        return sum(self.seq_lens)


def find_segments(rows: torch.Tensor, seq_lens: list[int], page_size: int = 1) -> BatchSegments:
    """Cut a decode batch into shared segments and tails.

    `rows[i, :seq_lens[i]]` are request i's KV slot indices (`req_to_token[req_pool_indices]`); entries past
    `seq_lens[i]` are never read."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if rows.dim() != 2 or rows.shape[0] != len(seq_lens):
        raise ValueError(
            f"rows must be [num_requests, length] for {len(seq_lens)} requests, got {tuple(rows.shape)}"
        )
    if any(n < 1 or n > rows.shape[1] for n in seq_lens):
        raise ValueError(f"every seq_len must be in [1, {rows.shape[1]}], got {seq_lens}")
    spans: list[Span] = []
    first_slots = rows[:, 0].tolist()
    stack = [(members, 0) for members in _split_by(first_slots, range(len(seq_lens)))]
    while stack:
        members, start = stack.pop()
        if len(members) == 1:
            (only,) = members
            if seq_lens[only] > start:
                spans.append(Span(only, start, seq_lens[only], members))
            continue
        end = _shared_end(rows, members, start, min(seq_lens[m] for m in members), page_size)
        if end == start:
            # Not even one whole page in common: each member reads the rest on its own.
            spans.extend(Span(m, start, seq_lens[m], (m,)) for m in members if seq_lens[m] > start)
            continue
        spans.append(Span(members[0], start, end, members))
        going_on = [m for m in members if seq_lens[m] > end]
        if going_on:
            slots = rows[going_on, end].tolist()
            stack.extend((group, end) for group in _split_by(slots, going_on))
    return BatchSegments(tuple(spans), tuple(seq_lens))


def _split_by(keys: list[int], members) -> list[tuple[int, ...]]:
    """Members grouped by key, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for key, member in zip(keys, members, strict=True):
        groups.setdefault(key, []).append(member)
    return [tuple(group) for group in groups.values()]


def _shared_end(rows: torch.Tensor, members: tuple[int, ...], start: int, limit: int, page_size: int) -> int:
    """The page-aligned end of the span from `start` on which every member's row equals the first's."""
    if limit <= start:
        return start
    block = rows[list(members), start:limit]
    differs = (block != block[0]).any(dim=0).nonzero()
    end = limit if differs.numel() == 0 else start + int(differs[0, 0])
    return max(start, end // page_size * page_size)


def private_segments(seq_lens: list[int]) -> BatchSegments:
    """Every request its own span, nothing shared: the grouped kernel with grouping off (tails batched)."""
    return BatchSegments(tuple(Span(i, 0, n, (i,)) for i, n in enumerate(seq_lens)), tuple(seq_lens))
