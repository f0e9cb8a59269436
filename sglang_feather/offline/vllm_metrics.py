"""What one model-free vLLM run costs: prefix-cache hits, recomputed tokens, preemptions, waits, CPU per step."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput

from sglang_feather.offline.vllm_harness import admitted_ids, computed_ranges

# How it works.
#
# `RunMeter.on_scheduled` reads every SchedulerOutput before the fake model answers it. A request admitted in
# the step (new, or resumed after a preemption) starts at the tokens vLLM's prefix cache gave it: those are
# its hit, its whole sequence so far is its query (vLLM's own PrefixCacheStats counts the same way). Every
# full KV block whose last token a step computes is named by vLLM's chained block hash, which stands for the
# block's whole prefix: a block whose hash some earlier computation (this request's before a preemption,
# another request's, or an earlier request's in the same step) already produced is recomputed work, which an
# unbounded prefix cache would have saved; partial blocks are never cached, so they are not counted. Waits
# are in steps, from the step a request is added to the first step that schedules it.


@dataclass(frozen=True)
class RunResult:
    """One policy on one workload and seed."""

    policy: str
    workload: str
    seed: int
    num_requests: int
    num_steps: int
    num_hit_tokens: int
    num_queried_tokens: int
    num_computed_block_tokens: int
    """Tokens of the full KV blocks the steps computed (prefill and decode)."""
    num_recomputed_tokens: int
    """Tokens of full KV blocks computed while a block with the same chained hash had been computed before."""
    num_preemptions: int
    cpu_per_step_us: float
    """Median over steps of schedule() + update_from_output(), thread CPU time."""
    max_wait_steps: int
    mean_wait_steps: float

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


@dataclass
class RunMeter:
    """Observes one run's SchedulerOutputs (`Driver.on_scheduled`) and arrivals."""

    scheduler: Any
    block_size: int
    step: int = 0
    """The step being scheduled; the runner sets it."""
    arrivals: dict[str, int] = field(default_factory=dict)
    first_scheduled: dict[str, int] = field(default_factory=dict)
    num_hit_tokens: int = 0
    num_queried_tokens: int = 0
    num_computed_block_tokens: int = 0
    num_recomputed_tokens: int = 0
    num_preemptions: int = 0
    _computed: set[Any] = field(default_factory=set)

    def on_arrival(self, request_id: str) -> None:
        self.arrivals[request_id] = self.step

    def on_scheduled(self, output: SchedulerOutput) -> None:
        ranges = computed_ranges(output)
        requests = self.scheduler.requests
        for request_id in admitted_ids(output):
            self.first_scheduled.setdefault(request_id, self.step)
            self.num_hit_tokens += ranges[request_id][0]
            self.num_queried_tokens += requests[request_id].num_tokens
        size = self.block_size
        for request_id, (start, end) in ranges.items():
            hashes = requests[request_id].block_hashes
            for block in range(start // size, end // size):
                self.num_computed_block_tokens += size
                if hashes[block] in self._computed:
                    self.num_recomputed_tokens += size
                else:
                    self._computed.add(hashes[block])
        self.num_preemptions += len(output.preempted_req_ids or ())

    def result(self, policy: str, workload: str, seed: int, cpu_ns: list[int]) -> RunResult:
        waits = [self.first_scheduled[rid] - step for rid, step in self.arrivals.items()]
        return RunResult(
            policy=policy,
            workload=workload,
            seed=seed,
            num_requests=len(self.arrivals),
            num_steps=len(cpu_ns),
            num_hit_tokens=self.num_hit_tokens,
            num_queried_tokens=self.num_queried_tokens,
            num_computed_block_tokens=self.num_computed_block_tokens,
            num_recomputed_tokens=self.num_recomputed_tokens,
            num_preemptions=self.num_preemptions,
            cpu_per_step_us=statistics.median(cpu_ns) / 1e3 if cpu_ns else 0.0,
            max_wait_steps=max(waits, default=0),
            mean_wait_steps=statistics.fmean(waits) if waits else 0.0,
        )
