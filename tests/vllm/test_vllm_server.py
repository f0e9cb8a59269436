"""End to end: vLLM's OpenAI server on the tiny model, default scheduler vs FeatherScheduler (CPU)."""

import json
import re
from pathlib import Path

import pytest
from vllm_harness import require_model

from sglang_feather.admission import DEFAULT_STOPPER
from sglang_feather.serving.server import FEATHER_SCHEDULER, Server, vllm_feather_args
from sglang_feather.serving.vllm_compare import HEADER, Measurement, measure, vllm_spec
from sglang_feather.workload import SharedPrefixSpec

pytestmark = [pytest.mark.vllm, pytest.mark.server]

WORKLOAD = SharedPrefixSpec.per_group(
    8, 25, prefix_len=128, question_len=16, output_len=16, order="interleaved"
)
CONCURRENCY = 200
"""Every request in flight at once; with --max-num-seqs 32 the waiting queue is what the schedulers order."""
FLOAT32 = ("--dtype", "float32")
"""Scheduling must not change a greedy output, but in bfloat16 any change of batch shape moves the hidden states
by last bits, and on this random tiny model the top-2 logits often tie within a bfloat16 step: a CI run flipped
1 of 200 outputs between the two schedulers (request 53). In float32 a flip needs a tie 65,536 times closer, so
a mismatch left is the scheduler's fault (the SGLang tests' `FLOAT32`, tests/e2e/e2e_client.py, does the same)."""


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Measurement:
    """vLLM's own scheduler, served, measured and shut down before Feather's server starts."""
    log = tmp_path_factory.mktemp("vllm-default") / "server.log"
    with Server(vllm_spec(str(require_model()), "fcfs", FLOAT32), log_path=log) as server:
        return measure(server, "default", WORKLOAD, CONCURRENCY)


@pytest.fixture(scope="module")
def state_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-feather-state") / "stopper-state.json"


@pytest.fixture(scope="module")
def feather_server(tmp_path_factory, default_run, state_path):
    log = tmp_path_factory.mktemp("vllm-feather") / "server.log"
    options = {"state_path": str(state_path)}
    server = Server(
        vllm_spec(str(require_model()), "feather", FLOAT32 + vllm_feather_args(options)), log_path=log
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def feather_run(feather_server) -> Measurement:
    return measure(feather_server, "feather", WORKLOAD, CONCURRENCY)


def test_feather_serves_every_request(feather_run):
    failures = [c.error for c in feather_run.result.completions if c.error is not None]
    assert not failures, failures[:3]
    assert len(feather_run.result.completions) == WORKLOAD.num_requests
    assert {(c.num_tokens, c.finish_reason) for c in feather_run.result.completions} == {(16, "length")}


def test_feather_greedy_outputs_equal_the_default_schedulers(default_run, feather_run):
    assert default_run.result.num_failed == 0
    mismatched = [
        i
        for i, (a, b) in enumerate(zip(default_run.result.texts, feather_run.result.texts, strict=True))
        if a != b
    ]
    assert not mismatched, (
        f"{len(mismatched)} of {WORKLOAD.num_requests} differ, e.g. request {mismatched[0]}"
    )
    print(f"\nCPU, tiny model, {WORKLOAD.num_requests} requests, {CONCURRENCY} concurrent:\n{HEADER}")
    print(default_run.row())
    print(feather_run.row())


def test_the_engine_ran_feathers_scheduler(feather_server, feather_run):
    log = feather_server.log_path.read_text(errors="replace")
    assert f"Using custom scheduler class {FEATHER_SCHEDULER}" in log
    assert f"FeatherScheduler: chunk = block = 32 tokens, stopper {DEFAULT_STOPPER}" in log
    assert "cache tier fed by the block pool" in log
    assert feather_run.num_cache_hits > 0


def test_sigterm_shuts_the_server_down_cleanly_and_saves_the_learned_state(
    feather_server, feather_run, state_path
):
    state = state_path
    assert not state.exists()
    assert feather_server.stop() == 0, feather_server.log_tail()
    assert not feather_server.is_running()
    summary = re.search(
        r"FeatherScheduler: \d+ admitted .* (\d+) cache events",
        feather_server.log_path.read_text(errors="replace"),
    )
    assert summary and int(summary.group(1)) > 0, "the block pool fed the cache tier while serving"
    assert json.loads(state.read_text())
