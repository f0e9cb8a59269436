"""Many requests through Feather's SGLang plugin hooks on real CPU objects: is memory flat, is every index drained?"""

from __future__ import annotations

import gc
import math
import resource
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sglang_feather.admission import AdmissionConfig
from sglang_feather.measure.workloads import ZipfGroups
from sglang_feather.offline.adapter_harness import AdapterHarness
from sglang_feather.offline.sglang_objects import make_req
from sglang_feather.sglang.options import FEATHER, FeatherOptions

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

NUM_GROUPS = 64

# How it works. An `AdapterHarness` for `feather` (real `Req`, tree cache, `PrefillAdder`, waiting list and
# running `ScheduleBatch`; every Feather call through the plugin's hook functions) runs scheduler steps until
# `num_requests` requests have finished or been aborted. Each step: arrivals top the waiting queue up to
# `num_waiting`; one prefill pass; the admitted batch merges into the running batch; one decode step (one
# token for every running request); requests that reached their output length finish (`release_kv_cache`);
# with probability `abort_p` a random waiting request is aborted (`_release_aborted_request`) and with
# `retract_p` a random running one is retracted and re-queued with its output so far (`_add_request_to_queue`,
# re-hashed). Prompts: 64 Zipf-popular groups with prefixes of min_prompt_len/2 .. 5/8 max_prompt_len tokens
# (geometric spread), which sit in the prefix cache, then a private suffix of log-uniform length, so prompts
# are min_prompt_len .. max_prompt_len tokens; outputs 1..max_new_tokens tokens. The prefix cache is fixed:
# prefills are not inserted (no KV is computed) and every match ends at a cached prefix's end (no node
# split), so SGLang's own cache growth does not hide Feather's. Memory is compared between equal states: after a warm-up of `warmup_requests` requests
# the queues are drained (every request finished or aborted) and measured; after all requests they are
# drained and measured again. tracemalloc sees Python allocations (the compiled tree's are visible only
# in RSS and in the tree's own counters); `feather_traced` counts those made from sglang_feather code.


@dataclass(frozen=True)
class SoakConfig:
    num_requests: int = 100_000
    warmup_requests: int = 5_000
    num_waiting: int = 256
    min_prompt_len: int = 64
    max_prompt_len: int = 10_240
    max_new_tokens: int = 16
    abort_p: float = 0.02
    retract_p: float = 0.02
    num_checkpoints: int = 20
    stopper: str = "static"
    trace: bool = True
    seed: int = 0


@dataclass(frozen=True)
class Checkpoint:
    num_done: int
    num_steps: int
    elapsed_s: float
    rss_mb: float
    traced_mb: float
    feather_traced_mb: float
    tracked: dict[str, int]


@dataclass
class SoakResult:
    config: SoakConfig
    num_finished: int = 0
    num_aborted: int = 0
    num_retracted: int = 0
    num_passes: int = 0
    num_steps: int = 0
    wall_s: float = 0.0
    checkpoints: list[Checkpoint] = field(default_factory=list)
    after_warmup: Checkpoint | None = None
    at_end: Checkpoint | None = None
    num_errors: int = 0
    num_drift: int = 0
    num_misses: int = 0
    """Picks not where the mirror's sorted part placed them (`FeatherRuntime.num_misses`)."""

    @property
    def traced_growth_mb(self) -> float:
        start, end = self._measured()
        return end.traced_mb - start.traced_mb

    @property
    def feather_traced_growth_mb(self) -> float:
        start, end = self._measured()
        return end.feather_traced_mb - start.feather_traced_mb

    @property
    def rss_growth_mb(self) -> float:
        start, end = self._measured()
        return end.rss_mb - start.rss_mb

    def _measured(self) -> tuple[Checkpoint, Checkpoint]:
        """The checkpoints growth is measured between: after the warm-up and at the end."""
        if self.after_warmup is None or self.at_end is None:
            raise ValueError("the soak has not run past its warm-up to its end")
        return self.after_warmup, self.at_end


def _is_done(req: Req) -> bool:
    """Whether a running request has produced its `max_new_tokens` (every soak request sets it)."""
    max_new = req.sampling_params.max_new_tokens
    return max_new is not None and len(req.output_ids) >= max_new


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


_FEATHER_FILES = (tracemalloc.Filter(True, "*/sglang_feather/*"),)


class _Soak:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        prefix_lens = np.geomspace(cfg.min_prompt_len // 2, cfg.max_prompt_len * 5 // 8, NUM_GROUPS).astype(
            int
        )
        self.groups = ZipfGroups.build(self.rng, self.rng.permutation(prefix_lens).tolist())
        self.harness = AdapterHarness(
            FEATHER, options=FeatherOptions(AdmissionConfig(stopper=cfg.stopper)), cached=self.groups.prefixes
        )
        self.result = SoakResult(cfg)
        self.num_arrived = 0
        self.started = time.perf_counter()

    @property
    def num_done(self) -> int:
        return self.result.num_finished + self.result.num_aborted

    def _arrive(self) -> None:
        cfg = self.cfg
        group = int(self.groups.groups(self.rng, 1)[0])
        prefix_len = len(self.groups.prefixes[group])
        low, high = max(cfg.min_prompt_len - prefix_len, 1), cfg.max_prompt_len - prefix_len
        suffix_len = int(math.exp(self.rng.uniform(math.log(low), math.log(high))))
        prompt = self.groups.extend(self.rng, group, suffix_len)
        num_new = int(self.rng.integers(1, cfg.max_new_tokens + 1))
        self.harness.arrive(make_req(f"s{self.num_arrived}", prompt, max_new_tokens=num_new))
        self.num_arrived += 1

    def step(self, limit: int) -> None:
        cfg, h, result = self.cfg, self.harness, self.result
        while len(h.waiting) < cfg.num_waiting and self.num_arrived < limit:
            self._arrive()
        if h.waiting:
            admitted = h.prefill_pass().admitted
            h.merge(admitted)
            result.num_passes += 1
        h.decode_step()
        for req in [r for r in h.running if _is_done(r)]:
            h.finish(req)
            result.num_finished += 1
        if h.waiting and self.rng.random() < cfg.abort_p:
            h.abort_waiting(h.waiting[int(self.rng.integers(len(h.waiting)))])
            result.num_aborted += 1
        if h.running and self.rng.random() < cfg.retract_p:
            h.retract(h.running[int(self.rng.integers(len(h.running)))])
            result.num_retracted += 1
        result.num_steps += 1

    def run_until(self, limit: int, checkpoint_every: int | None = None) -> None:
        """Steps until `limit` requests arrived and every one of them finished or was aborted."""
        next_checkpoint = self.num_done + (checkpoint_every or 0)
        while self.num_done < limit:
            self.step(limit)
            if checkpoint_every and self.num_done >= next_checkpoint:
                self.result.checkpoints.append(self.checkpoint())
                next_checkpoint += checkpoint_every

    def checkpoint(self) -> Checkpoint:
        self.harness.runtime.admission.tree.check_invariants()
        self.harness.runtime.check_queue_order(self.harness.waiting)
        gc.collect()
        traced = feather = 0.0
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            traced = sum(stat.size for stat in snapshot.statistics("filename")) / 2**20
            feather_stats = snapshot.filter_traces(_FEATHER_FILES).statistics("filename")
            feather = sum(stat.size for stat in feather_stats) / 2**20
        return Checkpoint(
            num_done=self.num_done,
            num_steps=self.result.num_steps,
            elapsed_s=time.perf_counter() - self.started,
            rss_mb=_rss_mb(),
            traced_mb=traced,
            feather_traced_mb=feather,
            tracked=self.harness.tracked(),
        )


def run_soak(cfg: SoakConfig) -> SoakResult:
    soak = _Soak(cfg)
    gc.collect()
    gc.freeze()  # the imported modules and the prefix cache: collections scan only what the steps allocate
    if cfg.trace:
        tracemalloc.start()
    try:
        soak.run_until(cfg.warmup_requests)
        soak.result.after_warmup = soak.checkpoint()
        every = max(1, (cfg.num_requests - cfg.warmup_requests) // max(cfg.num_checkpoints, 1))
        soak.run_until(cfg.num_requests, every)
        soak.result.at_end = soak.checkpoint()
    finally:
        if cfg.trace:
            tracemalloc.stop()
        gc.unfreeze()
    result = soak.result
    result.wall_s = time.perf_counter() - soak.started
    result.num_errors = soak.harness.runtime.num_errors
    result.num_drift = soak.harness.runtime.num_drift
    result.num_misses = soak.harness.runtime.num_misses
    soak.harness.close()
    return result
