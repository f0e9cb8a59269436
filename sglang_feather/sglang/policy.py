"""`FeatherSchedulePolicy` and `FeatherPrefillAdder`: SGLang's policy and adder, Feather-driven for `feather`."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sglang.srt.managers import schedule_policy as _sglang_policy

from sglang_feather.admission import KvHeadroom
from sglang_feather.sglang.load import mark_matched
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import FEATHER, FeatherOptions
from sglang_feather.sglang.runtime import FeatherRuntime, make_runtime

AddReqResult = _sglang_policy.AddReqResult

if TYPE_CHECKING:  # the mixin is only ever combined with SGLang's PrefillAdder (or a subclass), and reads it
    _AdderHost = _sglang_policy.PrefillAdder
else:
    _AdderHost = object


class FeatherSchedulePolicy(_sglang_policy.SchedulePolicy):
    """SGLang's `SchedulePolicy`; with `policy="feather"` the queue order comes from the Chunked Hash Tree.

    Every other policy name goes to SGLang's constructor and `calc_priority` untouched. For `feather` the
    base class runs as `fcfs` (so its helpers see a known policy) and `self.feather` holds the runtime.
    The base is SGLang's class as it was when this module was first imported, before the plugin replaced
    the module attribute: `FeatherSchedulePolicy.__bases__[0]` is SGLang's own.
    """

    def __init__(self, policy: str, tree_cache: Any, *args: Any, **kwargs: Any) -> None:
        self.feather: FeatherRuntime | None = None
        self._adder_classes: dict[type, type] = {}
        if policy != FEATHER:
            super().__init__(policy, tree_cache, *args, **kwargs)
            return
        super().__init__(_sglang_policy.CacheAgnosticPolicy.FCFS.value, tree_cache, *args, **kwargs)
        self.feather = make_runtime(FeatherOptions(), tree_cache=tree_cache)

    def configure(
        self,
        options: FeatherOptions,
        metrics: FeatherMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        state_tag: Mapping[str, str] | None = None,
        publish_events: bool = False,
        prefill_budget_tokens: int | None = None,
    ) -> None:
        """Replace the default runtime with one built from the server's options (scheduler startup);
        `publish_events`: SGLang's own KV-event publisher also drains the tree cache's events;
        `prefill_budget_tokens`: what one prefill batch may compute (`FeatherRuntime`)."""
        if self.feather is None:
            raise ValueError(f"configure() needs schedule policy {FEATHER!r}")
        self.feather.close()
        self.feather = make_runtime(
            options,
            metrics,
            clock,
            tree_cache=self.tree_cache,
            state_tag=state_tag,
            publish_events=publish_events,
            prefill_budget_tokens=prefill_budget_tokens,
        )
        self._adder_classes.clear()

    def calc_priority(
        self, waiting_queue: list, running_batch: Any = None, processed_tokens: int = 0
    ) -> None:
        if self.feather is None:
            return super().calc_priority(waiting_queue, running_batch, processed_tokens)
        self.feather.begin_pass(waiting_queue, running_batch.reqs if running_batch is not None else ())
        return None

    def waiting_queue_prefix_matched(self, waiting_queue: list) -> bool:
        """SGLang's load report asks whether `num_matched_prefix_tokens` is fresh; for `feather` the CHT
        fills it first (`load.mark_matched`)."""
        if self.feather is None:
            return super().waiting_queue_prefix_matched(waiting_queue)
        return mark_matched(self.feather, waiting_queue)

    def prefill_adder_class(self, base: type) -> type:
        """`base` (SGLang's PrefillAdder or a subclass) with Feather's stopper in `add_one_req`; a base that
        already has it (the hook applied twice) is returned as it is, bound to this policy's runtime."""
        if self.feather is None:
            return base
        if issubclass(base, FeatherAdderMixin):
            base = next(b for b in base.__mro__ if not issubclass(b, FeatherAdderMixin))
        cls = self._adder_classes.get(base)
        if cls is None:
            cls = type("FeatherPrefillAdder", (FeatherAdderMixin, base), {"feather": self.feather})
            self._adder_classes[base] = cls
        return cls


class FeatherAdderMixin(_AdderHost):
    """Consults Feather before SGLang's own `add_one_req`; SGLang's token and KV budgets still apply."""

    feather: FeatherRuntime

    def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: int | None):
        feather = self.feather
        can_run = self.can_run_list
        plans = feather.plans
        planned = plans.planned
        if planned:  # the plan's admissions so far are a prefix of it: is `req` the next one?
            if plans.planned_can_run is None:
                k = 0
                is_planned = planned[0] is req
                if is_planned:  # the plan's first request: the loop's admissions from here on are the plan's
                    feather.plan_reached(can_run)
            else:
                k = len(can_run) - plans.planned_mark  # `num_planned_admitted`, read here without a call
                is_planned = k < len(planned) and planned[k] is req
            if is_planned:
                reads = plans.room_reads
                if reads is not None and reads[k]:  # where the concentration rule reads the room
                    feather.planned_room(kv_free_tokens, self, k)
                result = super().add_one_req(req, has_chunked_req, truncation_align_size)
                if not (can_run and can_run[-1] is req):
                    if reads is not None:  # the room after the plan's last admission (a refusal takes none)
                        feather.planned_room(kv_free_tokens, self, k)
                    feather.planned_refused()
                elif req is planned[-1]:
                    feather.planned_all_added()
                return result
        running = self.running_batch.reqs if self.running_batch is not None else ()
        return feather.admit(
            req,
            batch_size=len(running) + len(self.can_run_list),
            sglang_add=lambda: super(FeatherAdderMixin, self).add_one_req(
                req, has_chunked_req, truncation_align_size
            ),
            added=lambda: bool(self.can_run_list) and self.can_run_list[-1] is req,
            headroom=lambda: kv_headroom(self),
        )


def kv_free_tokens(adder: Any) -> int | None:
    """`kv_headroom(adder).num_free_tokens`, without building the headroom (None where it is None)."""
    room = _kv_room(adder)
    return None if room is None else room[0]


def kv_headroom(adder: Any) -> KvHeadroom | None:
    """SGLang's PrefillAdder's KV room: `rem_total_tokens` (free plus evictable, less what running and admitted
    requests are promised) over the token pool's size; None where this SGLang build does not say."""
    room = _kv_room(adder)
    return None if room is None else KvHeadroom(*room)


def _kv_room(adder: Any) -> tuple[int, int] | None:
    """(`rem_total_tokens`, at least 0; the token pool's size), or None where the pool has no size or this SGLang
    build does not say."""
    try:
        total = int(adder.token_to_kv_pool_allocator.size)
        return (max(0, int(adder.rem_total_tokens)), total) if total > 0 else None
    except (AttributeError, TypeError, ValueError):
        return None
