"""`--dp-size N`: each rank's Feather gets its own state file and a tag with its rank; one rank changes nothing."""

from dataclasses import replace

import pytest

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sglang.options import FeatherOptions
from sglang_feather.sglang.ranks import rank_options, rank_state_path, rank_tag

TAG = {"engine": "sglang", "model": "m", "device": "cpu"}


def with_state(path: str | None) -> FeatherOptions:
    return FeatherOptions(AdmissionConfig(state_path=path))


@pytest.fixture
def state_dir(tmp_path) -> str:
    return str(tmp_path)


def test_each_rank_writes_its_own_state_file(state_dir):
    assert rank_state_path("/s/feather-ucb.json", 1) == "/s/feather-ucb.dp1.json"
    assert rank_state_path("/s/state", 0) == "/s/state.dp0"
    options = with_state(f"{state_dir}/feather.json")
    paths = {rank_options(options, 2, rank).admission.state_path for rank in (0, 1)}
    assert paths == {f"{state_dir}/feather.dp0.json", f"{state_dir}/feather.dp1.json"}
    ranked = rank_options(options, 2, 1)
    own = f"{state_dir}/feather.dp1.json"
    assert ranked == replace(options, admission=replace(options.admission, state_path=own))


def test_a_single_rank_server_keeps_its_file_and_tag(state_dir):
    options = with_state(f"{state_dir}/feather.json")
    assert rank_options(options, 1, 0) is options
    assert rank_options(with_state(None), 2, 1).admission.state_path is None
    assert rank_tag(TAG, 1, 0) == TAG
    assert rank_tag(TAG, 2, None) == TAG


def test_the_tag_names_the_rank():
    assert rank_tag(TAG, 4, 3) == {**TAG, "dp_rank": "3"}
