"""`python -m sglang_feather.sim`: every option is documented, and a small run writes table, JSON and plot."""

from __future__ import annotations

import json
import subprocess
import sys

from sglang_feather.sim.__main__ import main
from sglang_feather.sim.cli import build_parser


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
