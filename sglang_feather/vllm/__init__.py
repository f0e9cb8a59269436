"""Feather for vLLM v1: `--scheduler-cls sglang_feather.vllm.FeatherScheduler` (vLLM imported on first use)."""

from typing import Any

__all__ = ["FeatherScheduler", "UnsupportedVllmConfig", "UnsupportedVllmVersion"]


def __getattr__(name: str) -> Any:
    if name == "FeatherScheduler":
        from sglang_feather.vllm.scheduler import FeatherScheduler

        return FeatherScheduler
    if name in ("UnsupportedVllmConfig", "UnsupportedVllmVersion"):
        from sglang_feather.vllm import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
