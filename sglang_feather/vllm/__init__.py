"""Feather for vLLM v1: `--scheduler-cls sglang_feather.vllm.FeatherScheduler` (vLLM imported on first use)."""

from typing import Any

__all__ = ["FeatherScheduler", "UnsupportedVllmConfig", "UnsupportedVllmVersion"]

_LAZY = {
    "FeatherScheduler": "sglang_feather.vllm.scheduler",
    "UnsupportedVllmConfig": "sglang_feather.vllm.config",
    "UnsupportedVllmVersion": "sglang_feather.vllm.config",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
