"""Prefix segments of a decode batch: which requests read the same KV slots, found once per forward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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
class SegmentCounts:
    """What a decode step reads, counted once per step for the metrics and the run's totals."""

    num_shared_segments: int
    """Distinct shared prefix segments a step reads once each (a nested prefix counts per level)."""
    num_shared_reads_per_request: int
    """Shared segments read by a kernel that attends request by request: each member reads each one."""
    num_tokens_read: int
    """KV tokens read with every span read once."""
    num_tokens_logical: int
    """KV tokens read request by request (the sum of sequence lengths)."""


@dataclass(frozen=True, slots=True)
class BatchSegments:
    """A decode batch cut into spans: shared segments (every nesting level) and private tails."""

    spans: tuple[Span, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    def counts(self) -> SegmentCounts:
        """The step's `SegmentCounts`, in one pass over the spans."""
        num_shared = num_reads = num_read = 0
        for span in self.spans:
            num_read += span.end - span.start
            members = len(span.members)
            if members > 1:
                num_shared += 1
                num_reads += members
        return SegmentCounts(num_shared, num_reads, num_read, sum(self.seq_lens))

    @property
    def num_shared_segments(self) -> int:
        return self.counts().num_shared_segments

    @property
    def num_shared_reads_per_request(self) -> int:
        return self.counts().num_shared_reads_per_request

    @property
    def num_tokens_read(self) -> int:
        return self.counts().num_tokens_read

    @property
    def num_tokens_logical(self) -> int:
        return sum(self.seq_lens)


def find_segments(rows: torch.Tensor, seq_lens: list[int], page_size: int = 1) -> BatchSegments:
    """Cut a decode batch into shared segments and tails.

    `rows[i, :seq_lens[i]]` are request i's KV slot indices (`req_to_token[req_pool_indices]`); entries past
    `seq_lens[i]` are never read.

    How it works: SGLang's radix cache hands every request that matches a cached prefix the same physical KV
    slots, so the `req_to_token` rows of a decode batch form a trie: requests whose rows agree on their first
    L entries share L tokens of KV. The trie is built top-down. A set of requests starting at position `start`
    is split by the slot each holds there; a subset of two or more extends its shared span as far as all its
    rows agree, compared only up to its shortest member's `seq_len` (entries past it can be stale after a
    retraction) and rounded down to a page boundary (the radix cache shares whole pages). That span becomes a
    *shared segment*, read once for all of its members' queries, and the subset recurses from its end, so a
    system prompt and a document under it are two nested segments (a subset that shares less than a page
    splits where it parts, from the same start). What is left of a request below its deepest segment is its
    private *tail*. Every request's KV `[0, seq_len)` is thus cut into spans; attention over each span gives a
    partial result and its log-sum-exp, and the partials merge exactly (`kernel.py`)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if rows.dim() != 2 or rows.shape[0] != len(seq_lens):
        raise ValueError(
            f"rows must be [num_requests, length] for {len(seq_lens)} requests, got {tuple(rows.shape)}"
        )
    if any(n < 1 or n > rows.shape[1] for n in seq_lens):
        raise ValueError(f"every seq_len must be in [1, {rows.shape[1]}], got {seq_lens}")
    table = host_rows(rows)
    spans: list[Span] = []
    first_slots = table[:, 0].tolist()
    stack = [(members, 0) for members in _split_by(first_slots, range(len(seq_lens)))]
    while stack:
        members, start = stack.pop()
        if len(members) == 1:
            (only,) = members
            if seq_lens[only] > start:
                spans.append(Span(only, start, seq_lens[only], members))
            continue
        limit = min(seq_lens[m] for m in members)
        common = _common_end(table, members, start, limit)
        end = max(start, common // page_size * page_size)
        if end > start:
            spans.append(Span(members[0], start, end, members))
        # Below `end`, members part by the slot each holds where they part (`end` after a span; where the
        # whole set stops agreeing when it shares no whole page), and each part goes on from `end`.
        split_at = end if end > start else common
        for m in members:
            if seq_lens[m] <= split_at and seq_lens[m] > end:
                spans.append(Span(m, end, seq_lens[m], (m,)))
        going_on = [m for m in members if seq_lens[m] > split_at]
        if going_on:
            slots = table[going_on, split_at].tolist()
            for group in _split_by(slots, going_on):
                if len(group) == 1:  # parted from every other member: the rest is its tail
                    spans.append(Span(group[0], end, seq_lens[group[0]], group))
                else:
                    stack.append((group, end))
    return BatchSegments(tuple(spans), tuple(seq_lens))


def _split_by(keys: list[int], members) -> list[tuple[int, ...]]:
    """Members grouped by key, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for key, member in zip(keys, members, strict=True):
        groups.setdefault(key, []).append(member)
    return [tuple(group) for group in groups.values()]


def host_rows(rows: torch.Tensor) -> np.ndarray:
    """The rows as a host array (a view on the CPU): the search is host logic, and NumPy's small operations
    cost a fifth of torch's here."""
    return rows.cpu().numpy()


def _common_end(table: np.ndarray, members: tuple[int, ...], start: int, limit: int) -> int:
    """Where the members' rows stop agreeing, from `start` and at most `limit`."""
    if limit <= start:
        return start
    block = table[members[0] : members[-1] + 1] if _is_run(members) else table[list(members)]
    block = block[:, start:limit]
    differs = np.flatnonzero((block != block[0]).any(axis=0))
    return limit if differs.size == 0 else start + int(differs[0])


def _is_run(members: tuple[int, ...]) -> bool:
    return members[-1] - members[0] == len(members) - 1


def private_segments(seq_lens: list[int]) -> BatchSegments:
    """Every request its own span, nothing shared: the grouped kernel with grouping off (tails batched)."""
    return BatchSegments(tuple(Span(i, 0, n, (i,)) for i, n in enumerate(seq_lens)), tuple(seq_lens))


def shared_prefix_len(rows: torch.Tensor, seq_lens: list[int], i: int, j: int, page_size: int) -> int:
    """Reference: how many leading KV slots requests i and j share, page-aligned, within both lengths."""
    limit = min(seq_lens[i], seq_lens[j])
    differs = (rows[i, :limit] != rows[j, :limit]).nonzero()
    common = limit if differs.numel() == 0 else int(differs[0, 0])
    return common // page_size * page_size


def check_segments(segments: BatchSegments, rows: torch.Tensor, page_size: int) -> None:
    """Invariant checker against the pairwise reference: each request's spans tile `[0, seq_len)` in order,
    read its own slots, and at every position are shared with exactly the requests whose rows agree with it up
    to there (page-aligned): each shared token is read once, and nothing is shared that is not. O(B^2 L)."""
    seq_lens = list(segments.seq_lens)
    num_requests = len(seq_lens)
    covered = [0] * num_requests
    spans_of: list[list[Span]] = [[] for _ in range(num_requests)]
    for span in segments.spans:
        if not 0 <= span.start < span.end or span.row not in span.members:
            raise AssertionError(f"malformed span {span}")
        for member in span.members:
            spans_of[member].append(span)
    for i in range(num_requests):
        shared = [shared_prefix_len(rows, seq_lens, i, j, page_size) for j in range(num_requests)]
        for span in sorted(spans_of[i], key=lambda s: s.start):
            if span.start != covered[i]:
                raise AssertionError(
                    f"request {i}: span {span} starts at {span.start}, covered up to {covered[i]}"
                )
            covered[i] = span.end
            expected = {j for j in range(num_requests) if j == i or shared[j] >= span.end}
            if set(span.members) != expected:
                raise AssertionError(
                    f"request {i}: span {span} has members {span.members}, expected {expected}"
                )
            if span.is_shared and span.start % page_size:
                raise AssertionError(f"shared span {span} does not start on a page boundary")
        if covered[i] != seq_lens[i]:
            raise AssertionError(f"request {i}: spans cover [0, {covered[i]}) of [0, {seq_lens[i]})")
        # A sharer at `start` must share the whole span, and nobody shares past a span's end at a page
        # boundary it could have reached: the spans are maximal.
        for span in spans_of[i]:
            beyond = {j for j in range(num_requests) if j != i and shared[j] > span.start} - set(span.members)
            if beyond:
                raise AssertionError(f"request {i}: {sorted(beyond)} share {span} only in part")
