"""SGLang's PrefillAdder budgets as the engine applies them, driven by a minimal in-order policy."""

from __future__ import annotations

from sim_helpers import request, run

from sglang_feather.sim.budget import KVPool
from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.engine import Engine, EngineConfig, EngineSetup
from sglang_feather.sim.metrics import StepKind
from sglang_feather.sim.prefix_cache import PrefixCache
from sglang_feather.sim.requests import build_states
from sglang_feather.sim.trace import TokenSource


class InOrder:
    """Admits waiting requests in arrival order and records what each pass saw."""

    name = "in-order"

    def __init__(self):
        self.queue, self.seen = [], []

    def prepare(self, rid, tokens, max_new_tokens):
        return None

    def on_arrival(self, rid):
        self.queue.append(rid)

    def schedule(self, ctx):
        self.seen.append(ctx.num_running)
        for rid in list(self.queue):
            if not ctx.try_admit(rid):
                break
            self.queue.remove(rid)

    def on_admitted(self, rids):
        return None

    def on_finish(self, rid):
        return None

    def on_retract(self, rid, num_out):
        self.queue.append(rid)

    def on_step(self, num_tokens, elapsed_s):
        return None


def _run(requests, cost, config):
    src = TokenSource()
    cache = PrefixCache(config.kv_capacity_tokens)
    policy = InOrder()
    setup = EngineSetup(cost, config, FixedCpu(0.0), src)
    eng = Engine(build_states(requests, src, 16), policy, KVPool(config.kv_capacity_tokens, cache), setup)
    return eng.run(), policy


def test_a_chunked_prefill_in_progress_counts_as_in_the_batch(cost):
    reqs = [request("long", [("a", 1000)], 4), request("b", [("b", 50)], 4, arrival_s=1e-9)]
    log, policy = _run(reqs, cost, EngineConfig(kv_capacity_tokens=10_000, chunked_prefill_size=256))
    prefills = [s for s in log.steps if s.kind is StepKind.PREFILL]
    assert len(prefills) >= 4
    assert policy.seen[1] == 1


def test_kv_budget_stops_the_pass_at_the_first_request_that_does_not_fit(cost):
    reqs = [
        request("a", [("a", 300)], 100),
        request("big", [("big", 500)], 100),
        request("c", [("c", 10)], 4),
    ]
    log, _ = _run(reqs, cost, EngineConfig(kv_capacity_tokens=1000))
    admitted = {r.rid: r.admit_s for r in log.requests}
    assert admitted["a"] == 0.0
    assert admitted["big"] > 0.0 and admitted["c"] >= admitted["big"]


def test_request_slots_cap_the_batch(cost):
    reqs = [request(f"r{i}", [(f"p{i}", 40)], 6) for i in range(10)]
    log = run(reqs, cost, "feather", EngineConfig(max_running_requests=3), stopper="always")
    assert max(s.batch_size for s in log.steps if s.kind is StepKind.DECODE) == 3
    assert len(log.requests) == 10
