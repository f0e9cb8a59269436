"""Cost-model sanity: time grows with bytes and FLOPs; a homogeneous batch is never slower than a mixed one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_feather.sim.cost import KVSplit


def test_decode_is_monotone_in_kv_bytes_and_batch(cost):
    base = cost.decode_s(8, KVSplit(10_000, 0))
    assert cost.decode_s(8, KVSplit(20_000, 0)) > base
    assert cost.decode_s(8, KVSplit(10_000, 5_000)) >= base  # free while the DRAM reads are the slower part
    assert cost.decode_s(8, KVSplit(10_000, 50_000)) > base
    assert cost.decode_s(9, KVSplit(10_000, 0)) > base
    assert cost.decode_s(8, KVSplit(5_000, 5_000)) < base


def test_prefill_is_monotone_in_new_and_cached_tokens(cost):
    assert cost.prefill_s([2000], [0]) > cost.prefill_s([1000], [0])
    assert cost.prefill_s([1000], [4000]) > cost.prefill_s([1000], [0])
    assert cost.prefill_s([1000, 1000], [0, 0]) > cost.prefill_s([1000], [0])


def _batch(num_groups: int, per_group: int, prefix: int, interleaved: bool):
    reqs = [(g, i) for g in range(num_groups) for i in range(per_group)]
    if interleaved:
        reqs.sort(key=lambda gi: (gi[1], gi[0]))
    return [((f"g{g}", prefix),) for g, _ in reqs]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 16), st.integers(1, 80), st.integers(16, 20_000))
def test_contiguous_groups_never_slower_than_interleaved(cost, num_groups, per_group, prefix):
    contiguous = cost.shared_split(_batch(num_groups, per_group, prefix, False))
    interleaved = cost.shared_split(_batch(num_groups, per_group, prefix, True))
    n = num_groups * per_group
    assert contiguous.dram_tokens + contiguous.l2_tokens == interleaved.dram_tokens + interleaved.l2_tokens
    assert cost.decode_s(n, contiguous) <= cost.decode_s(n, interleaved)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 200), st.integers(16, 20_000))
def test_homogeneous_batch_never_slower_than_unshared(cost, n, prefix):
    shared = cost.shared_split([(("p", prefix),)] * n)
    unshared = cost.shared_split([((f"p{i}", prefix),) for i in range(n)])
    assert cost.decode_s(n, shared) <= cost.decode_s(n, unshared)
    assert unshared.l2_tokens == 0


def test_prefix_that_fits_l2_is_read_once_per_window(cost):
    prefix = int(cost.l2_usable_tokens // 2)
    split = cost.shared_split([(("p", prefix),)] * 10)
    assert split.dram_tokens == prefix and split.l2_tokens == 9 * prefix
    too_big = int(cost.l2_usable_tokens) + 16
    split = cost.shared_split([(("p", too_big),)] * 10)
    assert split.l2_tokens == 0
