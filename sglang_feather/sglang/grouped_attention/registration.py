"""Adds `--attention-backend feather_grouped`; carries over what SGLang keys on `torch_native`."""

from __future__ import annotations

import weakref
from typing import Any

from sglang_feather.sglang.grouped_attention.names import GROUPED
from sglang_feather.sglang.grouped_attention.observe import SegmentMetrics, SegmentObserver, decode_seq_lens
from sglang_feather.sglang.version import unsupported_version

SEGMENT_METRICS_FLAG = "--feather-segment-metrics"
_ATTR = "_feather_segment_metrics"
"""Bookkeeping attribute on SGLang's `ServerArgs` (pickled to the scheduler process, like Feather's options)."""

TORCH_NATIVE = "torch_native"
NATIVE_BACKEND = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"

_registered = False
_native_observers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register() -> None:
    """Called from the plugin's entry point in every SGLang process, with or without the source patch set.

    SGLang treats a few backend names specially; for this one it does what it does for `torch_native`, whose
    extend path it runs: CUDA graphs off (a resolution hook), and the torch (not Triton) index helpers."""
    global _registered
    if _registered:
        return
    _registered = True
    if unsupported_version() is not None:
        return  # the plugin logs why, and leaves this SGLang as it is
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if GROUPED not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([GROUPED])
    if GROUPED not in ATTENTION_BACKENDS:
        register_attention_backend(GROUPED)(create_backend)
    register_resolution_hook("handle_attention_backend_compatibility")(_cuda_graphs_off)
    HookRegistry.register("sglang.srt.utils.common.support_triton", _no_triton, HookType.AROUND)
    HookRegistry.register("sglang.srt.mem_cache.allocation.get_last_loc", _torch_last_loc, HookType.AROUND)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", _add_cli_args, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", _from_cli_args, HookType.AFTER)
    HookRegistry.register(f"{NATIVE_BACKEND}.init_forward_metadata", _observe_torch_native, HookType.AFTER)


def create_backend(model_runner: Any) -> Any:
    from sglang_feather.sglang.grouped_attention.backend import GroupedDecodeAttnBackend

    server_args = model_runner.server_args
    observer = make_observer(GROUPED, model_runner.page_size, getattr(server_args, "enable_metrics", False))
    return GroupedDecodeAttnBackend(model_runner, observer)


def make_observer(backend: str, page_size: int | None, with_metrics: bool) -> SegmentObserver:
    """The segment observer a backend books its decode steps with (`sglang:feather_decode_*` if metrics)."""
    return SegmentObserver(backend, int(page_size or 1), SegmentMetrics(backend) if with_metrics else None)


def _cuda_graphs_off(server_args: Any, previous: Any) -> None:
    previous(server_args)
    from sglang.srt.arg_groups.overrides import declare_resolution, resolved_view, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    if resolved_view(server_args).attention_backend != GROUPED:
        return
    config = resolving_view(server_args).cuda_graph_config
    for phase in (Phase.DECODE, Phase.PREFILL):
        config = with_phase(config, phase, backend=Backend.DISABLED)
        declare_resolution(server_args, "_handle_attention_backend_compatibility", cuda_graph_config=config)


def _no_triton(original: Any, backend: str, *args: Any, **kwargs: Any) -> bool:
    return False if backend == GROUPED else original(backend, *args, **kwargs)


def _torch_last_loc(original: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.mem_cache.allocation import get_last_loc_torch
    from sglang.srt.runtime_context import attention_backends

    impl = get_last_loc_torch if GROUPED in attention_backends() else original
    return impl(*args, **kwargs)


def _add_cli_args(_result: None, parser: Any) -> None:
    if SEGMENT_METRICS_FLAG in parser._option_string_actions:
        return
    parser.add_argument(
        SEGMENT_METRICS_FLAG,
        action="store_true",
        default=False,
        help="Export each decode step's shared prefix segments (sglang:feather_decode_*, needs "
        f"--enable-metrics) under any schedule policy; {GROUPED} always exports them, {TORCH_NATIVE} then "
        "pays the segment detection once per decode step.",
    )


def _from_cli_args(server_args: Any, _cls: type, args: Any) -> None:
    setattr(server_args, _ATTR, bool(getattr(args, SEGMENT_METRICS_FLAG[2:].replace("-", "_"), False)))


def _observe_torch_native(_result: None, backend: Any, forward_batch: Any) -> None:
    """Counts a torch_native decode batch's segments when `--feather-segment-metrics` is on (the grouped
    backend, a subclass, books its own)."""
    seq_lens = decode_seq_lens(forward_batch)
    if type(backend).__name__ != "TorchNativeAttnBackend" or seq_lens is None:
        return
    if backend not in _native_observers:
        _native_observers[backend] = _native_observer()
    observer = _native_observers[backend]
    if observer is not None:
        observer.observe(backend.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, seq_lens)


def _native_observer() -> SegmentObserver | None:
    from sglang.srt.runtime_context import get_schedule, get_server_args

    server_args = get_server_args()
    if not (getattr(server_args, _ATTR, False) and getattr(server_args, "enable_metrics", False)):
        return None
    return make_observer(TORCH_NATIVE, get_schedule().page_size, with_metrics=True)
