"""What a simulation run records: one row per forward step and one timeline per request."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class StepKind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class StepRecord:
    kind: StepKind
    start_s: float
    gpu_s: float
    cpu_s: float
    batch_size: int
    num_groups: int
    num_tokens: int
    ran_policy: bool
    bound_gpu_s: float
    """The step's GPU time with perfect sharing: every shared prefix node of the batch read once from DRAM (as a
    cascade kernel would), private KV as before; a prefill step's own time."""
    num_locked_tokens: int = 0
    """Cached prompt tokens running requests lock (not evictable): their prefixes, each counted once, and their
    own prompts; recorded for decode steps."""


@dataclass(frozen=True)
class RequestRecord:
    rid: str
    group: str
    arrival_s: float
    admit_s: float
    first_token_s: float
    finish_s: float
    prompt_len: int
    output_len: int
    num_prefills: int


@dataclass
class RunLog:
    steps: list[StepRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    cache_hit_tokens: int = 0
    cache_miss_tokens: int = 0
    num_retractions: int = 0
    num_policy_passes: int = 0
    policy_cpu_s: float = 0.0
    event_cpu_s: float = 0.0
    max_cache_tokens: int = 0
    end_s: float = 0.0
    overlap_schedule: bool = True
    tree_cache: str | None = None
    """The SGLang tree cache an SGLang baseline policy ran on (e.g. "UnifiedRadixCache (RustUnifiedTreeCore)")."""
    admission: dict[str, Any] | None = None
    """Feather only: its admission counters at the end of the run (`AdmissionStats`)."""
