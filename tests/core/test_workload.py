"""The shared-prefix workload spec: group sizes, arrival orders, turns, tokens shared exactly by segment, and the
command-line flags generated from its fields."""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_feather.workload import (
    FLAGS,
    ORDERS,
    POPULARITY,
    SharedPrefixSpec,
    WorkloadError,
    WorkloadFlags,
    concat_tokens,
    segment_tokens,
)

specs = st.builds(
    lambda groups, extra, prefix, question, popularity, order, turns, seed: SharedPrefixSpec(
        num_groups=groups,
        num_requests=groups + extra,
        prefix_len=prefix,
        question_len=question,
        output_len=3,
        popularity=popularity,
        order=order,
        num_turns=turns,
        seed=seed,
    ),
    st.integers(1, 6),
    st.integers(0, 20),
    st.integers(0, 40),
    st.integers(1, 9),
    st.sampled_from(sorted(POPULARITY)),
    st.sampled_from(sorted(ORDERS)),
    st.integers(1, 3),
    st.integers(0, 5),
)


@settings(max_examples=60, deadline=None)
@given(specs)
def test_every_conversation_appears_once_per_turn_with_its_groups_prefix(spec):
    requests = spec.requests()
    sizes = spec.group_sizes()
    assert sizes.sum() == spec.num_requests and (sizes >= 1).all()
    assert len(requests) == spec.num_requests * spec.num_turns
    assert len({r.rid for r in requests}) == len(requests)
    firsts = [r for r in requests if r.turn == 0]
    assert Counter(r.group for r in firsts) == {g: int(n) for g, n in enumerate(sizes)}
    assert spec.arrival_groups().tolist() == [r.group for r in firsts]
    seen = set()
    for r in requests:
        tokens = concat_tokens(r.segments)
        assert len(tokens) == r.prompt_len
        assert np.array_equal(tokens[: spec.prefix_len], spec.prefix_tokens(r.group))
        if r.follows is not None:
            assert r.follows in seen
            prev = next(p for p in requests if p.rid == r.follows)
            assert r.segments[: len(prev.segments)] == prev.segments
            assert r.segments[len(prev.segments)].key == prev.answer_key
        seen.add(r.rid)
    assert spec.requests() == requests


def test_different_groups_and_questions_share_no_tokens_by_accident():
    spec = SharedPrefixSpec.per_group(3, 4, prefix_len=64, question_len=16, seed=1)
    prompts = spec.prompts()
    prefixes = {tuple(p[:64]) for p in prompts}
    questions = {tuple(p[64:]) for p in prompts}
    assert len(prefixes) == 3 and len(questions) == 12
    assert all(np.array_equal(a, b) for a, b in zip(spec.prompts(), prompts, strict=True))
    other = SharedPrefixSpec.per_group(3, 4, prefix_len=64, question_len=16, seed=2).prompts()
    assert not any(np.array_equal(a[:64], b[:64]) for a in prompts for b in other)


def test_orders_contiguous_interleaved_and_seeded_random():
    base = dict(num_groups=3, num_requests=7, prefix_len=8)
    assert SharedPrefixSpec(order="contiguous", **base).arrival_groups().tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert SharedPrefixSpec(order="interleaved", **base).arrival_groups().tolist() == [0, 1, 2, 0, 1, 2, 0]
    shuffled = SharedPrefixSpec(order="random", seed=4, **base).arrival_groups().tolist()
    assert shuffled == SharedPrefixSpec(order="random", seed=4, **base).arrival_groups().tolist()
    assert sorted(shuffled) == [0, 0, 0, 1, 1, 2, 2]


def test_zipf_sizes_follow_rank_popularity():
    sizes = SharedPrefixSpec(num_groups=4, num_requests=100, popularity="zipf", zipf_alpha=1.0).group_sizes()
    assert sizes.tolist() == [48, 24, 16, 12]
    rounded = SharedPrefixSpec(num_groups=3, num_requests=10, popularity="zipf").group_sizes()
    assert rounded.tolist() == [7, 2, 1]
    assert SharedPrefixSpec(num_groups=4, num_requests=10).group_sizes().tolist() == [3, 3, 2, 2]


def test_poisson_arrivals_increase_and_followers_wait_for_their_turn():
    spec = SharedPrefixSpec(num_groups=2, num_requests=6, prefix_len=8, num_turns=2, rate=10.0, seed=3)
    requests = spec.requests()
    times = [r.arrival_s for r in requests if r.turn == 0]
    assert all(b > a for a, b in zip(times, times[1:], strict=False)) and times[0] > 0
    assert all(r.arrival_s == 0.0 and r.follows for r in requests if r.turn == 1)


def test_segment_tokens_are_a_pure_prefix_stable_function_of_the_key():
    long = segment_tokens("k", 100)
    assert np.array_equal(segment_tokens("k", 30), long[:30])
    assert long.dtype == np.int32 and long.min() >= 1 and long.max() < 128_000
    tiny = segment_tokens("k", 500, low=4, high=1024)
    assert tiny.min() >= 4 and tiny.max() < 1024


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_groups=0), "num_groups"),
        (dict(num_requests=0), "num_requests"),
        (dict(num_groups=5, num_requests=4), "exceeds"),
        (dict(prefix_len=0, question_len=0), "non-empty"),
        (dict(prefix_len=-1), "prefix_len"),
        (dict(output_len=0), "output_len"),
        (dict(num_turns=0), "num_turns"),
        (dict(popularity="pareto"), "popularity"),
        (dict(order="sorted"), "order"),
        (dict(rate=0.0), "rate"),
        (dict(zipf_alpha=-1.0), "zipf_alpha"),
    ],
)
def test_bad_specs_raise_workload_error(kwargs, match):
    with pytest.raises(WorkloadError, match=match):
        SharedPrefixSpec(**{**dict(num_groups=2, num_requests=4), **kwargs})


def _flags(flags: WorkloadFlags, argv: list[str], **aliases) -> SharedPrefixSpec:
    parser = argparse.ArgumentParser()
    flags.add_to(parser, aliases)
    return flags.spec(parser.parse_args(argv))


def test_flags_are_generated_from_the_fields_with_a_tools_defaults():
    assert [opt.name for opt in FLAGS] == [f.name for f in fields(SharedPrefixSpec)]
    assert all(opt.flag() == "--" + opt.name.replace("_", "-") and opt.dest() == opt.name for opt in FLAGS)
    base = SharedPrefixSpec.per_group(4, 5, prefix_len=64, order="interleaved")
    flags = WorkloadFlags(base, names=("num_groups", "prefix_len", "order"), per_group=True)
    assert {opt.name: opt.default for opt in flags.options()} == {
        "num_groups": 4,
        "prefix_len": 64,
        "order": "interleaved",
        "prompts_per_group": 5,
    }
    assert _flags(flags, []) == base
    assert _flags(flags, ["--num-groups", "2"]) == replace(base, num_groups=2, num_requests=10)
    assert _flags(flags, ["--prompts-per-group", "3", "--prefix-len", "8"]) == replace(
        base, num_requests=12, prefix_len=8
    )
    with pytest.raises(SystemExit):
        _flags(flags, ["--seed", "3"])
    with pytest.raises(ValueError, match="group_size"):
        WorkloadFlags(base, names=("group_size",))


def test_flags_without_per_group_and_with_aliases():
    flags = WorkloadFlags(SharedPrefixSpec(num_groups=2, num_requests=4))
    assert "prompts_per_group" not in {opt.name for opt in flags.options()}
    spec = _flags(flags, ["--groups", "3", "--rate", "2.5", "--num-turns", "2"], num_groups=("--groups",))
    assert spec == SharedPrefixSpec(num_groups=3, num_requests=4, rate=2.5, num_turns=2)
    parser = argparse.ArgumentParser()
    flags.add_to(parser)
    assert flags.spec(parser.parse_args(["--num-groups", "3"]), per_group=False).num_requests == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-groups", "9"], "--num-groups (9) exceeds num_requests (8)"),
        (["--prompts-per-group", "0"], "--prompts-per-group must be a positive integer, got 0"),
        (
            ["--order", "sorted"],
            "--order must be one of ['contiguous', 'interleaved', 'random'], got 'sorted'",
        ),
        (["--prefix-len", "0", "--question-len", "0"], "--prefix-len and question_len are both 0"),
    ],
)
def test_flag_errors_name_the_flag(argv, message):
    flags = WorkloadFlags(
        SharedPrefixSpec(num_groups=2, num_requests=8), per_group="--prompts-per-group" in argv
    )
    with pytest.raises(WorkloadError) as err:
        _flags(flags, argv)
    assert str(err.value).startswith(message)


def test_length_ranges_draw_within_bounds_and_leave_the_fixed_trace_alone():
    base = SharedPrefixSpec(num_groups=4, num_requests=40, question_len=100, output_len=128, rate=5.0, seed=3)
    ranged = replace(base, question_len_max=800, output_len_max=256)
    fixed, drawn = base.requests(), ranged.requests()
    assert [(r.rid, r.arrival_s) for r in fixed] == [(r.rid, r.arrival_s) for r in drawn], (
        "same order and arrivals"
    )
    questions = [r.segments[-1].num_tokens for r in drawn]
    outputs = [r.output_len for r in drawn]
    assert all(100 <= q <= 800 for q in questions) and len(set(questions)) > 10
    assert all(128 <= o <= 256 for o in outputs) and len(set(outputs)) > 10
    assert {r.segments[-1].num_tokens for r in fixed} == {100} and {r.output_len for r in fixed} == {128}
    with pytest.raises(WorkloadError, match="output_len_max"):
        replace(base, output_len_max=64)
