"""N simulated SGLang instances behind the SMG cache_aware router model, in one simulated time."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sglang_feather.sim.budget import KVPool
from sglang_feather.sim.cost import CostModel
from sglang_feather.sim.cpu import CpuTimer, FixedCpu
from sglang_feather.sim.engine import Engine, EngineConfig, EngineSetup, SimClock
from sglang_feather.sim.interface import PolicySetup
from sglang_feather.sim.metrics import RunLog
from sglang_feather.sim.policies import make_policy
from sglang_feather.sim.prefix_cache import PrefixCache
from sglang_feather.sim.requests import ReqState, build_states
from sglang_feather.sim.router import CacheAwareRouter, InstanceLoad, RouterConfig
from sglang_feather.sim.run import RunSpec
from sglang_feather.sim.trace import SimRequest, TokenSource, TraceError

# How it works. Every instance is the single-GPU engine (`engine.py`) with its own clock, prefix cache, KV pool
# and policy. The cluster advances whichever comes first: the next request the client may send (arrival time,
# held back by a client-wide --max-concurrency as bench_serving does), which the router places using the
# instances' state at that moment, or the step of the instance whose clock is earliest. An instance's step
# spans [now, now + step), so a request routed at t sees an instance that may already have simulated a little
# past t: the router reads finishes up to one step early. Chat traces (requests that follow others) are
# refused: their turns would have to reach the router again.


DEFAULT_ENGINE = EngineConfig()
NO_CPU = FixedCpu(0.0)
"""Load-independent runs: no scheduler CPU charged (`--fixed-cpu-ms 0`)."""


class Instance(Engine):
    """One engine that receives its requests from the router instead of owning a trace."""

    def dispatch(self, s: ReqState, sent_s: float) -> None:
        if s.prompt_len + s.spec.max_new >= self.pool.capacity:
            raise TraceError(f"request {s.rid!r} does not fit one instance's KV pool ({self.pool.capacity})")
        if not self.busy:
            self.now = max(self.now, sent_s)
        self.states.append(s)
        self.by_rid[s.rid] = s
        self.policy.prepare(s.rid, s.tokens, s.spec.max_new)
        heapq.heappush(self._arrivals, (sent_s, len(self.states), s.rid))

    @property
    def busy(self) -> bool:
        return bool(self._arrivals or self.waiting or self.running or self.chunked is not None)

    def advance(self) -> None:
        """One scheduler pass and forward step, or a jump to the next dispatched arrival."""
        while self._arrivals and self._arrivals[0][0] <= self.now:
            due, _, rid = heapq.heappop(self._arrivals)
            self._arrive(self.by_rid[rid], due)
        if not self._step():
            if not self._arrivals:
                raise RuntimeError("instance stalled with requests it cannot run")
            self.now = max(self.now, self._arrivals[0][0])

    def report(self) -> InstanceLoad:
        """What SGLang's load report says now (in-flight left to the router)."""
        pending = [*self.waiting.values(), *(self.by_rid[rid] for _, _, rid in self._arrivals)]
        cache = self.pool.cache
        uncached = sum(s.prompt_len - _cached_tokens(cache, s) for s in pending)
        pool = self.pool
        held = pool.capacity - pool.free - cache.num_evictable
        return InstanceLoad(0, len(pending), uncached, held / pool.capacity)


def _cached_tokens(cache: PrefixCache, s: ReqState) -> int:
    k = cache.match(s.hashes)
    return s.ends[k - 1] if k else 0


class LoadReports:
    """The instances' load reports as SMG holds them: read every `poll_s`, with the prompt tokens dispatched
    since credited to their instance, and SMG's own in-flight counts."""

    def __init__(self, instances: Sequence[Instance], poll_s: float) -> None:
        self.instances, self.poll_s = instances, poll_s
        self.read_at = -float("inf")
        self.last: list[InstanceLoad] = []
        self.credits = [0] * len(instances)

    def loads(self, now: float, in_flight: Sequence[int]) -> list[InstanceLoad]:
        if now - self.read_at >= self.poll_s:
            self.read_at = now
            self.last = [inst.report() for inst in self.instances]
            self.credits = [0] * len(self.instances)
        return [
            replace(load, in_flight=n, waiting_tokens=load.waiting_tokens + credit)
            for load, n, credit in zip(self.last, in_flight, self.credits, strict=True)
        ]

    def credit(self, instance: int, num_tokens: int) -> None:
        self.credits[instance] += num_tokens


@dataclass(frozen=True)
class ClusterConfig:
    num_instances: int = 8
    router: RouterConfig = RouterConfig()


@dataclass
class ClusterLog:
    instances: list[RunLog]
    placement: dict[str, int]
    """Request id -> instance."""
    groups: dict[str, str]
    """Request id -> its prefix group."""
    branches: dict[str, int]
    end_s: float

    @property
    def split_groups(self) -> int:
        workers: dict[str, set[int]] = {}
        for rid, where in self.placement.items():
            workers.setdefault(self.groups[rid], set()).add(where)
        return sum(len(w) > 1 for w in workers.values())

    @property
    def num_groups(self) -> int:
        return len(set(self.groups.values()))


def make_instance(
    cost: CostModel, spec: RunSpec, config: EngineConfig, cpu: CpuTimer, src: TokenSource
) -> Instance:
    capacity = config.kv_capacity_tokens or cost.kv_capacity_tokens(config.mem_fraction_static)
    cache = PrefixCache(capacity)
    pool = KVPool(capacity, cache)
    clock = SimClock()
    setup = PolicySetup(
        cache=cache, clock=clock, admission=replace(spec.admission, page_size=config.block_size)
    )
    policy = make_policy(spec.policy, setup)
    return Instance(
        [], policy, pool, EngineSetup(cost, replace(config, max_concurrency=None), cpu, src, clock)
    )


def simulate_cluster(
    requests: Sequence[SimRequest],
    cost: CostModel,
    spec: RunSpec,
    cluster: ClusterConfig,
    config: EngineConfig = DEFAULT_ENGINE,
    cpu: CpuTimer = NO_CPU,
) -> ClusterLog:
    if any(r.follows is not None for r in requests):
        raise TraceError("the cluster model routes independent requests only (no chat turns)")
    if config.warm_cache:
        raise TraceError("the cluster model starts cold (--warm-cache is per instance)")
    src = TokenSource()
    states = build_states(requests, src, config.block_size)
    instances = [make_instance(cost, spec, config, cpu, src) for _ in range(cluster.num_instances)]
    router = CacheAwareRouter(cluster.num_instances, cluster.router)
    pending = sorted(states, key=lambda s: s.spec.arrival_s, reverse=True)
    in_flight = [0] * cluster.num_instances
    # The client's --max-concurrency as a semaphore: a send takes the earliest freed slot (time it freed).
    limit = config.max_concurrency
    slots = [0.0] * (limit if limit is not None else len(states))
    last_send, placement = 0.0, {}
    reports = LoadReports(instances, cluster.router.load_poll_s)
    while pending or any(inst.busy for inst in instances):
        busy = [i for i, inst in enumerate(instances) if inst.busy]
        next_step = min((instances[i].now for i in busy), default=float("inf"))
        send_at = max(pending[-1].spec.arrival_s, slots[0], last_send) if pending and slots else float("inf")
        if send_at == next_step == float("inf"):
            raise RuntimeError("cluster stalled")
        if send_at <= next_step:
            heapq.heappop(slots)
            s = pending.pop()
            where = router.route(s.hashes, s.ends, s.prompt_len, reports.loads(send_at, in_flight))
            reports.credit(where, s.prompt_len)
            instances[where].dispatch(s, send_at)
            in_flight[where] += 1
            placement[s.rid] = where
            last_send = send_at
            continue
        i = min(busy, key=lambda j: instances[j].now)
        done_before = len(instances[i].log.requests)
        instances[i].advance()
        for record in instances[i].log.requests[done_before:]:
            in_flight[i] -= 1
            if limit is not None:
                heapq.heappush(slots, record.finish_s)
    logs = []
    for inst in instances:
        inst.log.end_s = inst.now
        logs.append(inst.log)
    return ClusterLog(
        logs,
        placement,
        {s.rid: s.group for s in states},
        dict(router.branches),
        max((log.end_s for log in logs), default=0.0),
    )
