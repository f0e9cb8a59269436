"""`bench vllm-admission`: the metrics on hand-made runs, the policies (a window is never silently FCFS), the CLI."""

import json
from dataclasses import replace

import pytest
import vllm
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_harness import Driver, EngineShape, make_scheduler, prompt, require_model

from sglang_feather.bench import vllm_workloads
from sglang_feather.bench.__main__ import main as bench_main
from sglang_feather.bench.vllm_workloads import WORKLOADS, KvLimitedWorkload
from sglang_feather.offline import vllm_admission
from sglang_feather.offline.vllm_admission import POLICIES, PolicyUnavailable, build
from sglang_feather.offline.vllm_metrics import RunMeter
from sglang_feather.sim.workloads import WorkloadConfig
from sglang_feather.workload import SharedPrefixSpec

HAS_WINDOW = not vllm.__version__.startswith(("0.32.", "0.33."))
"""vLLM 0.34 added SchedulerConfig.cache_aware_admission_window."""


def metered(shape: EngineShape) -> tuple[Driver, RunMeter]:
    driver = Driver(make_scheduler(Scheduler, shape), block_size=shape.block_size)
    meter = RunMeter(driver.scheduler, shape.block_size)
    driver.on_scheduled = meter.on_scheduled
    return driver, meter


def add(driver: Driver, meter: RunMeter, request_id: str, tokens: list[int], max_tokens: int = 2) -> None:
    driver.add(request_id, tokens, max_tokens=max_tokens)
    meter.on_arrival(request_id)


def step_all(driver: Driver, meter: RunMeter) -> None:
    while driver.busy():
        driver.step()
        meter.step += 1


def test_a_cached_prefix_is_a_hit_and_nothing_is_recomputed():
    driver, meter = metered(EngineShape(num_blocks=64))
    add(driver, meter, "a", prompt(0, 4, 0, 8))
    step_all(driver, meter)
    add(driver, meter, "b", prompt(0, 4, 1, 8))
    step_all(driver, meter)
    result = meter.result("vllm-fcfs", "hand-made", 0, driver.cpu_ns)
    assert result.num_hit_tokens == 4 * 16, "b found a's 4 prefix blocks"
    assert result.num_queried_tokens == 2 * (4 * 16 + 8)
    assert result.num_recomputed_tokens == 0
    assert result.num_computed_block_tokens == 4 * 16, "a's prefix; 8-token tails and 2 outputs fill no block"
    assert result.num_steps == len(driver.cpu_ns) == 4 and all(ns > 0 for ns in driver.cpu_ns)
    assert (result.max_wait_steps, result.mean_wait_steps) == (0, 0.0)


def test_an_evicted_prefix_computed_again_counts_as_recomputed():
    """A 10-block pool: c's unrelated prompt takes every free block, so b recomputes a's 4 prefix blocks."""
    driver, meter = metered(EngineShape(num_blocks=10))
    add(driver, meter, "a", prompt(0, 4, 0, 8))
    step_all(driver, meter)
    add(driver, meter, "c", prompt(1, 8, 2, 8))
    step_all(driver, meter)
    add(driver, meter, "b", prompt(0, 4, 1, 8))
    step_all(driver, meter)
    result = meter.result("vllm-fcfs", "hand-made", 0, driver.cpu_ns)
    assert result.num_hit_tokens == 0
    assert result.num_recomputed_tokens == 4 * 16


def test_a_request_queued_behind_a_full_batch_waits_in_steps():
    driver, meter = metered(EngineShape(max_num_seqs=1))
    add(driver, meter, "a", prompt(0, 1, 0, 4), max_tokens=3)
    add(driver, meter, "b", prompt(1, 1, 0, 4), max_tokens=3)
    step_all(driver, meter)
    result = meter.result("vllm-fcfs", "hand-made", 0, driver.cpu_ns)
    assert result.max_wait_steps == 3, "a runs 3 steps (prefill with its first token, 2 decodes), then b"
    assert result.mean_wait_steps == 1.5


@pytest.mark.parametrize("policy", ["vllm-window16", "vllm-window-all"])
def test_a_window_policy_runs_the_window_or_is_refused_naming_it(policy):
    if HAS_WINDOW:
        driver = build(policy, EngineShape(), require_model(), num_requests=40)
        assert type(driver.scheduler) is Scheduler
        assert driver.scheduler.cache_aware_window == (16 if policy == "vllm-window16" else 40)
        assert driver.scheduler.cache_aware_threshold == 0.5
    else:
        with pytest.raises(PolicyUnavailable, match=r"cache_aware_admission_window.*vLLM 0\.34"):
            build(policy, EngineShape(), require_model(), num_requests=40)


TINY = {
    "rag": replace(
        WORKLOADS["rag"],
        config=replace(WORKLOADS["rag"].config, num_docs=6).with_spec(num_requests=30),
        engine=replace(WORKLOADS["rag"].engine, num_blocks=160),
    ),
    "groups": replace(
        WORKLOADS["groups"], config=WORKLOADS["groups"].config.with_spec(num_groups=4, num_requests=30)
    ),
    "chat": KvLimitedWorkload(
        "6 conversations x 3 turns",
        "chat",
        WorkloadConfig(
            spec=SharedPrefixSpec(
                num_groups=1,
                num_requests=6,
                num_turns=3,
                prefix_len=64,
                question_len=40,
                output_len=20,
                rate=4.0,
            ),
            think_s=0.2,
        ),
        replace(WORKLOADS["chat"].engine, num_blocks=48),
    ),
}
"""Small versions of the three workloads (seconds, not minutes)."""


@pytest.mark.parametrize("workload", sorted(TINY))
def test_every_policy_finishes_every_request_of_each_workload(workload):
    tiny = TINY[workload]
    requests = tiny.requests(0)
    policies = [name for name in POLICIES if HAS_WINDOW or not POLICIES[name].window]
    results = {
        name: vllm_admission.run(name, tiny.replay(0), tiny.engine, require_model()) for name in policies
    }
    for name, result in results.items():
        assert result.num_requests == len(requests), name
        assert 0 < result.hit_rate < 1, name
        assert result.num_recomputed_tokens <= result.num_computed_block_tokens, name
        assert result.max_wait_steps >= result.mean_wait_steps >= 0, name
    if workload == "chat":  # a turn's prompt holds the previous turn's answer, which the fake model sampled
        assert (
            results["vllm-fcfs"].num_hit_tokens >= sum(r.prompt_len - 40 for r in requests if r.follows) // 2
        )


def test_a_chat_turn_arrives_after_the_previous_one_finished(monkeypatch):
    seen = {}
    original = RunMeter.on_arrival

    def on_arrival(self, request_id):
        seen[request_id] = (self.step, set(self.first_scheduled))
        original(self, request_id)

    monkeypatch.setattr(RunMeter, "on_arrival", on_arrival)
    tiny = TINY["chat"]
    vllm_admission.run("feather", tiny.replay(0), tiny.engine, require_model())
    for request in tiny.requests(0):
        if request.follows is not None:
            assert request.follows in seen[request.rid][1], f"{request.rid} came before {request.follows} ran"
            assert seen[request.rid][0] >= seen[request.follows][0] + 4, "0.2 s of think time = 4 steps"


def test_the_cli_writes_the_table_and_the_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(vllm_workloads.WORKLOADS, "chat", TINY["chat"])
    out = tmp_path / "admission.json"
    argv = ["vllm-admission", "--model", str(require_model()), "--policies", "vllm-fcfs,feather"]
    argv += ["--workloads", "chat", "--seeds", "0,1", "--cpu-waiting", "8", "--cpu-repeats", "1"]
    assert bench_main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["policy"], r["seed"]) for r in result["runs"]] == [
        ("vllm-fcfs", 0),
        ("feather", 0),
        ("vllm-fcfs", 1),
        ("feather", 1),
    ]
    assert [(s["policy"], s["num_seeds"]) for s in result["summary"]] == [("vllm-fcfs", 2), ("feather", 2)]
    assert [(c["policy"], c["num_waiting"]) for c in result["cpu"]] == [("vllm-fcfs", 8), ("feather", 8)]
    assert result["meta"]["versions"]["vllm"] == vllm.__version__
    text = capsys.readouterr().out
    assert "| chat | feather |" in text and "| 8 | feather |" in text


def test_the_cli_refuses_an_unknown_policy_naming_the_known_ones():
    with pytest.raises(SystemExit, match="unknown policy vllm-lpm; choose from vllm-fcfs, vllm-window16"):
        bench_main(["vllm-admission", "--policies", "vllm-lpm", "--cpu-waiting", ""])


def test_the_cli_checks_every_policy_before_it_runs_any(monkeypatch):
    """On vLLM 0.32/0.33 the default policies include the windows: refused before a single run, naming the
    field; on 0.34 every default policy runs."""
    monkeypatch.setitem(vllm_workloads.WORKLOADS, "chat", TINY["chat"])
    ran = []
    original = vllm_admission.run

    def recording(policy, *args, **kwargs):
        ran.append(policy)
        return original(policy, *args, **kwargs)

    monkeypatch.setattr(vllm_admission, "run", recording)
    argv = ["vllm-admission", "--model", str(require_model()), "--workloads", "chat", "--seeds", "0"]
    argv += ["--cpu-waiting", ""]
    if HAS_WINDOW:
        assert bench_main(argv) == 0
        assert ran == list(POLICIES)
    else:
        with pytest.raises(PolicyUnavailable, match="cache_aware_admission_window"):
            bench_main(argv)
        assert ran == []
