"""`python -m sglang_feather.sim`: every option is documented, the workload flags are the spec's under their old
names and defaults, and a small run writes table, JSON and plot."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from sglang_feather.options import show
from sglang_feather.sim.__main__ import main
from sglang_feather.sim.cli import SIM_WORKLOAD_FIELDS, build_parser, sweep_values, workload_config
from sglang_feather.sim.workloads import WorkloadConfig
from sglang_feather.workload import FLAGS


def test_every_option_has_help():
    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_help_runs():
    out = subprocess.run(
        [sys.executable, "-m", "sglang_feather.sim", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for flag in (
        "--workload",
        "--policies",
        "--gpu",
        "--profile-override",
        "--sweep",
        "--overlap-schedule",
        "--batch-order",
        "--attention",
    ):
        assert flag in out.stdout


def test_small_sweep_writes_json_and_plot(tmp_path, capsys):
    args = [
        "--workload",
        "gsp",
        "--num-groups",
        "2",
        "--prompts-per-group",
        "4",
        "--output-len",
        "6",
        "--policies",
        "feather",
        "--feather-stopper",
        "always",
        "--sweep",
        "prefix_len=64,256",
        "--fixed-cpu-ms",
        "0.1",
        "--json",
        str(tmp_path / "r.json"),
        "--plot-dir",
        str(tmp_path),
        "--no-progress",
        "--export-trace",
        str(tmp_path / "t.jsonl"),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "prefix_len=256" in printed and "| feather" in printed and "estimates:" in printed
    data = json.loads((tmp_path / "r.json").read_text())
    assert [r["sweep"]["prefix_len"] for r in data["runs"]] == [64, 256]
    assert data["profile"]["gpu"] == "h200"
    assert (tmp_path / "throughput_vs_prefix_len.png").stat().st_size > 0
    assert main(["--trace", str(tmp_path / "t.jsonl"), "--policies", "feather", "--no-progress"]) == 0


def test_attention_flag_picks_the_kernel_and_is_recorded(tmp_path, capsys):
    base = ["--workload", "gsp", "--num-groups", "2", "--prompts-per-group", "6", "--prefix-len", "2048"]
    base += ["--output-len", "16", "--policies", "fcfs", "--fixed-cpu-ms", "0", "--no-progress"]
    tok_s = {}
    for kernel in ("plain", "grouped"):
        out = tmp_path / f"{kernel}.json"
        assert main([*base, "--attention", kernel, "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["engine"]["attention"] == kernel
        (run,) = data["runs"]
        tok_s[kernel] = run["output_tok_s"]
    assert tok_s["grouped"] > tok_s["plain"], tok_s
    with pytest.raises(SystemExit):
        main([*base, "--attention", "flash"])
    assert "invalid choice: 'flash'" in capsys.readouterr().err


OLD_WORKLOAD_FLAGS = {
    "--seed": 0,
    "--num-groups": 8,
    "--prompts-per-group": 100,
    "--prefix-len": 4096,
    "--question-len": 20,
    "--output-len": 50,
    "--group-dist": "uniform",
    "--zipf-alpha": 1.0,
    "--num-requests": 800,
    "--num-turns": 4,
    "--rate": None,
}
"""The simulator's workload flags before they were generated from the spec, with their defaults."""


def _config(argv: list[str], **sweep) -> WorkloadConfig:
    return workload_config(build_parser().parse_args(argv), **sweep)


def test_workload_flags_are_generated_from_the_spec_fields():
    parser = build_parser()
    helps = {s: a.help for a in parser._actions for s in a.option_strings}
    spec = WorkloadConfig().spec
    for opt in FLAGS:
        assert opt.help in helps[opt.flag()], opt.flag()
        assert helps[opt.flag()].endswith(f"default {show(getattr(spec, opt.name))}."), opt.flag()
    for name in SIM_WORKLOAD_FIELDS:
        assert "--" + name.replace("_", "-") in helps, name


def test_old_workload_flags_keep_their_names_and_defaults():
    parser = build_parser()
    assert set(OLD_WORKLOAD_FLAGS) | {"--ordered"} <= set(parser._option_string_actions)
    for workload in ("gsp", "rag"):
        spec = _config(["--workload", workload]).spec
        for flag, default in OLD_WORKLOAD_FLAGS.items():
            name = {"--group-dist": "popularity", "--prompts-per-group": "num_requests"}.get(flag, flag[2:])
            value = getattr(spec, name.replace("-", "_"))
            expected = default * 8 if flag == "--prompts-per-group" else default
            if flag == "--num-groups" and workload != "gsp":
                expected = 1  # only gsp reads it
            assert value == expected, (workload, flag)
        assert spec.order == "random"
    assert _config(["--workload", "gsp"]) == WorkloadConfig()


def test_old_spellings_mean_the_new_flags():
    assert _config(["--group-dist", "zipf"]) == _config(["--popularity", "zipf"])
    assert _config(["--ordered"]).spec.order == "contiguous" == _config(["--order", "contiguous"]).spec.order
    assert _config(["--rate", "5"]).spec.rate == 5.0 and _config(["--rate", "none"]).spec.rate is None


def test_prompts_per_group_sizes_gsp_only_and_sweeps_like_a_flag():
    assert _config(["--workload", "gsp", "--num-groups", "16"]).spec.num_requests == 1600
    assert _config(["--workload", "rag", "--num-groups", "16"]).spec.num_requests == 800
    for workload in ("rag", "chat", "none"):
        spec = _config(["--workload", workload, "--num-requests", "4"]).spec
        assert spec.num_requests == 4 and spec.num_groups == 1
    gsp = ["--workload", "gsp", "--prompts-per-group", "3"]
    assert _config(gsp, num_groups=4).spec.num_requests == 12
    assert _config(gsp, prompts_per_group=5).spec.num_requests == 40
    assert _config(gsp, prefix_len=64).spec.prefix_len == 64
    assert sweep_values("prompts_per_group=1,2") == ("prompts_per_group", [1, 2])
    assert sweep_values("num_docs=3") == ("num_docs", [3])
    with pytest.raises(SystemExit, match="--sweep"):
        sweep_values("group_size=3")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-groups", "0"], "--num-groups must be a positive integer, got 0"),
        (["--workload", "gsp", "--prompts-per-group", "0"], "--prompts-per-group must be a positive integer"),
        (["--group-dist", "pareto"], "--popularity must be one of"),
        (["--zipf-alpha", "-1"], "--zipf-alpha must be a finite number >= 0"),
        (["--rate", "0"], "--rate must be a finite number > 0"),
        (["--workload", "rag", "--num-groups", "900"], "--num-groups (900) exceeds num_requests (800)"),
    ],
)
def test_bad_workload_values_name_the_flag(argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        _config(argv)


def test_malformed_workload_values_are_argparse_errors(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rate", "fast"])
    assert "not a number: 'fast'" in capsys.readouterr().err
