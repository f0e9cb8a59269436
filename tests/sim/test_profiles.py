"""Every shipped profile loads with sourced constants; override files merge, and bad ones are refused."""

from __future__ import annotations

import json

import pytest

from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.profile import SOURCES, ProfileError, available, load_profile


@pytest.mark.parametrize("gpu", available("gpu"))
@pytest.mark.parametrize("model", available("model"))
def test_every_profile_loads_and_sources_every_constant(gpu, model):
    prof = load_profile(gpu, model)
    assert prof.constants
    for c in prof.constants.values():
        assert c["source"] in SOURCES and c["ref"] and c["unit"]
    cost = PhysicsCostModel(prof)
    assert cost.kv_capacity_tokens(0.9) > 0 and cost.concurrent_requests >= 1


def test_shipped_profiles_cover_the_issue():
    assert {"h200", "a100-80gb", "rtx6000-ada"} <= set(available("gpu"))
    assert {"llama-3-8b", "qwen2.5-7b", "llama-2-13b"} <= set(available("model"))


def _override(tmp_path, body):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(body))
    return path


MEASURED = {"value": 7e12, "unit": "B/s", "source": "measured", "ref": "H200, 2026-11-29, kernels_bench"}


def test_override_replaces_a_constant_and_is_recorded(tmp_path):
    path = _override(
        tmp_path, {"applies_to": {"gpu": "h200"}, "gpu": {"decode_attention": {"l2_bandwidth": MEASURED}}}
    )
    prof = load_profile("h200", "llama-3-8b", (path,))
    assert prof.constants["gpu.decode_attention.l2_bandwidth"] == MEASURED
    assert prof.provenance()["overrides"] == [str(path)]
    assert "gpu.decode_attention.l2_bandwidth" in prof.provenance()["by_source"]["measured"]
    base = PhysicsCostModel(load_profile("h200", "llama-3-8b"))
    from sglang_feather.sim.cost import KVSplit

    assert PhysicsCostModel(prof).decode_s(4, KVSplit(0, 10**6)) > base.decode_s(4, KVSplit(0, 10**6))


@pytest.mark.parametrize(
    "body",
    [
        {"applies_to": {"gpu": "a100-80gb"}, "gpu": {"decode_attention": {"l2_bandwidth": MEASURED}}},
        {"gpu": {"decode_attention": {"l2_speed": MEASURED}}},
        {"gpu": {"cache": {"l2_bandwidth": MEASURED}}},
        {"gpu": {"decode_attention": {"l2_bandwidth": {**MEASURED, "source": "guess"}}}},
        {"gpu": {"decode_attention": {"l2_bandwidth": {**MEASURED, "unit": "GB/s"}}}},
        {"gpu": {"decode_attention": {"l2_bandwidth": {"value": 1.0}}}},
        {"constants": {}},
    ],
)
def test_bad_override_raises(tmp_path, body):
    with pytest.raises(ProfileError):
        load_profile("h200", "llama-3-8b", (_override(tmp_path, body),))


def test_unknown_profile_names_the_choices():
    with pytest.raises(ProfileError, match="h200"):
        load_profile("h100-typo", "llama-3-8b")
