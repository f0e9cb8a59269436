"""Shared builders for the simulator tests: small traces, the H200 cost model, runs with fixed CPU charging."""

from __future__ import annotations

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.profile import load_profile
from sglang_feather.sim.run import DEFAULT_ENGINE, RunSpec, simulate
from sglang_feather.sim.trace import Segment, SimRequest
from sglang_feather.sim.workloads import WorkloadConfig, make_workload

ALL_POLICIES = ("fcfs", "lpm", "dfs-weight", "feather")


def h200_cost() -> PhysicsCostModel:
    return PhysicsCostModel(load_profile("h200", "llama-3-8b"))


def small_gsp(seed: int = 0, **kw) -> list[SimRequest]:
    base = dict(seed=seed, num_groups=3, prompts_per_group=6, prefix_len=300, question_len=20, output_len=12)
    base.update(kw)
    return make_workload("gsp", WorkloadConfig(**base))


def run(requests, cost, policy: str, config: EngineConfig = DEFAULT_ENGINE, cpu_s: float = 0.0, **admission):
    """Simulate with CPU charged as `cpu_s` per call; `admission` are `AdmissionConfig` fields for feather."""
    return simulate(requests, cost, RunSpec(policy, AdmissionConfig(**admission)), config, FixedCpu(cpu_s))


def request(rid: str, prompt: list[tuple[str, int]], output_len: int, arrival_s: float = 0.0) -> SimRequest:
    return SimRequest(rid, arrival_s, output_len, tuple(Segment(k, n) for k, n in prompt))
