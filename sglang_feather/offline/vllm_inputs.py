"""What a model-free vLLM run takes: the engine's shape and the requests to replay, in steps (no vLLM import)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

STEP_S = 0.05
"""Seconds one harness step stands for (the order of a GPU step with a prefill in it): arrival and think times
become steps at this rate, and Feather's clock (its aging bound, max_wait_s) advances by it per step."""

TINY_VOCAB = 1024
"""Token ids stay below the tiny model's vocabulary (models/tiny-llama)."""


@dataclass(frozen=True)
class EngineShape:
    block_size: int = 16
    num_blocks: int = 256
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    max_model_len: int = 512
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    """vLLM's cap on one prefill chunk (0: none); with it a long prompt is prefilled over several steps."""
    policy: Literal["fcfs", "priority"] = "fcfs"
    feather: Mapping[str, Any] | None = None
    """The `additional_config["feather"]` section; None leaves it out."""
    num_kv_cache_groups: int = 1
    """Full-attention KV-cache groups (layers with their own blocks); more than one makes vLLM's cache hybrid."""
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)
    """Further SchedulerConfig fields, e.g. vLLM 0.34's cache_aware_admission_window; a field the installed
    vLLM lacks raises UnsupportedSchedulerOption."""


@dataclass(frozen=True)
class ReplayRequest:
    """One request of a replayed workload: its tokens, what the fake model samples, when it arrives."""

    rid: str
    prompt_ids: Sequence[int]
    output_ids: Sequence[int] | None
    """The tokens the fake model samples (a chat turn's answer, which the next turn's prompt holds); None: a
    constant token."""
    max_tokens: int
    arrival_step: int = 0
    follows: str | None = None
    """It arrives `delay_steps` after this request finished (a chat turn); `arrival_step` is then ignored."""
    delay_steps: int = 0
