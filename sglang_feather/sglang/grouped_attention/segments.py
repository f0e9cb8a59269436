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
    """A decode batch cut into spans: its shared segments (every nesting level) and, per request, the private
    tail below its deepest one, `[tail_starts[i], seq_lens[i])` (empty where a segment reaches `seq_lens[i]`)."""

    shared: tuple[Span, ...]
    tail_starts: np.ndarray  # [num_requests] int64
    seq_lens: np.ndarray  # [num_requests] int64

    @classmethod
    def from_spans(cls, spans: tuple[Span, ...] | list[Span], seq_lens: list[int]) -> BatchSegments:
        """From a list of spans (tests, checkers): shared ones kept, each request's private span its tail."""
        tail_starts = np.array(seq_lens, dtype=np.int64)
        for span in spans:
            if not span.is_shared:
                tail_starts[span.row] = span.start
        return cls(tuple(s for s in spans if s.is_shared), tail_starts, np.array(seq_lens, dtype=np.int64))

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    @property
    def spans(self) -> tuple[Span, ...]:
        """Every span: the shared segments, then each non-empty tail."""
        tails = tuple(
            Span(i, start, end, (i,))
            for i, (start, end) in enumerate(
                zip(self.tail_starts.tolist(), self.seq_lens.tolist(), strict=True)
            )
            if end > start
        )
        return self.shared + tails

    def counts(self) -> SegmentCounts:
        """The step's `SegmentCounts`, from the shared segments and the tails' lengths."""
        num_reads = num_read = 0
        for span in self.shared:
            num_read += span.end - span.start
            num_reads += len(span.members)
        num_read += int((self.seq_lens - self.tail_starts).sum())
        return SegmentCounts(len(self.shared), num_reads, num_read, int(self.seq_lens.sum()))

    @property
    def num_shared_segments(self) -> int:
        return len(self.shared)

    @property
    def num_shared_reads_per_request(self) -> int:
        return self.counts().num_shared_reads_per_request

    @property
    def num_tokens_read(self) -> int:
        return self.counts().num_tokens_read

    @property
    def num_tokens_logical(self) -> int:
        return int(self.seq_lens.sum())


def find_segments(rows: torch.Tensor, seq_lens: list[int], page_size: int = 1) -> BatchSegments:
    """Cut a decode batch into shared segments and tails.

    `rows[i, :seq_lens[i]]` are request i's KV slot indices (`req_to_token[req_pool_indices]`); entries past
    `seq_lens[i]` are never read.

    How it works: SGLang's radix cache hands every request that matches a cached prefix the same physical KV
    slots, so the `req_to_token` rows of a decode batch form a trie: requests whose rows agree on their first
    L entries share L tokens of KV. The trie is built top-down. A set of requests starting at position `start`
    is split by the slot each holds there; a subset of two or more extends its shared span as far as all its
    rows agree (page by page: `_common_end`), compared only up to its shortest member's `seq_len` (entries
    past it can be stale after a retraction) and rounded down to a page boundary (the radix cache shares whole
    pages). That span becomes a *shared segment*, read once for all of its members' queries, and the subset
    recurses from its end, so a system prompt and a document under it are two nested segments (a subset that
    shares less than a page splits where it parts, from the same start). What is left of a request below its
    deepest segment is its private *tail*. Every request's KV `[0, seq_len)` is thus cut into spans; attention
    over each span gives a partial result and its log-sum-exp, and the partials merge exactly (`kernel.py`).
    The work is per subset, not per request: members are arrays, and a request's tail start is the end of the
    last segment it joined."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if rows.dim() != 2 or rows.shape[0] != len(seq_lens):
        raise ValueError(
            f"rows must be [num_requests, length] for {len(seq_lens)} requests, got {tuple(rows.shape)}"
        )
    if seq_lens and (min(seq_lens) < 1 or max(seq_lens) > rows.shape[1]):  # on the list: no array calls
        raise ValueError(f"every seq_len must be in [1, {rows.shape[1]}], got {seq_lens}")
    lens = np.array(seq_lens, dtype=np.int64)
    table = host_rows(rows)
    tail_starts = np.zeros(len(lens), dtype=np.int64)
    shared: list[Span] = []
    stack = [(members, 0) for members in _split_by(table[:, 0], np.arange(len(lens)))]
    while stack:
        members, start = stack.pop()
        limit = int(lens[members].min())
        common = _common_end(table, members, start, limit, page_size)
        end = max(start, common // page_size * page_size)
        if end > start:
            shared.append(Span(int(members[0]), start, end, tuple(members.tolist())))
            tail_starts[members] = end  # deeper segments move it on
        # Below `end`, members part by the slot each holds where they part (`end` after a span; where the
        # whole set stops agreeing when it shares no whole page), and each part of two or more goes on from
        # `end`; a member that parts alone, or ends before the split, keeps its tail from `end`.
        split_at = end if end > start else common
        going_on = members[lens[members] > split_at]
        if going_on.size > 1:
            stack.extend((part, end) for part in _split_by(table[going_on, split_at], going_on))
    return BatchSegments(tuple(shared), tail_starts, lens)


def _split_by(keys: np.ndarray, members: np.ndarray) -> list[np.ndarray]:
    """The parts of two or more members that share a key (members keep their order within a part). Parts of
    one, the common case below a shared span (every request's tail parts alone), are never materialised."""
    if members.size < 2:
        return []
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    bounds = np.flatnonzero(np.diff(sorted_keys, prepend=sorted_keys[0] - 1, append=sorted_keys[-1] - 1))
    starts, ends = bounds[:-1], bounds[1:]
    wide = np.flatnonzero(ends - starts > 1)
    return [members[order[starts[i] : ends[i]]] for i in wide.tolist()]


def host_rows(rows: torch.Tensor) -> np.ndarray:
    """The rows as a host array (a view on the CPU): the search is host logic, and NumPy's small operations
    cost a fifth of torch's here."""
    return rows.cpu().numpy()


def _common_end(table: np.ndarray, members: np.ndarray, start: int, limit: int, page_size: int) -> int:
    """Where the members' rows stop agreeing, from `start` (a page boundary) and at most `limit`. Only each
    page's first slot is compared: SGLang's paged allocator keeps a page's slots contiguous and in position
    order, so rows holding the same slot where a page begins hold that whole page."""
    if limit <= start:
        return start
    first, last = int(members[0]), int(members[-1])
    rows = slice(first, last + 1) if last - first == members.size - 1 else members  # a run: a view
    block = table[rows, start:limit:page_size]
    differs = np.flatnonzero((block != block[0]).any(axis=0))
    return limit if differs.size == 0 else start + int(differs[0]) * page_size


def private_segments(seq_lens: list[int]) -> BatchSegments:
    """Every request its own span, nothing shared: the grouped kernel with grouping off (tails batched)."""
    return BatchSegments((), np.zeros(len(seq_lens), dtype=np.int64), np.array(seq_lens, dtype=np.int64))


def shared_prefix_len(rows: torch.Tensor, seq_lens: list[int], i: int, j: int, page_size: int) -> int:
    """Reference: how many leading KV slots requests i and j share, page-aligned, within both lengths."""
    limit = min(seq_lens[i], seq_lens[j])
    differs = (rows[i, :limit] != rows[j, :limit]).nonzero()
    common = limit if differs.numel() == 0 else int(differs[0, 0])
    return common // page_size * page_size


def check_paged_layout(rows: torch.Tensor, seq_lens: list[int], page_size: int) -> None:
    """The layout `find_segments` compares page by page: each request's positions `[k * page_size, (k + 1) *
    page_size)` below its `seq_len` hold one page's slots, contiguous and in position order."""
    for i, seq_len in enumerate(seq_lens):
        positions = torch.arange(seq_len)
        offsets = positions % page_size
        page_starts = rows[i, :seq_len].long() - offsets  # the slot each position's page begins at
        # Aligned, and the same for every position of a page as for the page's first position.
        if bool((page_starts % page_size != 0).any()) or bool(
            (page_starts != page_starts[positions - offsets]).any()
        ):
            raise AssertionError(f"request {i}: its KV slots are not whole pages of {page_size} in order")


def check_segments(segments: BatchSegments, rows: torch.Tensor, page_size: int) -> None:
    """Invariant checker against the pairwise reference: each request's spans tile `[0, seq_len)` in order,
    read its own slots, and at every position are shared with exactly the requests whose rows agree with it up
    to there (page-aligned): each shared token is read once, and nothing is shared that is not. O(B^2 L)."""
    seq_lens = segments.seq_lens.tolist()
    num_requests = len(seq_lens)
    check_paged_layout(rows, seq_lens, page_size)
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
