"""The demo's command line: defaults, per-policy flags and a clear error when the tiny model is missing."""

import pytest

from sglang_feather import demo


def test_defaults_compare_fcfs_lpm_and_feather_on_a_small_shared_prefix_workload():
    args = demo.parse_args([])
    assert args.model == "models/tiny-llama" and args.policies.split(",") == ["fcfs", "lpm", "feather"]
    assert (args.groups, args.prompts_per_group, args.system_prompt_len) == (8, 16, 512)


def test_missing_default_model_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="make model"):
        demo.main(["--policies", "fcfs"])


def test_explicit_device_is_kept():
    assert demo.pick_device("cpu") == "cpu" and demo.pick_device("cuda") == "cuda"
