"""Applies the `sglang`, `server` and `vllm` markers by where a test lives and what its module imports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("feather", deadline=None)
settings.load_profile("feather")
"""No per-example deadline (Hypothesis's default is 200 ms): `make test` runs its lanes side by side on 2 cores,
and speed targets live in the benchmarks, not in tests."""

TESTS = Path(__file__).resolve().parent

MARKERS_BY_PATH: dict[str, tuple[str, ...]] = {
    "sglang/": ("sglang",),
    "e2e/": ("sglang", "server"),
    "vllm/": ("vllm",),
    "vllm/test_vllm_server.py": ("server",),
}
"""Path prefix under tests/ -> markers for every test there."""

ENGINE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:sglang_feather\.)?(sglang|vllm)\b", re.MULTILINE)
"""A module that imports an engine (or an adapter package, which does) at top level needs that engine."""

SERVER_TIMEOUT_S = 1800
"""Per-test timeout for server tests; the others get pyproject's `timeout`."""


def _engine_imports(path: Path, cache: dict[Path, frozenset[str]]) -> frozenset[str]:
    if path not in cache:
        cache[path] = frozenset(ENGINE_IMPORT.findall(path.read_text()))
    return cache[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sources: dict[Path, frozenset[str]] = {}
    for item in items:
        relative = item.path.relative_to(TESTS).as_posix()
        names = set(_engine_imports(item.path, sources))
        for prefix, markers in MARKERS_BY_PATH.items():
            if relative.startswith(prefix):
                names.update(markers)
        for name in sorted(names):
            item.add_marker(name)
        if "server" in names and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SERVER_TIMEOUT_S))
