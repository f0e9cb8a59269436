"""Scheduling must not change results: greedy outputs under `feather` equal those under `fcfs`."""

import pytest
from conftest import serving
from e2e_client import generate_all, greedy_payload, shared_prefix_prompts

from sglang_feather.serving.metrics import scrape


@pytest.fixture(scope="module")
def fcfs_and_feather(tmp_path_factory, tiny_model):
    with serving(tmp_path_factory.mktemp("parity"), tiny_model, [("fcfs", ()), ("feather", ())]) as servers:
        yield servers


def test_greedy_outputs_match_fcfs(fcfs_and_feather):
    fcfs, feather = fcfs_and_feather
    prompts = shared_prefix_prompts(num_groups=6, per_group=8, prefix_len=80, suffix_lens=(4, 20), seed=3)
    payloads = [greedy_payload(p, max_new_tokens=16) for p in prompts]

    expected = [r["output_ids"] for r in generate_all(fcfs.base_url, payloads)]
    got = [r["output_ids"] for r in generate_all(feather.base_url, payloads)]

    assert all(len(ids) == 16 for ids in expected)
    mismatches = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
    assert not mismatches, (
        f"{len(mismatches)} of {len(prompts)} greedy outputs differ, e.g. prompt {mismatches[0]}"
    )
    assert len({tuple(ids) for ids in expected}) > len(prompts) // 2, "outputs barely depend on the prompt"
    assert scrape(feather.base_url).total("sglang:feather_admissions_total"), (
        "feather server never used Feather"
    )
