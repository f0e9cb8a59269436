"""The calls SGLang makes into Feather (wired by the plugin or by the source patch)."""

from __future__ import annotations

import logging
from typing import Any

from sglang_feather.sglang import batch_order
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import options_of, state_tag
from sglang_feather.sglang.ranks import dp_rank, rank_options, rank_tag, server_dp_size
from sglang_feather.sglang.runtime import runtime_for_cache

logger = logging.getLogger(__name__)


def _runtime(scheduler: Any):
    return getattr(getattr(scheduler, "policy", None), "feather", None)


def prefill_budget_tokens(scheduler: Any) -> int | None:
    """The prompt tokens one prefill batch may compute: `max_prefill_tokens`, or `chunked_prefill_size` where
    chunked prefill is on and that is smaller; None where the scheduler says neither."""
    limits = [getattr(scheduler, name, None) for name in ("max_prefill_tokens", "chunked_prefill_size")]
    positive = [limit for limit in limits if isinstance(limit, int) and limit > 0]
    return min(positive) if positive else None


def on_policy_created(scheduler: Any) -> None:
    """After `Scheduler.init_schedule_policy`: give the policy the server's options and Feather's metrics."""
    if _runtime(scheduler) is None:
        return
    dp_size = server_dp_size(scheduler.server_args)
    rank = dp_rank() if dp_size > 1 else None
    options = rank_options(options_of(scheduler.server_args), dp_size, rank)
    context = getattr(scheduler, "metrics_collector_context", None)
    metrics = None
    if context is not None and context.collector is not None and context.current_scheduler_metrics_enabled:
        metrics = FeatherMetrics(context.collector.labels)
    tag = rank_tag(state_tag(scheduler.server_args, getattr(scheduler, "gpu_id", 0)), dp_size, rank)
    publisher = getattr(scheduler, "kv_events_publisher", None)
    publish = bool(getattr(publisher, "enable_kv_cache_events", False))
    scheduler.policy.configure(
        options,
        metrics,
        state_tag=tag,
        publish_events=publish,
        prefill_budget_tokens=prefill_budget_tokens(scheduler),
    )
    config = scheduler.policy.feather.config
    logger.info(
        "Feather scheduling%s: %s (page size %d, deferral %s, cache tier %s, metrics %s)",
        "" if dp_size <= 1 else f" on DP rank {rank}",
        options,
        config.page_size,
        "on" if config.defer_uncached_prefix else "off",
        "from the tree cache's KV events" if config.cache_events else "off (the cache records no KV events)",
        "on" if metrics is not None else "off",
    )


def on_init_schedule_policy(scheduler: Any) -> None:
    """After `Scheduler.init_schedule_policy`: the options and metrics, then the running batch's order."""
    on_policy_created(scheduler)
    batch_order.attach(scheduler, options_of(scheduler.server_args).batch_order)


def prefill_adder_class(scheduler: Any, base: type) -> type:
    """What `Scheduler.get_prefill_adder_class` returns: `base`, or Feather's subclass of it."""
    policy = getattr(scheduler, "policy", None)
    if policy is None or getattr(policy, "feather", None) is None:
        return base
    return policy.prefill_adder_class(base)


def on_step_end(scheduler: Any, plan: Any) -> None:
    """After `Scheduler.get_next_batch_to_run`: reward bookkeeping, metrics, the periodic self-check."""
    runtime = _runtime(scheduler)
    if runtime is not None:
        runtime.end_step(scheduler, plan)


def on_queued(scheduler: Any, req: Any) -> None:
    """After `Scheduler._add_request_to_queue`: `req` waits (new or retracted), if it reached the queue."""
    runtime = _runtime(scheduler)
    queue = scheduler.waiting_queue
    if runtime is not None and queue and queue[-1] is req:
        runtime.on_queued(req)


def on_aborted(scheduler: Any, req: Any) -> None:
    """After `Scheduler._release_aborted_request` and `Scheduler.send_abort_output`: `req` is gone for good.

    `send_abort_output` is the one call every abort outside the output stream makes, among them
    `retract_decode`'s (a request out of KV even alone, or a beam group): its KV was released while it was
    not yet finished, so `release_kv_cache` did not report it. Reporting a request twice changes nothing."""
    runtime = _runtime(scheduler)
    if runtime is not None:
        runtime.on_left(req)


def on_kv_released(req: Any, tree_cache: Any) -> None:
    """After SGLang's `release_kv_cache`: a finished request left the running batch."""
    if req.finished():
        runtime = runtime_for_cache(tree_cache)
        if runtime is not None:
            runtime.on_left(req)
