"""The tests' side of the model-free vLLM harness (`sglang_feather.offline.vllm_harness`): the tiny model's
folder, and the check that Feather's CHT agrees with vLLM's queues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm.config import VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler

from sglang_feather.offline import vllm_harness
from sglang_feather.offline.vllm_harness import (  # noqa: F401  (re-exported for the test modules)
    SAMPLED_TOKEN,
    Driver,
    EngineShape,
    FakeClock,
    admitted_ids,
    computed_ranges,
    prompt,
)

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "models" / "tiny-llama"


def require_model() -> Path:
    """The tiny model's folder (only its config and tokenizer are read here); fails the test when missing."""
    if not (MODEL_DIR / "config.json").is_file():
        pytest.fail(f"{MODEL_DIR} is missing: run `make model` first", pytrace=False)
    return MODEL_DIR


def vllm_config(shape: EngineShape) -> VllmConfig:
    return vllm_harness.vllm_config(shape, require_model())


def make_scheduler(cls: type[Scheduler], shape: EngineShape, config: VllmConfig | None = None, **kwargs: Any):
    return vllm_harness.make_scheduler(
        cls, shape, config if config is not None else vllm_config(shape), **kwargs
    )


def check_agreement(scheduler: Any) -> None:
    """Feather's CHT holds exactly vLLM's waiting requests as WAITING and its running ones as ACTIVE."""
    tree = scheduler.admission.tree
    waiting = [r.request_id for r in scheduler.waiting]
    running = [r.request_id for r in scheduler.running]
    assert len(set(waiting)) == len(waiting), f"a request is queued twice: {waiting}"
    assert not scheduler.kv_holding_waiting, (
        "Feather refuses KV connectors, so nothing may hold KV while waiting"
    )
    assert set(tree.waiting_ids()) == set(waiting), (sorted(tree.waiting_ids()), sorted(waiting))
    assert set(tree.active_ids()) == set(running), (sorted(tree.active_ids()), sorted(running))
    assert set(scheduler.requests) == set(waiting) | set(running)
    tree.check_invariants()
