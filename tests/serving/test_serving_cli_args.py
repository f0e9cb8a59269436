"""Server command lines built by the harness, the demo and the serving benchmark parse with SGLang's own parser."""

import argparse
from dataclasses import replace

import pytest
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs

from kernels_bench.serving import __main__ as serving_bench
from kernels_bench.serving.profiles import PROFILES
from kernels_bench.serving.workloads import DRY_SMALL, WorkloadPlan, build_workloads
from sglang_feather import demo
from sglang_feather.serving import Server, ServerSpec


def sglang_parse(argv: list[str]) -> argparse.Namespace:
    load_plugins()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)


def server_flags(spec: ServerSpec, tmp_path) -> list[str]:
    argv = Server(spec, log_path=tmp_path / "s.log", python="python").argv
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    return argv[3:]


def test_cpu_server_flags(tmp_path):
    spec = ServerSpec("models/tiny-llama", "lpm", extra_args=("--max-running-requests", "8"), port=4321)
    args = sglang_parse(server_flags(spec, tmp_path))
    assert (args.model_path, args.schedule_policy, args.port, args.host) == (
        "models/tiny-llama",
        "lpm",
        4321,
        "127.0.0.1",
    )
    assert (args.device, args.attention_backend, args.sampling_backend) == ("cpu", "torch_native", "pytorch")
    assert args.enable_metrics and args.disable_cuda_graph and args.sleep_on_idle
    assert args.max_running_requests == 8


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_machine_profile_parses_with_feather(tmp_path, profile):
    machine = PROFILES[profile]
    spec = ServerSpec("some/model", "feather", device=machine.device, extra_args=machine.server_args)
    args = sglang_parse(server_flags(spec, tmp_path))
    assert args.schedule_policy == "feather"
    assert args.max_running_requests is not None


def test_paper_workloads():
    workloads = build_workloads(WorkloadPlan())
    assert [w.name for w in workloads] == ["shared-1024", "shared-4096", "shared-10240", "no-sharing"]
    assert all(w.num_requests == 800 for w in workloads)
    assert workloads[-1].spec.num_groups == workloads[-1].spec.num_requests
    assert [w.name for w in build_workloads(DRY_SMALL)] == ["shared-128", "no-sharing"]
    assert build_workloads(WorkloadPlan(no_sharing_len=None))[-1].name == "shared-10240"


def test_serving_bench_workload_flags_are_the_specs():
    base = ["--model", "m", "--profile", sorted(PROFILES)[0]]
    args = serving_bench.parse_args(
        [*base, "--groups", "4", "--prompts-per-group", "2", "--prefix-lens", "64,128"]
    )
    assert [w.name for w in args.workloads] == ["shared-64", "shared-128", "no-sharing"]
    assert args.workloads[1].spec == replace(
        WorkloadPlan().spec, num_groups=4, num_requests=8, prefix_len=128
    )
    assert args.workloads[-1].num_requests == 8
    assert "--prefix-len" not in {s for opt in serving_bench.WORKLOAD_FLAGS.options() for s in [opt.flag()]}
    assert serving_bench.parse_args(["--dry-small"]).workloads == build_workloads(DRY_SMALL)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--groups", "0"], "--num-groups must be a positive integer"),
        (["--order", "interleaved"], "sends order"),
        (["--dry-small", "--order", "contiguous"], "drop the workload flags"),
    ],
)
def test_serving_bench_bad_workload_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        serving_bench.parse_args(["--model", "m", "--profile", sorted(PROFILES)[0], *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_demo_server_args_reach_every_server_and_feather_args_only_feathers(tmp_path):
    args = demo.parse_args(
        [
            "--server-args",
            "--disable-overlap-schedule --max-running-requests 32",
            "--feather-args=--feather-stopper static",
        ]
    )
    for policy, spec in demo.server_specs(args, "cpu").items():
        parsed = sglang_parse(server_flags(spec, tmp_path))
        assert parsed.schedule_policy == policy
        assert parsed.disable_overlap_schedule and parsed.max_running_requests == 32
        assert ("--feather-stopper" in spec.extra_args) == (policy == "feather")


def test_kv_pressure_pool_overrides_the_cpu_profiles_and_keeps_sglangs_scheduling_defaults(tmp_path):
    args = demo.parse_args(["--kv-pressure"])
    for policy, spec in demo.server_specs(args, "cpu").items():
        parsed = sglang_parse(server_flags(spec, tmp_path))
        assert parsed.schedule_policy == policy and parsed.max_total_tokens == 8192
        assert not parsed.disable_overlap_schedule and not parsed.disable_radix_cache
        assert parsed.chunked_prefill_size is None and parsed.page_size == 16
