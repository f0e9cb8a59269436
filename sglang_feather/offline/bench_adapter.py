"""Feather's shipped SGLang path against SGLang's dfs-weight, pass by pass, on real CPU objects (benchmark side)."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass

import numpy as np

from sglang_feather.admission import AdmissionConfig
from sglang_feather.admission.config import DEFAULT_STOPPER
from sglang_feather.measure.timing import Spread, frozen_heap, gc_disabled
from sglang_feather.measure.workloads import ZipfGroups
from sglang_feather.offline.adapter_harness import AdapterHarness, PassResult
from sglang_feather.offline.sglang_objects import describe_tree_cache, make_radix_cache, make_req
from sglang_feather.sglang.options import FEATHER, FeatherOptions

# How it works. One cell: W waiting requests and R running ones, prompts of L tokens from 64 Zipf-popular
# groups sharing 5L/8-token prefixes. Each side gets its own `AdapterHarness` (real `Req`, tree cache,
# `PrefillAdder`, SGLang's waiting list and running `ScheduleBatch`) with the running prompts already in the
# prefix cache: SGLang's `dfs-weight`, and `feather` driven through the plugin's hook functions (running
# requests tracked as admitted, the W requests arrived through `_add_request_to_queue`), twice: planned ahead
# (the default) and on the step path (`plans_ahead` off). A sample is one prefill pass; dfs-weight's comes
# first, then the two Feather sides in alternating order; after each sample the queue is restored untimed (the
# admitted requests go back to the end of the waiting list, as SGLang re-queues a retracted request; for
# Feather through the same retraction event SGLang raises), so every sample sees the same requests waiting.
# A decode-step sample is the mean of `decode_block` calls of Feather's end-of-step hook on a decode plan of the R running requests.

BASELINE = "dfs-weight"
STEP = "feather-step"
"""Feather on the step path (`plans_ahead` off), the third side of a cell."""
STOPPER = DEFAULT_STOPPER
"""Feather's default, as a server runs it (`always`). A learning stopper (`ucb`) is no comparison here: rewarded
by this model-free loop's meaningless decode rates it soon stops at the first candidate."""
NUM_GROUPS = 64
ZIPF_ALPHA = 1.0
MAX_NEW_TOKENS = 128
"""Every benchmarked request's output budget (what the adder reserves decode room for)."""


@dataclass(frozen=True)
class AdapterCell:
    num_waiting: int
    prompt_len: int
    num_running: int
    num_samples: int
    baseline_calc_priority_s: Spread
    baseline_pass_s: Spread
    feather_pass_s: Spread
    """Whole Feather pass: calc_priority (begin_pass), the adder loop with SGLang's own budget checks, the queue
    update and the end-of-step hook."""
    feather_adapter_s: Spread
    """Feather's own share of that pass (what `feather_step_seconds` reports)."""
    feather_step_adapter_s: Spread
    """The same share on a third harness with the runtime's `plans_ahead` off: the step path (what a seeing or
    learning stopper, or a cache without KV events, runs); equal to the first where the stopper cannot plan."""
    feather_calc_priority_s: Spread
    decode_step_s: Spread
    self_check_s: Spread
    """One full reconcile (`SELF_CHECK_INTERVAL_S` apart in serving)."""
    arrive_s: float
    """Mean `_add_request_to_queue` hook per arrival (hashing the prompt and inserting it into the CHT)."""
    baseline_admitted: int
    feather_admitted: int
    feather_step_admitted: int

    @property
    def calc_priority_ratio(self) -> float:
        return self.baseline_calc_priority_s.median / self.feather_adapter_s.median

    @property
    def plan_gain(self) -> float:
        """How much cheaper Feather's share is planned ahead than step by step."""
        return self.feather_step_adapter_s.median / self.feather_adapter_s.median

    @property
    def pass_ratio(self) -> float:
        return self.baseline_pass_s.median / self.feather_pass_s.median


def tree_cache() -> str:
    """The SGLang tree cache both sides run on (its class and SGLang's radix tree under it), as the harness builds it."""
    return describe_tree_cache(make_radix_cache())


def _restore(harness: AdapterHarness, result: PassResult, queue: list) -> list:
    """Put the admitted requests back at the end of the waiting queue, where SGLang puts retracted requests
    (for Feather through the same retraction event SGLang raises); returns the queue for the next sample.
    The rest of the queue goes back to its order before the pass, which undoes Feather's moves; SGLang itself
    never reorders its queue outside `calc_priority`, so Feather's queue numbers are synced with it."""
    admitted = set(result.admitted)
    queue = [req for req in queue if req not in admitted] + list(result.admitted)
    harness.scheduler.waiting_queue = list(queue)
    if harness.is_feather:
        for req in result.admitted:
            harness.runtime.mirror.queued(req)
        harness.runtime._sync(queue, harness.running, complete=False)  # renumbers: no moved pick to put back
    return queue


METRICS_LABELS = {"model_name": "bench", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0}
"""The labels SGLang's scheduler collector gives Feather's series (`--enable-metrics`), with a stand-in name."""


def _build(
    policy: str, running_prompts, waiting_prompts, stopper: str, metrics: bool = False
) -> tuple[AdapterHarness, float]:
    """`metrics`: Feather's Prometheus series on, as `--enable-metrics` builds them (each harness in a registry
    of its own, where a server has one scheduler per process)."""
    harness = AdapterHarness(
        policy, options=FeatherOptions(AdmissionConfig(stopper=stopper)), cached=tuple(running_prompts)
    )
    if metrics and harness.is_feather:
        from prometheus_client import CollectorRegistry

        from sglang_feather.sglang.metrics import FeatherMetrics

        harness.runtime.metrics = FeatherMetrics(METRICS_LABELS, registry=CollectorRegistry())
    harness.running.extend(
        make_req(f"r{i}", prompt, max_new_tokens=MAX_NEW_TOKENS) for i, prompt in enumerate(running_prompts)
    )
    if harness.is_feather:
        harness.runtime.mirror.sync([], harness.running, complete=True)
        harness.runtime.drain_events()  # caching the running prompts, not the first arrival's work
    t0 = time.perf_counter()
    for i, prompt in enumerate(waiting_prompts):
        harness.arrive(make_req(str(i), prompt, max_new_tokens=MAX_NEW_TOKENS))
    return harness, (time.perf_counter() - t0) / max(len(waiting_prompts), 1)


def measure_cell(
    num_waiting: int,
    prompt_len: int,
    num_running: int,
    *,
    repeat: int = 7,
    decode_block: int = 200,
    seed: int = 0,
    stopper: str = STOPPER,
    metrics: bool = False,
) -> AdapterCell:
    """One cell (see "how it works"); `metrics`: Feather's sides with their Prometheus series on."""
    rng = np.random.default_rng(seed)
    groups = ZipfGroups.build(rng, [prompt_len * 5 // 8] * NUM_GROUPS, ZIPF_ALPHA)
    running_prompts = [groups.prompt(rng, g, prompt_len) for g in groups.groups(rng, num_running)]
    waiting_prompts = [groups.prompt(rng, g, prompt_len) for g in groups.groups(rng, num_waiting)]
    feather, arrive_s = _build(FEATHER, running_prompts, waiting_prompts, stopper, metrics)
    step, _ = _build(FEATHER, running_prompts, waiting_prompts, stopper, metrics)
    step.runtime.plans_ahead = False
    baseline, _ = _build(BASELINE, running_prompts, waiting_prompts, stopper)
    del running_prompts, waiting_prompts
    sides = {FEATHER: feather, STEP: step, BASELINE: baseline}
    queues = {name: list(h.waiting) for name, h in sides.items()}
    results: dict[str, list[PassResult]] = {name: [] for name in sides}
    decode_s: list[float] = []
    check_s: list[float] = []
    with frozen_heap():
        for name, harness in sides.items():  # warm-up: radix node splits, Feather's first end-of-step
            queues[name] = _restore(harness, harness.prefill_pass(), queues[name])
        for i in range(repeat):
            # dfs-weight first (its pass evicts the caches), then the two Feather sides in alternating order,
            # so each follows dfs-weight as often as the other
            order = [BASELINE, FEATHER, STEP] if i % 2 == 0 else [BASELINE, STEP, FEATHER]
            for name in order:
                harness = sides[name]
                gc.collect()
                with gc_disabled():
                    result = harness.prefill_pass()
                results[name].append(result)
                queues[name] = _restore(harness, result, queues[name])
            gc.collect()
            with gc_disabled():
                decode_s.append(sum(feather.step_end_hook() for _ in range(decode_block)) / decode_block)
                check_s.append(feather.self_check())
    feather.close()
    step.close()
    fr, sr, br = results[FEATHER], results[STEP], results[BASELINE]
    return AdapterCell(
        num_waiting=num_waiting,
        prompt_len=prompt_len,
        num_running=num_running,
        num_samples=repeat,
        baseline_calc_priority_s=Spread.of([r.calc_priority_s for r in br]),
        baseline_pass_s=Spread.of([r.pass_s for r in br]),
        feather_pass_s=Spread.of([r.pass_s for r in fr]),
        feather_adapter_s=Spread.of(_adapter_shares(fr)),
        feather_step_adapter_s=Spread.of(_adapter_shares(sr)),
        feather_calc_priority_s=Spread.of([r.calc_priority_s for r in fr]),
        decode_step_s=Spread.of(decode_s),
        self_check_s=Spread.of(check_s),
        arrive_s=arrive_s,
        baseline_admitted=round(statistics.median(len(r.admitted) for r in br)),
        feather_admitted=round(statistics.median(len(r.admitted) for r in fr)),
        feather_step_admitted=round(statistics.median(len(r.admitted) for r in sr)),
    )


def _adapter_shares(results: list[PassResult]) -> list[float]:
    """Feather's share of each of a Feather side's passes (every one of them reports it)."""
    shares = [r.adapter_s for r in results if r.adapter_s is not None]
    if len(shares) != len(results):
        raise RuntimeError("a Feather pass reported no adapter share")
    return shares


@dataclass(frozen=True)
class EventCost:
    """What the cache tier's feed costs per KV event, on SGLang's own events from a server-built cache."""

    page_size: int
    prompt_len: int
    num_prompts: int
    num_chunks: int
    """Chunks cached per round."""
    store_us_per_chunk: Spread
    """Feather's translation and cache-tier store, per chunk cached (`EventTranslator.feed`), over the rounds."""
    evict_us_per_chunk: Spread
    first_store_us_per_chunk: float
    """The first round's store, into empty tables (every later round reuses what the first one grew)."""
    record_us_per_chunk: Spread
    """SGLang's own cost of recording the same store events, per chunk: inserting the prompts with events on
    and draining them (`take_events`), less inserting them into a twin cache with events off."""


def measure_events(
    page_size: int,
    prompt_len: int,
    num_prompts: int = 20,
    rounds: int = 5,
    seed: int = 0,
) -> EventCost:
    """Round after round in one server-built tree cache with events on (as a server's cache lives): cache
    `num_prompts` fresh unrelated prompts, feed their store events to Feather's translator, evict everything,
    feed those events; each feed timed per chunk. The same prompts also go into a twin cache with events off,
    so SGLang's own recording cost is measured beside Feather's."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from sglang_feather.admission import Admission
    from sglang_feather.offline.sglang_objects import cache_prompt
    from sglang_feather.sglang.cache_events import EventTranslator

    config = AdmissionConfig(page_size=page_size, cache_events=True)
    caches = [
        make_radix_cache(page_size=page_size, num_kv_tokens=num_prompts * prompt_len + 1024, kv_events=on)
        for on in (True, False)
    ]
    cache, silent = caches
    cache.take_events()
    admission = Admission.from_config(config)
    translator = EventTranslator(admission, config.chunk_size)
    rng = np.random.default_rng(seed)
    stores, evicts, records = [], [], []
    num_chunks = 0
    for _ in range(rounds):
        prompts = [rng.integers(1, 30000, prompt_len).tolist() for _ in range(num_prompts)]
        with gc_disabled():
            t0 = time.perf_counter()
            for tokens in prompts:
                cache_prompt(cache, tokens)
            stored = cache.take_events()
            t1 = time.perf_counter()
            for tokens in prompts:
                cache_prompt(silent, tokens)
            t2 = time.perf_counter()
            translator.feed(stored)
            store_s = time.perf_counter() - t2
        record_s = (t1 - t0) - (t2 - t1)
        num_chunks = admission.tree.num_cached
        for each in caches:
            each.evict(EvictParams(num_tokens=num_prompts * prompt_len))
        evicted = cache.take_events()
        with gc_disabled():
            t0 = time.perf_counter()
            translator.feed(evicted)
            evict_s = time.perf_counter() - t0
        if admission.tree.num_cached or translator.num_pages:
            raise RuntimeError(f"{admission.tree.num_cached} chunks still cached after evicting everything")
        stores.append(store_s / num_chunks * 1e6)
        evicts.append(evict_s / num_chunks * 1e6)
        records.append(record_s / num_chunks * 1e6)
    return EventCost(
        page_size=page_size,
        prompt_len=prompt_len,
        num_prompts=num_prompts,
        num_chunks=num_chunks,
        store_us_per_chunk=Spread.of(stores),
        evict_us_per_chunk=Spread.of(evicts),
        first_store_us_per_chunk=stores[0],
        record_us_per_chunk=Spread.of(records),
    )
