"""The demo's command line: defaults, repeats, server flags in every spelling, and the tiny-model check."""

import pytest

from sglang_feather import demo
from sglang_feather.serving.repeats import KV_PRESSURE_METRICS
from sglang_feather.workload import SHAPE_FIELDS, SharedPrefixSpec


def test_defaults_compare_four_policies_three_times_on_a_small_shared_prefix_workload():
    args = demo.parse_args([])
    assert args.model == "models/tiny-llama"
    assert args.policies == ["fcfs", "lpm", "dfs-weight", "feather"] and args.repeat == 3
    assert args.workload.spec == SharedPrefixSpec.per_group(
        8, 16, prefix_len=512, question_len=32, output_len=32
    )
    assert args.workload.name == "gsp-8x16-512"
    assert args.server_args == () and args.feather_args == ()


@pytest.mark.parametrize(
    "argv",
    [
        ["--server-args=--disable-overlap-schedule --max-running-requests 32"],
        ["--server-args", "--disable-overlap-schedule --max-running-requests 32"],
    ],
)
def test_server_args_equals_and_quoted_forms(argv):
    assert demo.parse_args(argv).server_args == ("--disable-overlap-schedule", "--max-running-requests", "32")


@pytest.mark.parametrize(
    "argv", [["--server-args=--disable-overlap-schedule"], ["--server-args", "--disable-overlap-schedule"]]
)
def test_a_single_flag_value_is_accepted_as_equals_or_as_the_next_token(argv):
    # argparse alone rejects the second spelling ("expected one argument"): the demo joins it first.
    assert demo.parse_args(argv).server_args == ("--disable-overlap-schedule",)


def test_flag_strings_for_feather_only_and_other_options_around_them():
    args = demo.parse_args(
        [
            "--repeat",
            "2",
            "--feather-args",
            "--feather-stopper static",
            "--server-args",
            "--x",
            "--max-concurrency",
            "128",
        ]
    )
    assert args.feather_args == ("--feather-stopper", "static") and args.server_args == ("--x",)
    assert (args.repeat, args.max_concurrency) == (2, 128)


def test_join_only_touches_the_token_after_a_flag_string_option():
    argv = ["--policies", "fcfs", "--server-args", "--a --b", "--feather-args", "--c"]
    assert demo.join_flag_strings(argv) == [
        "--policies",
        "fcfs",
        "--server-args=--a --b",
        "--feather-args=--c",
    ]
    assert demo.join_flag_strings(["--server-args=--a"]) == ["--server-args=--a"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--server-args"], "expected one argument"),
        (["--repeat", "0"], "must be >= 1"),
        (["--policies", " , "], "names no policy"),
        (["--policies", "fcfs,feather,fcfs"], "names a policy twice"),
        (["--policies", "fcfs,feather:ucb-adaptiv"], "no stopper 'ucb-adaptiv'; choose from always, qlearn"),
        (["--server-args", "--x 'unclosed"], "--server-args: No closing quotation"),
        (["--groups", "0"], "--num-groups must be a positive integer, got 0"),
        (["--prompts-per-group", "0"], "--prompts-per-group must be a positive integer"),
        (["--popularity", "pareto"], "--popularity must be one of"),
        (["--order", "interleaved"], "bench_serving sends order"),
    ],
)
def test_bad_arguments_are_clear_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        demo.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_repeats_rotate_the_policy_order():
    policies = ["fcfs", "lpm", "dfs-weight", "feather"]
    orders = [demo.repeat_order(policies, r) for r in range(5)]
    assert orders[0] == policies and orders[1] == ["lpm", "dfs-weight", "feather", "fcfs"]
    assert orders[4] == policies
    assert [o[0] for o in orders[:4]] == policies


def test_missing_default_model_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="make model"):
        demo.main(["--policies", "fcfs"])


def test_explicit_device_is_kept():
    assert demo.pick_device("cpu") == "cpu" and demo.pick_device("cuda") == "cuda"


def test_workload_flags_are_the_specs_with_the_old_spellings_kept():
    old = demo.parse_args(["--groups", "4", "--prompts-per-group", "3", "--system-prompt-len", "64"])
    new = demo.parse_args(["--num-groups", "4", "--prompts-per-group", "3", "--prefix-len", "64"])
    assert old.workload == new.workload and old.workload.name == "gsp-4x3-64"
    assert new.workload.spec == SharedPrefixSpec.per_group(
        4, 3, prefix_len=64, question_len=32, output_len=32
    )
    zipf = demo.parse_args(["--popularity", "zipf", "--zipf-alpha", "1.5", "--order", "contiguous"]).workload
    assert "--gsp-zipf-alpha" in zipf.dataset_args() and "--gsp-ordered" in zipf.dataset_args()
    options = {opt.name for opt in demo.WORKLOAD_FLAGS.options()}
    assert options == {*SHAPE_FIELDS, "prompts_per_group"}


def test_kv_pressure_preset_shape_server_flags_and_bench_settings():
    args = demo.parse_args(["--kv-pressure"])
    assert args.preset is demo.KV_PRESSURE
    assert args.workload.spec == SharedPrefixSpec.per_group(
        16, 16, prefix_len=2048, question_len=32, output_len=32
    )
    assert args.workload.name == "gsp-16x16-2048" and args.workload.spec.order == "random"
    assert args.max_concurrency == 64 and str(args.out) == "results/demo-kv-pressure"
    config = demo.bench_config(args)
    assert config.flush_cache and config.output_details and config.max_concurrency == 64
    assert demo.KV_PRESSURE.metrics is KV_PRESSURE_METRICS


def test_concentration_preset_is_issue_49s_live_set():
    args = demo.parse_args(["--preset", "concentration"])
    spec = args.workload.spec
    assert args.preset is demo.CONCENTRATION and spec.popularity == "zipf" and spec.zipf_alpha == 1.1
    assert (spec.num_groups, spec.num_requests, spec.prefix_len, spec.question_len, spec.output_len) == (
        24,
        96,
        1536,
        800,
        128,
    )
    config = demo.bench_config(args)
    assert config.extra_args == ("--gsp-range-ratio", "0.5") and config.flush_cache
    specs = demo.server_specs(args, "cpu")
    assert all("--max-total-tokens" in spec.extra_args for spec in specs.values())


def test_plain_demo_keeps_its_defaults():
    args = demo.parse_args([])
    assert args.preset is demo.DEMO and args.max_concurrency == 64 and str(args.out) == "results/demo"
    config = demo.bench_config(args)
    assert not config.flush_cache and not config.output_details
    assert all(spec.extra_args == () for spec in demo.server_specs(args, "cpu").values())


def test_kv_pressure_flags_override_the_preset_and_user_server_args_replace_its_own():
    args = demo.parse_args(
        ["--kv-pressure", "--groups", "4", "--prefix-len", "256", "--max-concurrency", "8", "--out", "x"]
    )
    assert (args.workload.spec.num_groups, args.workload.num_requests, args.workload.spec.prefix_len) == (
        4,
        64,
        256,
    )
    assert args.max_concurrency == 8 and str(args.out) == "x"
    args = demo.parse_args(["--kv-pressure", "--server-args=--max-total-tokens 4096", "--feather-args=--y"])
    specs = demo.server_specs(args, "cpu")
    assert specs["fcfs"].extra_args == ("--max-total-tokens", "4096")
    assert specs["feather"].extra_args[-1] == "--y"
    args = demo.parse_args(
        ["--kv-pressure", "--server-args=--disable-overlap-schedule --max-running-requests=8"]
    )
    assert demo.server_specs(args, "cpu")["lpm"].extra_args == (
        "--max-total-tokens",
        "8192",
        "--disable-overlap-schedule",
        "--max-running-requests=8",
    )
    assert demo.merged_server_args(("--a", "1", "--b", "--c=3"), ("--c", "4", "--a=2")) == (
        "--b",
        "--c",
        "4",
        "--a=2",
    )


def test_decode_heavy_runs_every_policy_and_stopper_on_each_attention_backend():
    args = demo.parse_args(
        [
            "--decode-heavy",
            "--policies", "fcfs,feather,feather:ucb",
            "--attention-backends", "torch_native,feather_grouped",
            "--reuse-servers",
        ]
    )  # fmt: skip
    assert args.preset is demo.DECODE_HEAVY and args.reuse_servers
    specs = demo.server_specs(args, "cpu")
    assert list(specs) == [
        f"{entry}@{backend}"
        for entry in ("fcfs", "feather", "feather:ucb")
        for backend in ("torch_native", "feather_grouped")
    ]
    ucb = specs["feather:ucb@feather_grouped"]
    assert (ucb.policy, ucb.name) == ("feather", "feather:ucb@feather_grouped")
    assert ucb.extra_args == (
        "--max-running-requests", "64", "--feather-stopper", "ucb",
        "--attention-backend", "feather_grouped", "--feather-segment-metrics",
    )  # fmt: skip
    assert specs["fcfs@torch_native"].extra_args[-3:] == (
        "--attention-backend",
        "torch_native",
        "--feather-segment-metrics",
    )


def test_two_presets_at_once_are_refused(capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--decode-heavy", "--kv-pressure"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        demo.parse_args(["--preset", "concentration", "--kv-pressure"])
    assert "not allowed with argument" in capsys.readouterr().err
