"""The three calls SGLang's `Scheduler` makes into Feather (wired by the plugin or by the source patch)."""

from __future__ import annotations

import logging
from typing import Any

from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import options_of

logger = logging.getLogger(__name__)


def _runtime(scheduler: Any):
    return getattr(getattr(scheduler, "policy", None), "feather", None)


def on_policy_created(scheduler: Any) -> None:
    """After `Scheduler.init_schedule_policy`: give the policy the server's options and Feather's metrics."""
    if _runtime(scheduler) is None:
        return
    options = options_of(scheduler.server_args)
    context = getattr(scheduler, "metrics_collector_context", None)
    metrics = None
    if context is not None and context.collector is not None and context.current_scheduler_metrics_enabled:
        metrics = FeatherMetrics(context.collector.labels)
    scheduler.policy.configure(options, metrics)
    logger.info("Feather scheduling: %s (metrics %s)", options, "on" if metrics is not None else "off")


def prefill_adder_class(scheduler: Any, base: type) -> type:
    """What `Scheduler.get_prefill_adder_class` returns: `base`, or Feather's subclass of it."""
    policy = getattr(scheduler, "policy", None)
    if getattr(policy, "feather", None) is None:
        return base
    return policy.prefill_adder_class(base)


def on_step_end(scheduler: Any, plan: Any) -> None:
    """After `Scheduler.get_next_batch_to_run`: drop finished/aborted requests, count decode tokens."""
    runtime = _runtime(scheduler)
    if runtime is None:
        return
    running = plan.running_batch
    batch = plan.batch_to_run
    active = list(running.reqs) if running is not None else []
    decode_reqs: list[Any] = []
    if batch is not None:
        if batch is not running:
            active.extend(batch.reqs)
        if batch.forward_mode.is_decode():
            decode_reqs = list(batch.reqs)
        elif batch.decoding_reqs:
            decode_reqs = list(batch.decoding_reqs)
            active.extend(decode_reqs)
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        active.append(chunked)
    runtime.end_step(scheduler.waiting_queue, active, decode_reqs)
