"""SGLang plugin entry point (`sglang.srt.plugins`): adds `--schedule-policy feather` without editing SGLang."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"


_registered = False


def policy_choices() -> list[str]:
    """The `--schedule-policy` choices: one shared list inside the field's `Arg` metadata."""
    from typing import get_type_hints

    from sglang.srt.server_args import ServerArgs

    return get_type_hints(ServerArgs, include_extras=True)["schedule_policy"].__metadata__[0].choices


def register() -> None:
    """Called by SGLang's `load_plugins()` in the launcher and again in every scheduler process.

    Does nothing on an SGLang that carries the source patch set (it already lists `feather`).
    """
    global _registered
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_feather.sglang.options import FEATHER

    choices = policy_choices()
    if _registered or FEATHER in choices:
        if not _registered:
            logger.info(
                "SGLang already lists --schedule-policy %s (source patch set): plugin inactive", FEATHER
            )
        return
    from sglang_feather.sglang.policy import FeatherSchedulePolicy

    _registered = True
    choices.append(FEATHER)
    HookRegistry.register(
        "sglang.srt.managers.schedule_policy.SchedulePolicy", FeatherSchedulePolicy, HookType.REPLACE
    )
    for target, hook in _HOOKS.items():
        HookRegistry.register(target, hook, HookType.AFTER)


def _after_add_cli_args(_result: None, parser: Any) -> None:
    from sglang_feather.sglang.options import add_cli_args

    add_cli_args(parser)


def _after_from_cli_args(server_args: Any, _cls: type, args: Any) -> None:
    from sglang_feather.sglang.options import attach, options_from_namespace

    attach(server_args, options_from_namespace(args))


def _after_init_schedule_policy(_result: None, scheduler: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_policy_created

    on_policy_created(scheduler)
    from sglang_feather.sglang.batch_order import attach
    from sglang_feather.sglang.options import options_of

    attach(scheduler, options_of(scheduler.server_args).batch_order)


def _after_get_prefill_adder_class(base: type, scheduler: Any) -> type:
    from sglang_feather.sglang.scheduler_hooks import prefill_adder_class

    return prefill_adder_class(scheduler, base)


def _after_get_next_batch_to_run(plan: Any, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_step_end

    on_step_end(scheduler, plan)


def _after_merge_batch(_result: None, batch: Any, other: Any) -> None:
    from sglang_feather.sglang.batch_order import after_merge

    after_merge(batch, other)


_HOOKS = {
    f"{SERVER_ARGS}.add_cli_args": _after_add_cli_args,
    f"{SERVER_ARGS}.from_cli_args": _after_from_cli_args,
    f"{SCHEDULER}.init_schedule_policy": _after_init_schedule_policy,
    f"{SCHEDULER}.get_prefill_adder_class": _after_get_prefill_adder_class,
    f"{SCHEDULER}.get_next_batch_to_run": _after_get_next_batch_to_run,
    f"{SCHEDULE_BATCH}.merge_batch": _after_merge_batch,
}
