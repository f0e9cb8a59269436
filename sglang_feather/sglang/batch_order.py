"""`--feather-batch-order prefix`: keep SGLang's running batch in CHT prefix order after each merge."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

# How it works.
#
# SGLang appends every finished prefill batch to the running batch (`ScheduleBatch.merge_batch`, called at the
# top of `Scheduler.get_next_batch_to_run`) and `filter_batch` keeps the remaining order, so under continuous
# arrivals the decode batch is in admission order and prefix groups interleave. With `prefix`, an AFTER hook on
# `merge_batch` permutes the scheduler's running batch, right after the merge, into the order of the Chunked
# Hash Tree (`ChunkedHashTree.prefix_order`: requests sharing a prefix contiguous at every depth, paths in DFS
# order); requests the tree does not track keep their relative order at the end. Once per merge, never per
# decode step. The permutation goes through SGLang's own `filter_batch(keep_indices=...)`, so every per-request
# field it keeps (request pool rows, sequence lengths, input ids, logprob lists, multimodal inputs, the
# sampling info with its penalizers, logit bias and custom processors, speculative inputs) moves together.
# `filter_batch` returns early when `keep_indices` names as many rows as the batch has, so a pure permutation
# would change nothing: the first call gathers the permutation behind a duplicated leading row (length n + 1),
# the second drops that row. Why the merge is the safe point: it is where SGLang itself rebinds every tensor
# of the running batch, before `update_running_batch` prepares the next decode. Whatever still refers to
# earlier positions holds its own copy: the overlap scheduler queues `batch.copy()` (its own `reqs` list and
# the old tensors) with each result, the forward in flight reads the tensors captured at launch (and
# `record_batch_in_overlap` keeps them alive), the delayed sampling of the previous batch ran before this
# step began, and the decode input ids come from the future map by request-pool row, not by position. A
# merge into any other batch (mixed chunked prefill merges the running batch into a prefill batch whose
# `out_cache_loc` is already laid out) is never touched: only a batch that *is* the scheduler's
# `running_batch` is permuted.

ADMISSION = "admission"
PREFIX = "prefix"


def _admission_order(_admission: Any, _request_ids: Sequence[Any]) -> list[Any] | None:
    return None


def _prefix_order(admission: Any, request_ids: Sequence[Any]) -> list[Any]:
    return admission.prefix_order(request_ids)


BATCH_ORDERS: dict[str, Callable[[Any, Sequence[Any]], list[Any] | None]] = {
    ADMISSION: _admission_order,
    PREFIX: _prefix_order,
}
"""`--feather-batch-order` choices: the tracked requests' ids in the order wanted, or None to leave it."""


def keep_indices(order: Sequence[Any] | None, request_ids: Sequence[Any]) -> list[int] | None:
    """Row indices that put `request_ids` in `order` (ids not in it follow, in their order); None if unchanged.

    Raises ValueError when the batch repeats a request id or `order` names an id twice or one not in the batch.
    """
    if order is None:
        return None
    position = {rid: index for index, rid in enumerate(request_ids)}
    if len(position) != len(request_ids):
        raise ValueError("the running batch holds a request id twice")
    keep = [position[rid] for rid in order]
    ordered = set(order)
    if len(ordered) != len(keep):
        raise ValueError("the prefix order names a request twice")
    keep.extend(index for index, rid in enumerate(request_ids) if rid not in ordered)
    if keep == list(range(len(request_ids))):
        return None
    return keep


def permute(batch: Any, keep: Sequence[int]) -> None:
    """Reorder every per-request field of an SGLang `ScheduleBatch` to rows `keep` (a permutation)."""
    num_reqs = len(batch.reqs)
    if sorted(keep) != list(range(num_reqs)):
        raise ValueError(f"keep_indices must be a permutation of range({num_reqs}), got {list(keep)}")
    # The leading duplicate, not a trailing one: SGLang maps a custom logit processor's rows to the last
    # position of each kept index, which must be the row that stays.
    batch.filter_batch(keep_indices=[keep[0], *keep])
    batch.filter_batch(keep_indices=list(range(1, num_reqs + 1)))


class _Ordered:
    """The schedulers of this process that asked for a batch order other than admission order."""

    def __init__(self) -> None:
        self._schedulers: list[tuple[weakref.ref, str]] = []

    def add(self, scheduler: Any, order: str) -> None:
        self._schedulers = [
            (ref, name) for ref, name in self._schedulers if ref() is not None and ref() is not scheduler
        ]
        if order != ADMISSION:
            self._schedulers.append((weakref.ref(scheduler), order))

    def owner(self, batch: Any) -> tuple[Any, str] | None:
        for ref, name in self._schedulers:
            scheduler = ref()
            if scheduler is not None and scheduler.running_batch is batch:
                return scheduler, name
        return None


_ORDERED = _Ordered()


def attach(scheduler: Any, order: str) -> None:
    """After `Scheduler.init_schedule_policy`: order this scheduler's running batch by `order` from now on."""
    if order not in BATCH_ORDERS:
        raise ValueError(f"unknown batch order {order!r}; choose one of {sorted(BATCH_ORDERS)}")
    if getattr(getattr(scheduler, "policy", None), "feather", None) is None:
        order = ADMISSION
    _ORDERED.add(scheduler, order)
    if order != ADMISSION:
        logger.info("Feather batch order: %s (the running batch is permuted after each merge)", order)


def after_merge(batch: Any, _other: Any) -> None:
    """After `ScheduleBatch.merge_batch`: put the batch in order if it is a Feather scheduler's running batch."""
    found = _ORDERED.owner(batch)
    if found is None:
        return
    scheduler, order = found
    runtime = scheduler.policy.feather
    t0 = time.perf_counter()
    rids = [req.rid for req in batch.reqs]
    keep = keep_indices(BATCH_ORDERS[order](runtime.admission, rids), rids)
    if keep is not None:
        permute(batch, keep)
    seconds = time.perf_counter() - t0
    if runtime.metrics is not None:
        runtime.metrics.batch_ordered(seconds, moved=keep is not None)
