"""A model of SGLang 0.5.23 continuous batching driven by simulated time and a cost model."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sglang_feather.cht.hashing import chunk_hashes
from sglang_feather.sim.attention import ATTENTION_KERNELS, distinct_shared_tokens
from sglang_feather.sim.budget import KVPool, PassBudget, PassLimits
from sglang_feather.sim.cost import CostModel, KVSplit
from sglang_feather.sim.cpu import CpuTimer
from sglang_feather.sim.interface import SimPolicy
from sglang_feather.sim.metrics import RequestRecord, RunLog, StepKind, StepRecord
from sglang_feather.sim.requests import Phase, ReqState, output_tokens
from sglang_feather.sim.sharing import DEFAULT_BLOCK_SIZE, block_ends
from sglang_feather.sim.token_ratio import NewTokenRatio, RatioTracker
from sglang_feather.sim.trace import TokenSource, TraceError


# How it works.
#
# Each iteration is one scheduler pass followed by one forward step. Arrivals join the waiting queue (at most
# `max_concurrency` in flight when a bench_serving-like client limit is set); when the queue is non-empty and
# the batch is not marked full, the policy runs (its CPU time is charged) and admits requests through
# `try_admit`, which applies SGLang's PrefillAdder budgets (KV room after reserving every running request's
# remaining output, max prefill tokens, chunked prefill size, request slots) and stops the pass at the first
# request that does not fit. A pass that admitted something runs a prefill step (matched prefix skipped, the
# rest computed, first token sampled); otherwise the running batch takes one decode step. New requests join
# the running batch in admission order, as SGLang's `merge_batch` does, or permuted so that requests sharing
# a prefix are contiguous (`batch_order="prefix"`); the cost model sees that order. When a decode step has
# no KV room, requests are retracted in SGLang's order (fewest outputs, then longest prompt, first).
#
# Publication to the prefix cache follows SGLang's scheduler. A chunked prefill's computed part is
# published at the start of the next pass, before admission (`stash_chunked_request`). A completed prefill
# is published when its result is processed: right after its step without the overlap scheduler, but with
# it (`event_loop_overlap`, SGLang's default) only after the *next* pass has been scheduled, so requests
# admitted in the very next pass cannot match a prompt that is already running.
def _admission_order(running: list[ReqState]) -> list[ReqState]:
    return running


def _prefix_order(running: list[ReqState]) -> list[ReqState]:
    """Stable sort by the request's path of shared prefix nodes: requests sharing a prefix become contiguous
    (a depth-first walk of the prefix tree), and requests of one group keep their admission order."""
    return sorted(running, key=lambda s: tuple(n.key for n in s.nodes))


BATCH_ORDERS: dict[str, Callable[[list[ReqState]], list[ReqState]]] = {
    "admission": _admission_order,
    "prefix": _prefix_order,
}
"""How the running batch is ordered after each merge of a prefill batch (what decode attention walks)."""


@dataclass(frozen=True)
class EngineConfig:
    """SGLang server knobs the model honours (defaults are SGLang 0.5.23's for a large GPU)."""

    mem_fraction_static: float = 0.9
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192
    max_running_requests: int = 4096
    new_token_ratio: NewTokenRatio = NewTokenRatio.fixed(1.0)
    """Share of each running request's remaining output reserved at admission: fixed 1.0 (exact for fixed-length
    outputs, no retraction) or SGLang's decaying schedule (`SGLANG_RATIO`)."""
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_capacity_tokens: int | None = None
    overlap_schedule: bool = True
    """SGLang's overlap scheduler (on by default; `--disable-overlap-schedule`): a step takes max(GPU, CPU)
    instead of GPU + CPU, and a completed prefill reaches the prefix cache only after the next pass."""
    batch_order: str = "admission"
    """Order of the running batch: a name in `BATCH_ORDERS`."""
    max_concurrency: int | None = None
    """Client limit on requests in flight (bench_serving's --max-concurrency); None = no limit."""
    warm_cache: bool = False
    """Start with every shared prompt prefix already cached (the paper's prefix-cache warm-up)."""
    attention: str = "plain"
    """The decode attention kernel: a name in `ATTENTION_KERNELS` (how often a shared prefix is read)."""

    def __post_init__(self) -> None:
        if self.batch_order not in BATCH_ORDERS:
            raise ValueError(f"batch_order must be one of {sorted(BATCH_ORDERS)}, got {self.batch_order!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise ValueError(f"attention must be one of {sorted(ATTENTION_KERNELS)}, got {self.attention!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {self.max_concurrency!r}")


@dataclass
class SimClock:
    """Simulated time in seconds; policies read it as their clock."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class EngineSetup:
    """Everything an engine needs besides the requests, the policy and the KV pool."""

    cost: CostModel
    config: EngineConfig
    cpu: CpuTimer
    src: TokenSource
    clock: SimClock = field(default_factory=SimClock)
    progress: Callable[[int], None] | None = None


class Engine:
    def __init__(self, states: list[ReqState], policy: SimPolicy, pool: KVPool, setup: EngineSetup):
        self.config, self.cpu, self.src = setup.config, setup.cpu, setup.src
        self.cost, self.clock, self.progress = setup.cost, setup.clock, setup.progress
        self.states, self.policy, self.pool = states, policy, pool
        self.by_rid = {s.rid: s for s in states}
        self.log = RunLog(overlap_schedule=self.config.overlap_schedule)
        self._order = BATCH_ORDERS[self.config.batch_order]
        self._attention = ATTENTION_KERNELS[self.config.attention]
        cfg = self.config
        self._limits = PassLimits(cfg.max_running_requests, cfg.max_prefill_tokens, cfg.chunked_prefill_size)
        self.waiting: dict[str, ReqState] = {}
        self.running: list[ReqState] = []
        self.chunked: ReqState | None = None
        self.batch_is_full = False
        self.token_ratio = RatioTracker(self.config.new_token_ratio)
        self.pending_cpu = 0.0
        self._unpublished: list[ReqState] = []
        """Prefills completed in the last step whose prompts the overlap scheduler has not yet cached."""
        self._num_in_flight = 0
        self._slot_free_s = 0.0
        """When the client's concurrency limit last let a request go (a finish under a full limit)."""
        self._arrivals: list[tuple[float, int, str]] = []
        self._followers: dict[str, list[ReqState]] = {}
        self._split: KVSplit | None = None
        self._distinct_shared = 0
        """Tokens per layer of the distinct shared nodes of the running batch (with `_split`)."""
        self._num_done = 0
        for i, s in enumerate(states):
            total = s.prompt_len + s.spec.max_new
            if total >= pool.capacity:
                raise TraceError(f"request {s.rid!r} needs {total} KV tokens; the pool holds {pool.capacity}")
            if s.spec.follows is None:
                heapq.heappush(self._arrivals, (s.spec.arrival_s, i, s.rid))
            else:
                self._followers.setdefault(s.spec.follows, []).append(s)
            policy.prepare(s.rid, s.tokens, s.spec.max_new)
        if self.config.warm_cache:
            self._warm()

    def _warm(self) -> None:
        for s in self.states:
            shared = sum(n.num_tokens for n in s.nodes)
            if shared:
                k = bisect.bisect_left(s.ends, shared) + 1
                self.pool.insert(s.hashes[:k], s.ends[:k], s.tokens)

    @property
    def now(self) -> float:
        return self.clock.now

    @now.setter
    def now(self, value: float) -> None:
        self.clock.now = value

    def _charge(self, fn: Callable[[], object]) -> None:
        spent = self.cpu.run(fn)
        self.pending_cpu += spent
        self.log.event_cpu_s += spent

    def run(self) -> RunLog:
        n = len(self.states)
        limit = self.config.max_concurrency
        while self._num_done < n:
            while self._arrivals and self._arrivals[0][0] <= self.now:
                if limit is not None and self._num_in_flight >= limit:
                    break
                due, _, rid = heapq.heappop(self._arrivals)
                self._arrive(self.by_rid[rid], max(due, self._slot_free_s))
            if not self._step():
                if not self._arrivals or (limit is not None and self._num_in_flight >= limit):
                    raise RuntimeError(f"simulation stalled with {n - self._num_done} unfinished requests")
                self.now = max(self.now, self._arrivals[0][0])
        self.log.end_s = self.now
        return self.log

    def _arrive(self, s: ReqState, sent_s: float) -> None:
        """`s` reaches the scheduler at this step boundary; its wait counts from when the client sent it."""
        self._num_in_flight += 1
        s.phase = Phase.WAITING
        s.arrival_t = sent_s
        self.waiting[s.rid] = s
        self._charge(lambda: self.policy.on_arrival(s.rid))

    def _step(self) -> bool:
        cpu = self.pending_cpu
        self.pending_cpu = 0.0
        if not self.running:
            self.batch_is_full = False
        if self.chunked is not None:
            self._publish(self.chunked)
        ran_policy = False
        budget = None
        if self.chunked is not None or (self.waiting and not self.batch_is_full):
            budget = self._open_pass()
            if self.waiting and not self.batch_is_full and budget.slots_left() > 0:
                spent = self.cpu.run(lambda: self.policy.schedule(budget), lambda: budget.engine_s)
                self.batch_is_full = self.batch_is_full or budget.batch_full
                if budget.chunked is not None:
                    self.chunked = budget.chunked
                cpu += spent
                ran_policy = True
                self.log.num_policy_passes += 1
                self.log.policy_cpu_s += spent
                if budget.admitted:
                    self._charge(lambda: self.policy.on_admitted([s.rid for s, _ in budget.admitted]))
            elif self.waiting:
                self.batch_is_full = True
        self._publish_completed()
        if budget is not None and budget.items:
            gpu, kind, size, groups, tokens = self._prefill(budget), StepKind.PREFILL, len(budget.items), 0, 0
            bound, locked = gpu, 0
        elif self.running:
            (gpu, bound), size = self._decode(), len(self.running)
            groups = len({s.group for s in self.running})
            kind, tokens = StepKind.DECODE, size
            locked = self.pool.cache.num_tokens - self.pool.cache.num_evictable
        else:
            self.pending_cpu += cpu
            if not self.waiting:
                self.token_ratio.reset()  # SGLang's on_idle
            return False
        step = max(gpu, cpu) if self.config.overlap_schedule else gpu + cpu
        self.log.steps.append(
            StepRecord(kind, self.now, gpu, cpu, size, groups, tokens, ran_policy, bound, locked)
        )
        self.now += step
        self._finish_step(kind)
        if not self.config.overlap_schedule:
            self._publish_completed()
        self._charge(lambda: self.policy.on_step(tokens, step))
        return True

    def _open_pass(self) -> PassBudget:
        return PassBudget.open(
            self._limits,
            self.pool,
            self.waiting,
            self.running,
            self.chunked,
            self.token_ratio.current,
            self.log,
            self.now,
        )

    def _prefill(self, budget: PassBudget) -> float:
        gpu = self.cost.prefill_s([n for _, n in budget.items], [s.num_filled for s, _ in budget.items])
        merged = False
        for s, n in budget.items:
            s.num_filled += n
            if s.num_filled == s.fill_len:
                self._complete_prefill(s)
                merged = True
        if merged:
            self.running = self._order(self.running)
        return gpu

    def _complete_prefill(self, s: ReqState) -> None:
        if self.chunked is s:
            self.chunked = None
        s.phase = Phase.RUNNING
        s.num_out += 1
        self.running.append(s)
        self._unpublished.append(s)
        self._split = None

    def _publish_completed(self) -> None:
        for s in self._unpublished:
            self._publish(s)
        self._unpublished.clear()

    def _publish(self, s: ReqState) -> None:
        """Move the fully computed prompt blocks of `s` from its private KV into the prefix cache and lock
        them for `s` (SGLang's `checkpoint`: duplicates of blocks another request cached first are freed)."""
        k = bisect.bisect_right(s.ends, s.num_filled)
        if k <= len(s.locked):
            return
        locked_tokens = s.ends[len(s.locked) - 1] if s.locked else 0
        self.pool.release(s, s.ends[k - 1] - locked_tokens)
        self.pool.insert(s.hashes[:k], s.ends[:k], s.tokens)
        self.pool.cache.lock(s.hashes[:k])
        self.pool.cache.unlock(s.locked)
        s.locked = list(s.hashes[:k])

    def _decode(self) -> tuple[float, float]:
        """The decode step's GPU time, and its time with perfect sharing (each shared node read once)."""
        retracted = False
        while not self.pool.fits(len(self.running)) and len(self.running) > 1:
            self._retract_one()
            retracted = True
        if retracted:
            self.token_ratio.after_retract(self.running)
        else:
            self.token_ratio.decay_step()
        self.pool.alloc_decode(self.running)
        if self._split is None:
            nodes = [s.cost_nodes() for s in self.running]
            self._split = self._attention.shared_split(self.cost, nodes)
            self._distinct_shared = distinct_shared_tokens(nodes)
        private = sum(s.private_kv_tokens() for s in self.running)
        kv = self._split.plus_dram(private)
        once = KVSplit(self._distinct_shared + private, 0)
        for s in self.running:
            s.num_out += 1
        batch = len(self.running)
        return self.cost.decode_s(batch, kv), self.cost.decode_s(batch, once)

    def _retract_one(self) -> None:
        order = sorted(self.running, key=lambda r: (r.num_out, -r.prompt_len), reverse=True)
        s = order[-1]
        self.running.remove(s)
        self._split = None
        self.pool.release(s, s.num_private)
        self.pool.cache.unlock(s.locked)
        s.locked = []
        s.phase = Phase.WAITING
        self.waiting[s.rid] = s
        self.batch_is_full = False
        self.log.num_retractions += 1
        self._charge(lambda: self.policy.on_retract(s.rid, s.num_out))

    def _finish_step(self, kind: StepKind) -> None:
        end = self.now
        for s in self.running:
            if s.first_token_t is None:
                s.first_token_t = end
        done = [s for s in self.running if s.num_out >= s.spec.output_len]
        if not done:
            return
        self.running = [s for s in self.running if s.num_out < s.spec.output_len]
        self._split = None
        self.batch_is_full = False
        for s in done:
            self._finish(s, end)

    def _finish(self, s: ReqState, end: float) -> None:
        if s in self._unpublished:
            self._unpublished.remove(s)
        if self._num_in_flight == self.config.max_concurrency:
            self._slot_free_s = end
        self._num_in_flight -= 1
        out = output_tokens(self.src, s)[: s.num_out]
        full = np.concatenate([s.tokens, out])
        bs = self.config.block_size
        self.pool.release(s, s.num_private)
        self.pool.insert_best_effort(chunk_hashes(full, bs), block_ends(len(full), bs), full)
        self.pool.cache.unlock(s.locked)
        s.locked = []
        s.phase = Phase.DONE
        s.finish_t = end
        self._num_done += 1
        self.log.requests.append(
            RequestRecord(
                s.rid,
                s.group,
                *s.served_times(),
                end,
                s.prompt_len,
                s.num_out,
                s.num_prefills,
            )
        )
        self._charge(lambda: self.policy.on_finish(s.rid))
        for child in self._followers.pop(s.rid, ()):
            heapq.heappush(self._arrivals, (end + child.spec.delay_s, len(self._arrivals), child.rid))
        if self.progress is not None:
            self.progress(1)
