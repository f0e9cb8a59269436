"""The SGLang release Feather's hooks were written against, and why the installed one is not it."""

from __future__ import annotations

import importlib.metadata

SUPPORTED_SGLANG = "0.5.23"
"""The SGLang release whose scheduler internals the plugin's hooks were written against."""


def sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def unsupported_version() -> str | None:
    """Why this SGLang's release is not the one Feather supports; None if it is."""
    version = sglang_version()
    if version != SUPPORTED_SGLANG:
        return (
            f"sglang-feather supports SGLang {SUPPORTED_SGLANG} only, found {version}: "
            f"pip install 'sglang=={SUPPORTED_SGLANG}', or use another --schedule-policy"
        )
    return None
