"""One simulation: build the request states, prefix cache, KV pool and policy, run the engine, summarise."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.budget import KVPool
from sglang_feather.sim.cost import CostModel
from sglang_feather.sim.cpu import CpuTimer, MeasuredCpu
from sglang_feather.sim.engine import Engine, EngineConfig, EngineSetup, SimClock
from sglang_feather.sim.interface import PolicySetup, SimPolicy
from sglang_feather.sim.metrics import RunLog
from sglang_feather.sim.policies import make_policy
from sglang_feather.sim.prefix_cache import PrefixCache
from sglang_feather.sim.requests import build_states
from sglang_feather.sim.trace import SimRequest, TokenSource

DEFAULT_ENGINE = EngineConfig()
MEASURED_CPU = MeasuredCpu()


@dataclass(frozen=True)
class RunSpec:
    """A policy and, for `feather`, its admission options (production's defaults unless given)."""

    policy: str
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)

    def to_dict(self) -> dict[str, Any]:
        values = ((f.name, getattr(self.admission, f.name)) for f in fields(self.admission))
        admission = {name: dict(v) if isinstance(v, Mapping) else v for name, v in values}
        return {"policy": self.policy, "admission": admission}


def simulate(
    requests: Sequence[SimRequest],
    cost: CostModel,
    spec: RunSpec,
    config: EngineConfig = DEFAULT_ENGINE,
    cpu: CpuTimer = MEASURED_CPU,
    progress: Callable[[int], None] | None = None,
    wrap: Callable[[SimPolicy], SimPolicy] | None = None,
) -> RunLog:
    """Run `requests` under `spec`'s policy; `wrap`, if given, wraps the built policy before the engine gets
    it (an experiment's instrumentation, e.g. `sim.phase_shift`'s stopper that changes at phase starts)."""
    src = TokenSource()
    states = build_states(requests, src, config.block_size)
    capacity = config.kv_capacity_tokens or cost.kv_capacity_tokens(config.mem_fraction_static)
    cache = PrefixCache(capacity)
    pool = KVPool(capacity, cache)
    clock = SimClock()
    admission = replace(spec.admission, page_size=config.block_size)
    setup = PolicySetup(cache=cache, clock=clock, admission=admission)
    policy = make_policy(spec.policy, setup)
    if wrap is not None:
        policy = wrap(policy)
    engine = Engine(states, policy, pool, EngineSetup(cost, config, cpu, src, clock, progress))
    log = engine.run()
    log.max_cache_tokens = pool.max_used
    log.tree_cache = getattr(policy, "tree_cache", None)
    stats = getattr(getattr(policy, "admission", None), "stats", None)
    log.admission = asdict(stats) if stats is not None else None
    return log
