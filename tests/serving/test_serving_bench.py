"""bench_serving command lines (checked by SGLang's own parser) and parsing of its JSON result lines."""

import json
import sys

import pytest
import sglang.benchmark.serving as bench_serving

from sglang_feather.serving.bench import (
    BenchConfig,
    BenchError,
    BenchResult,
    Workload,
    bench_argv,
    bench_env,
    read_result,
)
from sglang_feather.workload import SharedPrefixSpec

WORKLOAD = Workload("gsp", SharedPrefixSpec.per_group(3, 5, prefix_len=40, question_len=7, output_len=9))


def record(**overrides) -> dict:
    """A result line shaped like bench_serving's `result` dict (values arbitrary, keys as it writes them)."""
    base = {
        "completed": 14,
        "duration": 2.5,
        "request_throughput": 5.6,
        "output_throughput": 50.4,
        "total_throughput": 300.0,
        "median_ttft_ms": 110.0,
        "p99_ttft_ms": 450.0,
        "median_tpot_ms": 12.0,
        "p99_tpot_ms": 30.0,
        "median_e2e_latency_ms": 700.0,
        "cache_report": {"cache_hit_rate_pct": 77.5, "total_cached_tokens": 10},
        "server_info": {"ignored": True},
    }
    return {**base, **overrides}


def parsed_by_sglang(monkeypatch, argv: list[str]):
    captured = {}
    monkeypatch.setattr(bench_serving, "run_benchmark", lambda args: captured.setdefault("args", args))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *argv])
    bench_serving.cli_main()
    return captured["args"]


def test_argv_is_accepted_by_sglang_bench_serving(monkeypatch):
    config = BenchConfig(max_concurrency=7, request_rate=3.5, seed=11, extra_args=("--flush-cache",))
    argv = bench_argv("http://127.0.0.1:1234", "m", "tok", WORKLOAD, config, backend="sglang")
    args = parsed_by_sglang(monkeypatch, argv)
    assert (args.dataset_name, args.gsp_num_groups, args.gsp_prompts_per_group) == (
        "generated-shared-prefix",
        3,
        5,
    )
    assert (args.gsp_system_prompt_len, args.gsp_question_len, args.gsp_output_len) == (40, 7, 9)
    assert (args.max_concurrency, args.request_rate, args.seed) == (7, 3.5, 11)
    assert args.base_url == "http://127.0.0.1:1234" and args.tokenizer == "tok" and args.model == "m"
    assert args.cache_report and args.flush_cache


def test_default_config_sends_everything_at_once(monkeypatch):
    argv = bench_argv("http://h:1", "m", "m", WORKLOAD, BenchConfig(), backend="sglang")
    args = parsed_by_sglang(monkeypatch, argv)
    assert args.max_concurrency is None and args.request_rate == float("inf")


def test_spec_order_and_popularity_reach_bench_serving(monkeypatch):
    spec = SharedPrefixSpec.per_group(
        4, 6, prefix_len=40, popularity="zipf", zipf_alpha=1.5, order="contiguous"
    )
    argv = bench_argv("http://h:1", "m", "m", Workload("zipf", spec), BenchConfig(), backend="sglang")
    args = parsed_by_sglang(monkeypatch, argv)
    assert (args.gsp_group_distribution, args.gsp_zipf_alpha, args.gsp_ordered) == ("zipf", 1.5, True)
    shuffled = bench_argv("http://h:1", "m", "m", WORKLOAD, BenchConfig(), backend="sglang")
    assert not parsed_by_sglang(monkeypatch, shuffled).gsp_ordered


def test_no_sharing_gives_every_request_its_own_prompt():
    workload = Workload.no_sharing("solo", num_requests=12, prompt_len=300, output_len=4)
    args = workload.dataset_args()
    assert (
        args[args.index("--gsp-num-groups") + 1] == "12"
        and args[args.index("--gsp-prompts-per-group") + 1] == "1"
    )
    assert args[args.index("--gsp-system-prompt-len") + 1] == "300" and workload.num_requests == 12


@pytest.mark.parametrize(
    "spec, match",
    [
        (SharedPrefixSpec(num_groups=3, num_requests=10), "multiple of num_groups"),
        (SharedPrefixSpec(num_groups=2, num_requests=4, order="interleaved"), "order"),
        (SharedPrefixSpec(num_groups=2, num_requests=4, rate=3.0), "request_rate"),
        (SharedPrefixSpec(num_groups=2, num_requests=4, num_turns=2), "multi-turn"),
    ],
)
def test_workload_refuses_what_bench_serving_cannot_send(spec, match):
    with pytest.raises(ValueError, match=match):
        Workload("bad", spec)


def test_result_fields_map_from_the_record():
    result = BenchResult.from_record(record(), WORKLOAD)
    assert result.workload == "gsp" and result.num_requests == 15
    assert (result.completed, result.num_failed) == (14, 1)
    assert (result.ttft_p50_ms, result.ttft_p99_ms, result.tpot_p50_ms, result.tpot_p99_ms) == (
        110,
        450,
        12,
        30,
    )
    assert result.output_throughput == 50.4 and result.cache_hit_rate == pytest.approx(0.775)


def test_missing_cache_report_gives_no_hit_rate():
    assert BenchResult.from_record(record(cache_report=None), WORKLOAD).cache_hit_rate is None


def test_missing_key_is_a_bench_error_naming_it():
    broken = record()
    del broken["p99_ttft_ms"]
    with pytest.raises(BenchError, match="p99_ttft_ms"):
        BenchResult.from_record(broken, WORKLOAD)


def test_read_result_takes_the_last_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(record(completed=1)) + "\n" + json.dumps(record(completed=15)) + "\n\n")
    assert read_result(path, WORKLOAD).completed == 15


@pytest.mark.parametrize("content", [None, "", "{not json\n"])
def test_read_result_rejects_missing_empty_or_garbled_files(tmp_path, content):
    path = tmp_path / "out.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BenchError):
        read_result(path, WORKLOAD)


def test_bench_env_is_offline_with_a_home_per_tokenizer(tmp_path):
    base = {"HOME": "/home/u", "PATH": "/bin"}
    env_a = bench_env(base, "models/a", tmp_path)
    env_b = bench_env(base, "models/b", tmp_path)
    assert env_a["HF_HUB_OFFLINE"] == "1" and env_a["PATH"] == "/bin"
    assert env_a["HF_HOME"] == "/home/u/.cache/huggingface"
    assert env_a["HOME"] != env_b["HOME"] and env_a["HOME"].startswith(str(tmp_path))
    assert bench_env(base, "models/a", tmp_path)["HOME"] == env_a["HOME"]


def test_flush_and_details_reach_bench_serving(monkeypatch):
    config = BenchConfig(flush_cache=True, output_details=True)
    args = parsed_by_sglang(
        monkeypatch, bench_argv("http://h:1", "m", "m", WORKLOAD, config, backend="sglang")
    )
    assert args.flush_cache and args.output_details
    plain = parsed_by_sglang(
        monkeypatch, bench_argv("http://h:1", "m", "m", WORKLOAD, BenchConfig(), backend="sglang")
    )
    assert not plain.flush_cache and not plain.output_details


def test_e2e_max_is_rebuilt_from_the_details_of_successful_requests():
    details = {
        "ttfts": [0.1, 0.2, 0.0, 9.0],
        "itls": [[0.05, 0.05], [0.3], [], [1.0]],
        "errors": ["", "", "", "connection reset"],
    }
    result = BenchResult.from_record(record(**details), WORKLOAD)
    assert result.e2e_max_ms == pytest.approx(500.0) and result.e2e_p50_ms == 700.0
    assert BenchResult.from_record(record(), WORKLOAD).e2e_max_ms is None


def test_details_of_unequal_lengths_are_a_bench_error():
    with pytest.raises(BenchError):
        BenchResult.from_record(record(ttfts=[0.1, 0.2], itls=[[0.1]], errors=["", ""]), WORKLOAD)
