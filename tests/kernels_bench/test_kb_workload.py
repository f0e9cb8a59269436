"""Page tables of prefix-sharing workloads: layout, byte counting and batch order."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_bench.sweep import PRESETS
from kernels_bench.workload import (
    LLAMA3_8B,
    HeadShape,
    WorkloadError,
    WorkloadSpec,
    build_workload,
)
from sglang_feather.workload import ORDERS


def referenced_slots(workload) -> list[np.ndarray]:
    """Every cache slot each request attends to, enumerated token by token from its page table."""
    page_size = workload.spec.page_size
    out = []
    for table, length in zip(workload.page_table, workload.seq_lens, strict=True):
        positions = np.arange(length)
        out.append(table[positions // page_size].astype(np.int64) * page_size + positions % page_size)
    return out


specs = st.builds(
    lambda batch, groups_frac, prefix, suffix, page, order, seed: WorkloadSpec(
        batch_size=batch,
        num_groups=max(1, round(groups_frac * batch)),
        prefix_len=prefix,
        suffix_len=suffix,
        page_size=page,
        order=order,
        seed=seed,
    ),
    st.integers(1, 24),
    st.floats(0.0, 1.0),
    st.integers(0, 70),
    st.integers(1, 30),
    st.sampled_from([1, 2, 3, 4, 16]),
    st.sampled_from(sorted(ORDERS)),
    st.integers(0, 3),
)


@settings(max_examples=60, deadline=None)
@given(specs)
def test_unique_and_total_bytes_match_the_slots_the_page_tables_reference(spec):
    workload = build_workload(spec)
    shape = HeadShape(num_q_heads=4, num_kv_heads=2, head_dim=8, dtype_bytes=2)
    slots = referenced_slots(workload)
    counts = workload.byte_counts(shape)
    assert counts.total_kv == sum(len(s) for s in slots) * shape.kv_bytes_per_token
    assert counts.unique_kv == len(np.unique(np.concatenate(slots))) * shape.kv_bytes_per_token
    assert counts.io == 2 * spec.batch_size * shape.q_bytes_per_request
    assert int(workload.page_table.max()) < workload.num_pages


@settings(max_examples=60, deadline=None)
@given(specs)
def test_requests_share_exactly_their_groups_full_prefix_pages(spec):
    workload = build_workload(spec)
    shared = spec.num_shared_pages
    pages_by_group: dict[int, set[tuple[int, ...]]] = {}
    for group, table in zip(workload.group_ids, workload.page_table, strict=True):
        pages_by_group.setdefault(int(group), set()).add(tuple(table[:shared]))
    assert all(len(prefixes) == 1 for prefixes in pages_by_group.values())
    prefix_pages = [set(next(iter(p))) for p in pages_by_group.values()]
    assert sum(len(p) for p in prefix_pages) == len(set().union(*prefix_pages))
    own = workload.page_table[:, shared:]
    assert len(np.unique(own)) == own.size
    assert not set(own.ravel().tolist()) & set().union(*prefix_pages)


def test_paper_shape_counts_each_shared_prefix_once():
    spec = WorkloadSpec(batch_size=800, num_groups=8, prefix_len=10000, suffix_len=20, page_size=16)
    counts = build_workload(spec).byte_counts(LLAMA3_8B)
    per_token = LLAMA3_8B.kv_bytes_per_token
    assert per_token == 2 * 8 * 128 * 2
    assert counts.total_kv == 800 * (10000 + 20) * per_token
    assert counts.unique_kv == (8 * 10000 + 800 * 20) * per_token
    assert counts.repeated_kv == counts.total_kv - counts.unique_kv


def test_prefix_tail_that_does_not_fill_a_page_is_private():
    spec = WorkloadSpec(batch_size=4, num_groups=1, prefix_len=1000, suffix_len=20, page_size=16)
    assert spec.num_shared_pages == 62
    assert spec.num_own_tokens == 1000 - 62 * 16 + 20
    counts = build_workload(spec).byte_counts(LLAMA3_8B)
    assert counts.unique_kv == (62 * 16 + 4 * spec.num_own_tokens) * LLAMA3_8B.kv_bytes_per_token


def test_contiguous_order_keeps_groups_together_and_interleaved_alternates():
    base = dict(batch_size=12, num_groups=3, prefix_len=32, suffix_len=4, page_size=16)
    contiguous = build_workload(WorkloadSpec(order="contiguous", **base)).group_ids
    interleaved = build_workload(WorkloadSpec(order="interleaved", **base)).group_ids
    shuffled = build_workload(WorkloadSpec(order="random", **base)).group_ids
    assert np.all(np.diff(contiguous) >= 0)
    assert np.count_nonzero(np.diff(contiguous)) == 2
    assert np.all(interleaved[1:] != interleaved[:-1])
    assert interleaved[:3].tolist() == sorted(set(interleaved.tolist()))
    assert Counter(contiguous.tolist()) == Counter(interleaved.tolist()) == Counter(shuffled.tolist())
    again = build_workload(WorkloadSpec(order="random", **base)).group_ids
    assert shuffled.tolist() == again.tolist()


def test_uneven_groups_interleave_until_the_small_groups_run_out():
    groups = build_workload(
        WorkloadSpec(batch_size=7, num_groups=3, prefix_len=16, suffix_len=1, order="interleaved")
    ).group_ids
    assert groups.tolist() == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=0, num_groups=1, prefix_len=10, suffix_len=1),
        dict(batch_size=4, num_groups=5, prefix_len=10, suffix_len=1),
        dict(batch_size=4, num_groups=0, prefix_len=10, suffix_len=1),
        dict(batch_size=4, num_groups=2, prefix_len=0, suffix_len=0),
        dict(batch_size=4, num_groups=2, prefix_len=10, suffix_len=1, page_size=0),
        dict(batch_size=4, num_groups=2, prefix_len=10, suffix_len=1, order="sorted"),
    ],
)
def test_bad_specs_raise_workload_error(kwargs):
    with pytest.raises(WorkloadError):
        WorkloadSpec(**kwargs)


def test_head_shape_rejects_heads_that_do_not_group():
    with pytest.raises(WorkloadError):
        HeadShape(num_q_heads=30, num_kv_heads=8)


def test_sweep_varies_order_only_for_mixed_batches():
    specs = list(PRESETS["reduced"].specs())
    for spec in specs:
        if spec.num_groups in (1, spec.batch_size):
            assert spec.order == "contiguous"
    mixed = [s for s in specs if 1 < s.num_groups < s.batch_size]
    assert {s.order for s in mixed} == {"contiguous", "interleaved"}
    assert len(specs) == len(set(specs))
    assert {s.prefix_len for s in specs} == {1000, 4000, 10000}
