"""Drive vLLM's real v1 Scheduler without a model: fake model outputs (the only mock: it stands in for the GPU)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import vllm
from vllm import triton_utils
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from sglang_feather.offline.vllm_inputs import EngineShape

# How it works.
#
# `make_scheduler` builds the scheduler class under test (vLLM's own or a subclass) from a real VllmConfig
# (the model's config and tokenizer only; no weights) and a KV-cache config of `num_blocks` blocks that no
# tensor backs. `Driver` adds requests and answers each schedule() as a model runner would: one sampled
# token for every scheduled request whose prompt is then computed, nothing for an unfinished prefill chunk.
# The sampled tokens are a request's own `output_ids` (so a chat turn's answer is what the next turn's prompt
# holds) or a constant. Everything else, queues, prefix cache, block allocation, chunked prefill and
# preemption, is vLLM's unchanged code. The driver times each step's schedule() and update_from_output() in
# this thread's CPU time, so another process's load does not count.

_HAS_REQ_ID_TO_INDEX = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}
"""vLLM 0.34 dropped ModelRunnerOutput.req_id_to_index (the scheduler indexes req_ids itself)."""

SAMPLED_TOKEN = 11
"""A fake decode step samples this token for a request without `output_ids` (requests use ignore_eos, so only
max_tokens stops them)."""


class StepLimitExceeded(RuntimeError):
    """Requests were still running or waiting after the driver's step limit."""


class UnsupportedSchedulerOption(ValueError):
    """The installed vLLM's SchedulerConfig has no field of that name (e.g. a 0.34 option on 0.32)."""


@functools.lru_cache(maxsize=2)
def _model_config(model_dir: str, max_model_len: int) -> ModelConfig:
    return ModelConfig(model=model_dir, dtype="bfloat16", max_model_len=max_model_len)


def vllm_config(shape: EngineShape, model_dir: Path | str) -> VllmConfig:
    """The engine's config on the model in `model_dir` (its config.json and tokenizer only)."""
    known = {f.name for f in dataclasses.fields(SchedulerConfig)}
    missing = sorted(set(shape.scheduler_options) - known)
    if missing:
        raise UnsupportedSchedulerOption(
            f"vLLM {vllm.__version__}'s SchedulerConfig has no field {', '.join(missing)} "
            "(vLLM 0.34 added cache_aware_admission_window and cache_aware_admission_threshold)"
        )
    scheduler_config = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        is_encoder_decoder=False,
        policy=shape.policy,
        long_prefill_token_threshold=shape.long_prefill_token_threshold,
        **shape.scheduler_options,
    )
    cache_config = CacheConfig(block_size=shape.block_size, enable_prefix_caching=shape.enable_prefix_caching)
    additional = {} if shape.feather is None else {"feather": dict(shape.feather)}
    with _cpu_platform_without_triton():
        config = VllmConfig(
            model_config=_model_config(str(model_dir), shape.max_model_len),
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            additional_config=additional,
        )
    config.cache_config.num_gpu_blocks = shape.num_blocks  # normally set by a worker's KV-cache profiling
    return config


def _cpu_platform_without_triton() -> contextlib.AbstractContextManager:
    """vLLM 0.34's CPU platform refuses a config on x86 without triton-cpu (`CpuPlatform.check_and_update_config`:
    "vLLM on x86 CPUs requires Triton"); the harness runs no kernel, so it lets the config through. Only that
    check's own late `from vllm.triton_utils import HAS_TRITON` sees the patch, for the config's construction."""
    if vllm.__version__.startswith(("0.32.", "0.33.")):
        return contextlib.nullcontext()
    return mock.patch.object(triton_utils, "HAS_TRITON", True)


def make_scheduler(cls: type[Scheduler], shape: EngineShape, config: VllmConfig, **kwargs: Any) -> Any:
    """`cls` on `config` with a KV cache of `shape.num_blocks` blocks (no tensors behind them)."""
    spec = FullAttentionSpec(block_size=shape.block_size, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    groups = [KVCacheGroupSpec([f"layer{i}"], spec) for i in range(shape.num_kv_cache_groups)]
    kv_cache_config = KVCacheConfig(num_blocks=shape.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=shape.block_size,
        **kwargs,
    )


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Driver:
    """Adds requests to a scheduler and answers each schedule() like a model runner would."""

    scheduler: Scheduler
    block_size: int = 16
    check: Callable[[Scheduler], None] | None = None
    """Called after every add, abort and step (e.g. a test's agreement check)."""
    clock: FakeClock | None = None
    """Advanced by `step_s` between schedule() and update_from_output(), as if the model ran that long."""
    step_s: float = 1.0
    on_scheduled: Callable[[SchedulerOutput], None] | None = None
    """Called with each step's output after schedule(), before update_from_output() (untimed)."""
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, RequestStatus] = field(default_factory=dict)
    history: list[SchedulerOutput] = field(default_factory=list)
    num_sampled: list[int] = field(default_factory=list)
    """Tokens sampled in each step."""
    cpu_ns: list[int] = field(default_factory=list)
    """Each step's schedule() plus update_from_output(), in this thread's CPU nanoseconds."""
    keep_history: bool = True
    """Off for long runs: `history` then stays empty."""
    _output_ids: dict[str, Sequence[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(self.block_size, sha256)

    def add(
        self,
        request_id: str,
        token_ids: Sequence[int],
        max_tokens: int = 4,
        output_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> Request:
        """Add a request; it samples `output_ids` in order (at least `max_tokens` of them) or SAMPLED_TOKEN."""
        if output_ids is not None:
            if len(output_ids) < max_tokens:
                raise ValueError(f"{request_id}: {len(output_ids)} output ids for max_tokens={max_tokens}")
            self._output_ids[request_id] = output_ids
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        request = Request(request_id, list(token_ids), params, None, block_hasher=self._hasher, **kwargs)
        self.scheduler.add_request(request)
        self.outputs[request_id] = []
        self._check()
        return request

    def abort(self, request_ids: Iterable[str]) -> None:
        for request in self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED):
            self.finished[request.request_id] = request.status
        self._check()

    def step(self) -> SchedulerOutput:
        """One engine step: schedule, then a fake model output (one token for each request past its prompt)."""
        start = time.thread_time_ns()
        output = self.scheduler.schedule()
        schedule_ns = time.thread_time_ns() - start
        if self.on_scheduled is not None:
            self.on_scheduled(output)
        request_ids = list(output.num_scheduled_tokens)
        live = {request_id: self.scheduler.requests[request_id] for request_id in request_ids}
        sampled = [self._sample(live[request_id]) for request_id in request_ids]
        # A keyword only some vLLM versions take: its name is checked where the flag is read, not here.
        index: dict[str, Any] = (
            {"req_id_to_index": {rid: i for i, rid in enumerate(request_ids)}} if _HAS_REQ_ID_TO_INDEX else {}
        )
        runner_output = ModelRunnerOutput(req_ids=request_ids, sampled_token_ids=sampled, **index)
        if self.clock is not None:
            self.clock.now += self.step_s
        start = time.thread_time_ns()
        self.scheduler.update_from_output(output, runner_output)
        self.cpu_ns.append(schedule_ns + time.thread_time_ns() - start)
        for request_id, tokens in zip(request_ids, sampled, strict=True):
            self.outputs[request_id].extend(tokens)
            if live[request_id].is_finished():
                self.finished[request_id] = live[request_id].status
                self._output_ids.pop(request_id, None)
        if self.keep_history:
            self.history.append(output)
        self.num_sampled.append(sum(len(tokens) for tokens in sampled))
        self._check()
        return output

    def _sample(self, request: Request) -> list[int]:
        """What the model samples for `request` in this step: nothing while its prompt is incomplete."""
        if request.num_computed_tokens < request.num_tokens:
            return []
        planned = self._output_ids.get(request.request_id)
        return [SAMPLED_TOKEN if planned is None else int(planned[request.num_output_tokens])]

    def run(self, max_steps: int = 1000) -> None:
        """Step until nothing runs or waits; StepLimitExceeded if that takes more than `max_steps`."""
        for _ in range(max_steps):
            if not self.busy():
                return
            self.step()
        raise StepLimitExceeded(
            f"requests still pending after {max_steps} steps: {self.scheduler.get_request_counts()}"
        )

    def _check(self) -> None:
        if self.check is not None:
            self.check(self.scheduler)

    def busy(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)


def computed_ranges(output: SchedulerOutput) -> dict[str, tuple[int, int]]:
    """Token positions each scheduled request computes in this step: [computed before, + scheduled)."""
    starts = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return {rid: (starts[rid], starts[rid] + n) for rid, n in output.num_scheduled_tokens.items()}


def admitted_ids(output: SchedulerOutput) -> list[str]:
    """Requests that entered the running batch in this step (new ones and resumed preempted ones), in order."""
    # vLLM 0.34 sends a resumed request in full among the new ones (CachedRequestData lost resumed_req_ids).
    return [r.req_id for r in output.scheduled_new_reqs] + sorted(
        getattr(output.scheduled_cached_reqs, "resumed_req_ids", ())
    )


def prompt(
    prefix_id: int, num_prefix_blocks: int, suffix_id: int, num_suffix_tokens: int, block_size: int = 16
) -> list[int]:
    """Token ids: `num_prefix_blocks` full blocks shared by every prompt of `prefix_id`, then a private tail."""
    base = 20 + 37 * prefix_id
    shared = [(base + i) % 1000 + 4 for i in range(num_prefix_blocks * block_size)]
    tail = [(500 + 13 * suffix_id + i) % 1000 + 4 for i in range(num_suffix_tokens)]
    return shared + tail
