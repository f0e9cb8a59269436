"""The perfect-sharing bound beside every run, and what the engine tells Feather's stopper about KV room."""

from sim_helpers import h200_cost, request, run, small_gsp

from sglang_feather.policy import Decision, Observation
from sglang_feather.policy.base import PolicyBase
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.report import summarize


def test_the_bound_is_never_slower_than_the_schedule_and_equals_it_without_sharing():
    cost = h200_cost()
    shared = summarize("feather", run(small_gsp(num_groups=3, prompts_per_group=8), cost, "feather"))
    assert shared.bound_tok_s > shared.output_tok_s, "three groups share prefixes a cascade reads once"
    assert 0 < shared.pct_of_bound < 1
    unrelated = [request(f"r{i}", [(f"p{i}", 600)], 20) for i in range(12)]
    alone = summarize("fcfs", run(unrelated, cost, "feather"))
    assert alone.bound_tok_s == alone.output_tok_s and alone.pct_of_bound == 1.0


def test_every_decode_step_records_a_bound_no_slower_than_itself():
    log = run(small_gsp(num_groups=2, prompts_per_group=10), h200_cost(), "feather")
    assert all(0 < s.bound_gpu_s <= s.gpu_s for s in log.steps)
    assert any(s.bound_gpu_s < s.gpu_s for s in log.steps)


class Recorder(PolicyBase):
    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Observation] = []

    def decide(self, obs: Observation) -> Decision:
        self.seen.append(obs)
        return Decision.ADD


def test_the_stopper_sees_the_pools_headroom_shrink_as_the_pass_admits(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr("sglang_feather.admission.component.make_policy", lambda *a, **k: recorder)
    requests = small_gsp(num_groups=4, prompts_per_group=5)
    run(requests, h200_cost(), "feather", EngineConfig(kv_capacity_tokens=60_000))
    rooms = [o.kv_free_fraction for o in recorder.seen]
    assert rooms and all(r is not None and 0 <= r <= 1 for r in rooms)
    first_pass = [o.kv_free_fraction for o in recorder.seen if o.num_groups_running == 0 or o.batch_size < 4]
    assert first_pass == sorted(first_pass, reverse=True), (
        "each admission takes room from the rest of the pass"
    )
    assert any(o.adds_group and o.batch_size > 0 for o in recorder.seen)
