"""SGLang plugin entry point (`sglang.srt.plugins`): adds `--schedule-policy feather` without editing SGLang."""

from __future__ import annotations

import inspect
import logging
import pkgutil
from collections.abc import Callable
from typing import Any

from sglang_feather.sglang.version import SUPPORTED_SGLANG, unsupported_version

logger = logging.getLogger(__name__)

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
BUILD_KV_CACHE = "sglang.srt.mem_cache.kv_cache_builder.build_kv_cache"


_registered = False
_startup_error: str | None = None


class FeatherStartupError(RuntimeError):
    """`--schedule-policy feather` was chosen on an SGLang whose version or hook targets Feather does not
    support (raised when the server arguments are parsed, with the reason `check_sglang` gave)."""


def policy_choices() -> list[str]:
    """The `--schedule-policy` choices: one shared list inside the field's `Arg` metadata."""
    from typing import get_type_hints

    from sglang.srt.server_args import ServerArgs

    return get_type_hints(ServerArgs, include_extras=True)["schedule_policy"].__metadata__[0].choices


def register() -> None:
    """Called by SGLang's `load_plugins()` in the launcher and again in every scheduler process.

    Adds `--attention-backend feather_grouped` on both paths; adds nothing more on an SGLang that carries the
    source patch set (it already lists `feather`). On another SGLang release, or one whose hook targets
    moved, only the flag is added: choosing it fails at startup with a message naming the supported release
    (SGLang's `load_plugins` would only log an exception)."""
    global _registered, _startup_error
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_feather.sglang.grouped_attention import registration
    from sglang_feather.sglang.options import FEATHER

    # The attention backend registers on both paths: the patch set adds the schedule policy only.
    registration.register()
    choices = policy_choices()
    if _registered or FEATHER in choices:
        if not _registered:
            logger.info(
                "SGLang already lists --schedule-policy %s (source patch set): plugin inactive", FEATHER
            )
        return
    _registered = True
    choices.append(FEATHER)
    _startup_error = check_sglang()
    if _startup_error is not None:
        logger.error("sglang-feather disabled: %s", _startup_error)
        HookRegistry.register(f"{SERVER_ARGS}.from_cli_args", _refuse_feather, HookType.AFTER)
        return
    from sglang_feather.sglang.policy import FeatherSchedulePolicy

    HookRegistry.register(POLICY, FeatherSchedulePolicy, HookType.REPLACE)
    HookRegistry.register(BUILD_KV_CACHE, _before_build_kv_cache, HookType.BEFORE)
    for target, (hook, _params) in HOOKS.items():
        HookRegistry.register(target, hook, HookType.AFTER)


def check_sglang() -> str | None:
    """Why this SGLang cannot run Feather (version, a hook target missing or with another signature); None if
    it can."""
    problem = unsupported_version()
    if problem is not None:
        return problem
    version = SUPPORTED_SGLANG
    expected = {POLICY: (None, ("policy", "tree_cache")), BUILD_KV_CACHE: (None, ()), **HOOKS}
    for target, (_hook, params) in expected.items():
        try:
            signature = inspect.signature(pkgutil.resolve_name(target))
        except (ImportError, AttributeError, ValueError) as err:
            return (
                f"SGLang {version} has no {target} ({err}); sglang-feather expects SGLang {SUPPORTED_SGLANG}"
            )
        names = tuple(signature.parameters)[: len(params)]
        if names != params:
            return f"{target}{signature} does not take {params}; sglang-feather expects SGLang {SUPPORTED_SGLANG}"
    return None


def _refuse_feather(server_args: Any, _cls: type, args: Any) -> None:
    from sglang_feather.sglang.options import FEATHER

    if getattr(args, "schedule_policy", None) == FEATHER:
        raise FeatherStartupError(_startup_error)


def _before_build_kv_cache(*args: Any, **kwargs: Any) -> tuple[tuple, dict] | None:
    """`--schedule-policy feather` builds its tree cache with KV-event recording on: the events feed Feather's
    cache tier (SGLang's own publisher still gets them when `--kv-events-config` is set)."""
    from sglang_feather.sglang.options import FEATHER

    server_args = kwargs.get("server_args")
    if getattr(server_args, "schedule_policy", None) != FEATHER or kwargs.get("enable_kv_cache_events"):
        return None
    return args, {**kwargs, "enable_kv_cache_events": True}


def _after_add_cli_args(_result: None, parser: Any) -> None:
    from sglang_feather.sglang.options import add_cli_args

    add_cli_args(parser)


def _after_from_cli_args(server_args: Any, _cls: type, args: Any) -> None:
    from sglang_feather.sglang.options import attach, options_from_namespace

    attach(server_args, options_from_namespace(args))


def _after_init_schedule_policy(_result: None, scheduler: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_init_schedule_policy

    on_init_schedule_policy(scheduler)


def _after_get_prefill_adder_class(base: type, scheduler: Any) -> type:
    from sglang_feather.sglang.scheduler_hooks import prefill_adder_class

    return prefill_adder_class(scheduler, base)


def _after_get_next_batch_to_run(plan: Any, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_step_end

    on_step_end(scheduler, plan)


def _after_add_request_to_queue(_result: None, scheduler: Any, req: Any, *_args: Any, **_kwargs: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_queued

    on_queued(scheduler, req)


def _after_release_aborted_request(_result: None, scheduler: Any, req: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_aborted

    on_aborted(scheduler, req)


def _after_send_abort_output(_result: None, scheduler: Any, _abort_req: Any, req: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_aborted

    on_aborted(scheduler, req)


def _after_release_kv_cache(_result: None, req: Any, tree_cache: Any, *_args: Any, **_kwargs: Any) -> None:
    from sglang_feather.sglang.scheduler_hooks import on_kv_released

    on_kv_released(req, tree_cache)


def _after_merge_batch(_result: None, batch: Any, other: Any) -> None:
    from sglang_feather.sglang.batch_order import after_merge

    after_merge(batch, other)


HOOKS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    f"{SERVER_ARGS}.add_cli_args": (_after_add_cli_args, ("parser",)),
    f"{SERVER_ARGS}.from_cli_args": (_after_from_cli_args, ("args",)),
    f"{SCHEDULER}.init_schedule_policy": (_after_init_schedule_policy, ("self",)),
    f"{SCHEDULER}.get_prefill_adder_class": (_after_get_prefill_adder_class, ("self",)),
    f"{SCHEDULER}.get_next_batch_to_run": (
        _after_get_next_batch_to_run,
        ("self", "running_batch", "last_batch"),
    ),
    f"{SCHEDULER}._add_request_to_queue": (_after_add_request_to_queue, ("self", "req", "is_retracted")),
    f"{SCHEDULER}._release_aborted_request": (_after_release_aborted_request, ("self", "req")),
    f"{SCHEDULER}.send_abort_output": (_after_send_abort_output, ("self", "abort_req", "req")),
    "sglang.srt.mem_cache.common.release_kv_cache": (_after_release_kv_cache, ("req", "tree_cache")),
    f"{SCHEDULE_BATCH}.merge_batch": (_after_merge_batch, ("self", "other")),
}
"""Hook target -> (AFTER hook, the leading parameter names the hook relies on)."""
