"""Shared builders for the simulator tests: small traces, the H200 cost model, runs with fixed CPU charging."""

from __future__ import annotations

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.profile import load_profile
from sglang_feather.sim.run import DEFAULT_ENGINE, RunSpec, simulate
from sglang_feather.sim.trace import SimRequest
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import Segment, SharedPrefixSpec

ALL_POLICIES = ("fcfs", "lpm", "dfs-weight", "feather")


def h200_cost() -> PhysicsCostModel:
    return PhysicsCostModel(load_profile("h200", "llama-3-8b"))


def small_gsp(seed: int = 0, num_groups: int = 3, prompts_per_group: int = 6, **knobs) -> list[SimRequest]:
    knobs = {"prefix_len": 300, "question_len": 20, "output_len": 12, **knobs}
    spec = SharedPrefixSpec.per_group(num_groups, prompts_per_group, seed=seed, **knobs)
    return make_workload("gsp", WorkloadConfig(spec))


def run(requests, cost, policy: str, config: EngineConfig = DEFAULT_ENGINE, cpu_s: float = 0.0, **admission):
    """Simulate with CPU charged as `cpu_s` per call; `admission` are `AdmissionConfig` fields for feather."""
    return simulate(requests, cost, RunSpec(policy, AdmissionConfig(**admission)), config, FixedCpu(cpu_s))


def request(rid: str, prompt: list[tuple[str, int]], output_len: int, arrival_s: float = 0.0) -> SimRequest:
    return SimRequest(rid, arrival_s, output_len, tuple(Segment(k, n) for k, n in prompt))


class ProbePolicy:
    """FCFS that records, at every pass, how many prompt tokens the prefix cache holds for each waiting
    request (what a cache-aware policy would see)."""

    name = "probe"

    def __init__(self, name: str, setup) -> None:
        self.queue: list[str] = []
        self.seen: list[dict[str, int]] = []

    def prepare(self, rid, tokens, max_new_tokens) -> None:
        return None

    def on_arrival(self, rid: str) -> None:
        self.queue.append(rid)

    def schedule(self, ctx) -> None:
        self.seen.append({rid: ctx.num_cached_tokens(rid) for rid in self.queue})
        for rid in list(self.queue):
            if not ctx.try_admit(rid):
                break
            self.queue.remove(rid)

    def on_admitted(self, rids) -> None:
        return None

    def on_finish(self, rid: str) -> None:
        return None

    def on_retract(self, rid: str, num_out: int) -> None:
        self.queue.append(rid)

    def on_step(self, num_tokens: int, elapsed_s: float) -> None:
        return None


PROBES: list[ProbePolicy] = []


def make_probe(name: str, setup) -> ProbePolicy:
    probe = ProbePolicy(name, setup)
    PROBES.append(probe)
    return probe
