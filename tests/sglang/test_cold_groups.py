"""Issue 10: a cold group's shared prefix is prefilled once under SGLang's real adder and publication timing."""

from __future__ import annotations

import pytest
from pass_model import PassModel, group_requests

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sglang.options import FeatherOptions

GROUPS, SIZE = 6, 8


def _run(policy: str, *, overlap: bool, seed: int, page_size: int = 1, chunked: int | None = None, **kw):
    options = FeatherOptions(AdmissionConfig(chunk_size=16, **kw)) if policy == "feather" else None
    model = PassModel(policy, options, overlap=overlap, page_size=page_size, chunked_prefill_size=chunked)
    for rid, ids, group, prefix_len in group_requests(GROUPS, SIZE, prefix_len=96, suffix_len=12, seed=seed):
        model.add(rid, ids, group, prefix_len)
    stats = model.run()
    assert sorted(stats.admitted) == sorted(model.group_of), "every request admitted exactly once"
    return model, stats


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("stopper", ["always", "ucb"])
def test_each_cold_group_prefix_is_computed_once(overlap, seed, stopper):
    model, stats = _run("feather", overlap=overlap, seed=seed, stopper=stopper)
    assert sum(stats.cold_prefills.values()) == GROUPS, stats.cold_prefills
    assert model.policy.feather.admission.stats.num_deferred > 0


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("max_prefill_tokens", [256, 16384])
def test_budgets_and_page_sizes(page_size, max_prefill_tokens):
    options = FeatherOptions(AdmissionConfig(chunk_size=16, stopper="always"))
    model = PassModel("feather", options, page_size=page_size, max_prefill_tokens=max_prefill_tokens)
    for rid, ids, group, prefix_len in group_requests(GROUPS, SIZE, prefix_len=96, suffix_len=12, seed=7):
        model.add(rid, ids, group, prefix_len)
    stats = model.run()
    assert sorted(stats.admitted) == sorted(model.group_of)
    assert sum(stats.cold_prefills.values()) == GROUPS, stats.cold_prefills


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_leader_split_across_passes_by_chunked_prefill(overlap):
    """A 96-token prefix prefilled in 40-token chunks: followers wait until the whole prefix is cached."""
    model, stats = _run("feather", overlap=overlap, seed=3, chunked=40, stopper="always")
    assert sum(stats.cold_prefills.values()) == GROUPS, stats.cold_prefills


def test_deferral_off_recomputes_and_sglang_policies_for_comparison():
    """The property is Feather's deferral: without it (and with SGLang's FCFS) cold groups recompute."""
    _, off = _run("feather", overlap=True, seed=0, stopper="always", defer_uncached_prefix=False)
    _, fcfs = _run("fcfs", overlap=True, seed=0)
    assert sum(off.cold_prefills.values()) > GROUPS
    assert sum(fcfs.cold_prefills.values()) > GROUPS


def test_no_holder_in_flight_means_no_deferral():
    """Requests that share nothing are never held back: one pass admits them all (FCFS among strangers)."""
    options = FeatherOptions(AdmissionConfig(chunk_size=16, stopper="always"))
    model = PassModel("feather", options)
    for n in range(10):
        model.add(f"s{n}", [n * 1000 + t + 1 for t in range(40 + 30 * (n % 3))], group=n, prefix_len=0)
    admitted = model.step()
    assert [r.rid for r in admitted] == [f"s{n}" for n in range(10)], "arrival order, whatever the length"
    assert model.policy.feather.admission.stats.num_deferred == 0
