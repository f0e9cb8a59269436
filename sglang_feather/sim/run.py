"""One simulation: build the request states, prefix cache, KV pool and policy, run the engine, summarise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_feather.cht import DEFAULT_CHUNK_SIZE
from sglang_feather.policy import DEFAULT_MAX_WAIT_S
from sglang_feather.sim.budget import KVPool
from sglang_feather.sim.cost import CostModel
from sglang_feather.sim.cpu import CpuTimer, MeasuredCpu
from sglang_feather.sim.engine import Engine, EngineConfig, EngineSetup, SimClock
from sglang_feather.sim.metrics import RunLog
from sglang_feather.sim.policies import PolicySetup, make_policy
from sglang_feather.sim.prefix_cache import PrefixCache
from sglang_feather.sim.requests import build_states
from sglang_feather.sim.trace import SimRequest, TokenSource

DEFAULT_ENGINE = EngineConfig()
MEASURED_CPU = MeasuredCpu()


@dataclass(frozen=True)
class RunSpec:
    """A policy and its options; `stopper*` and `chunk_size` only matter to `feather`."""

    policy: str
    stopper: str = "static"
    stopper_options: dict[str, Any] = field(default_factory=dict)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_wait_s: float | None = DEFAULT_MAX_WAIT_S
    seed: int = 0


def simulate(
    requests: Sequence[SimRequest],
    cost: CostModel,
    spec: RunSpec,
    config: EngineConfig = DEFAULT_ENGINE,
    cpu: CpuTimer = MEASURED_CPU,
    progress: Callable[[int], None] | None = None,
) -> RunLog:
    src = TokenSource()
    states = build_states(requests, src, config.block_size)
    capacity = config.kv_capacity_tokens or cost.kv_capacity_tokens(config.mem_fraction_static)
    cache = PrefixCache(capacity)
    pool = KVPool(capacity, cache)
    clock = SimClock()
    setup = PolicySetup(
        cache=cache,
        clock=clock,
        stopper=spec.stopper,
        stopper_options=dict(spec.stopper_options),
        chunk_size=spec.chunk_size,
        max_wait_s=spec.max_wait_s,
        seed=spec.seed,
    )
    policy = make_policy(spec.policy, setup)
    engine = Engine(states, policy, pool, EngineSetup(cost, config, cpu, src, clock, progress))
    log = engine.run()
    log.max_cache_tokens = pool.max_used
    return log
