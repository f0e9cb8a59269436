"""vLLM as the harness's second engine: its command line (the served runs are in tests/vllm/test_vllm_server.py)."""

import json

import pytest

from sglang_feather.serving import Server, ServerSpec
from sglang_feather.serving.server import FEATHER_SCHEDULER, vllm_feather_args


def argv(policy: str, extra_args=(), tmp_path=None) -> list[str]:
    spec = ServerSpec("models/tiny-llama", policy, engine="vllm", extra_args=extra_args, port=4321)
    return Server(spec, log_path=tmp_path / "s.log", python="python").argv


def flag(args: list[str], name: str) -> str:
    return args[len(args) - 1 - args[::-1].index(name) + 1]  # the last one wins, as in argparse


def test_feather_runs_as_the_scheduler_class_with_its_options(tmp_path):
    args = argv("feather", vllm_feather_args({"stopper": "static"}), tmp_path)
    assert args[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(args, "--scheduler-cls") == FEATHER_SCHEDULER
    assert json.loads(flag(args, "--additional-config")) == {"feather": {"stopper": "static"}}
    assert {"--enable-prefix-caching", "--no-async-scheduling", "--enforce-eager"} <= set(args)
    assert (flag(args, "--port"), flag(args, "--block-size"), flag(args, "--shutdown-timeout")) == (
        "4321",
        "32",
        "10",
    )


def test_fcfs_is_vllms_own_scheduler_and_extra_args_come_last(tmp_path):
    args = argv("fcfs", ("--block-size", "64"), tmp_path)
    assert "--scheduler-cls" not in args
    assert flag(args, "--block-size") == "64"


def test_a_policy_vllm_cannot_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown vLLM policy 'lpm'; known: \['fcfs', 'feather'\]"):
        argv("lpm", (), tmp_path)
