"""JSONL traces round-trip exactly, and malformed traces raise TraceError naming the line."""

from __future__ import annotations

import json

import pytest
from sim_helpers import run

from sglang_feather.sim.trace import SimRequest, TraceError, read_jsonl, write_jsonl
from sglang_feather.sim.workloads import WORKLOADS, WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec

SMALL = WorkloadConfig(
    SharedPrefixSpec(num_groups=2, num_requests=5, prefix_len=50, num_turns=2, output_len=5),
    prompt_len=40,
    num_docs=2,
    doc_len_range=(60, 90),
    questions_range=(2, 3),
)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_round_trips(tmp_path, name):
    reqs = make_workload(name, SMALL)
    path = tmp_path / "t.jsonl"
    write_jsonl(reqs, path)
    assert read_jsonl(path) == reqs


def test_explicit_token_ids_replay_like_segments(tmp_path, cost):
    shared = list(range(1, 200))
    reqs = [SimRequest(f"r{i}", 0.0, 4, prompt_ids=tuple(shared + [500 + i] * 10)) for i in range(4)]
    write_jsonl(reqs, tmp_path / "ids.jsonl")
    back = read_jsonl(tmp_path / "ids.jsonl")
    assert back == reqs
    log = run(back, cost, "feather")
    assert sorted(r.rid for r in log.requests) == [r.rid for r in reqs]


def test_seeded_workloads_repeat_and_differ_by_seed():
    assert make_workload("gsp", SMALL) == make_workload("gsp", SMALL)
    other = make_workload("gsp", SMALL.with_spec(seed=1))
    assert other != make_workload("gsp", SMALL)


@pytest.mark.parametrize(
    "record",
    [
        {"rid": "a", "output_len": 3},
        {"rid": "a", "output_len": 3, "segments": [["s", 4]], "prompt_ids": [1]},
        {"rid": "a", "output_len": 0, "segments": [["s", 4]]},
        {"rid": "a", "output_len": "x", "segments": [["s", 4]]},
        {"rid": "a", "output_len": 2, "segments": [["s", 4]], "follows": "nobody"},
    ],
)
def test_bad_records_raise(tmp_path, record):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(TraceError):
        read_jsonl(path)


def test_not_json_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"rid": "a", "output_len": 2, "segments": [["s", 4]]}\n{oops\n')
    with pytest.raises(TraceError, match=":2:"):
        read_jsonl(path)
