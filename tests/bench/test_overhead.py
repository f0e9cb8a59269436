"""Smoke tests of the overhead benchmark against real SGLang 0.5.23 objects (timings are never asserted)."""

from __future__ import annotations

import json
import math

import pytest

from sglang_feather.bench import __main__ as cli
from sglang_feather.bench import cht_side, overhead, report
from sglang_feather.measure.sequence import SequencePlan
from sglang_feather.measure.timing import TimingConfig
from sglang_feather.measure.workloads import WORKLOADS, Workload, token_array
from sglang_feather.offline import bench_baseline
from sglang_feather.workload import segment_tokens

TINY_TIMING = TimingConfig(repeat=1, min_time_s=0.0, max_samples=1)


@pytest.mark.slow
def test_tiny_run_covers_every_cell_and_marks_lpm_fallback():
    cap = bench_baseline.prefix_match_cap()
    sizes = (8, cap + 2)
    plan = SequencePlan(num_per_pass=4, finish_after_passes=2)
    cfg = overhead.OverheadConfig(queue_sizes=sizes, prompt_lens=(128,), plan=plan, timing=TINY_TIMING)
    result = overhead.run(cfg)
    json.dumps(result)
    cells = result["cells"]
    assert [(c["workload"], c["num_waiting"]) for c in cells] == [(w, n) for w in WORKLOADS for n in sizes]
    for c in cells:
        num_waiting = c["num_waiting"]
        assert c["sglang"]["lpm"]["active_policy"] == ("fcfs" if num_waiting > cap else "lpm")
        assert c["sglang"]["dfs-weight"]["active_policy"] == "dfs-weight"
        assert c["cht"]["num_admitted"] == len(c["cht"]["picks"]) == min(4, num_waiting)
        assert set(c["cht"]["passes"]) == {"4", str(c["budget_k"])} and 1 <= c["budget_k"] <= num_waiting
        num_passes = math.ceil(num_waiting / 4)
        seq = c["sequence"]
        assert seq["cht"]["num_passes"] == num_passes
        assert (
            seq["cht"]["num_inserts"] == seq["cht"]["num_activate"] == seq["cht"]["num_finish"] == num_waiting
        )
        for policy in bench_baseline.POLICIES:
            assert seq["sglang"][policy]["num_passes"] == num_passes
            assert seq["sglang"][policy]["num_admitted"] == num_waiting
        assert (seq["sglang"]["lpm"]["num_fcfs_passes"] > 0) == (num_waiting > cap)
    table = report.overhead_markdown(result)
    assert result["meta"]["tree_cache"] == "UnifiedRadixCache (RustUnifiedTreeCore)"
    assert "SGLang tree cache: UnifiedRadixCache (RustUnifiedTreeCore)." in table
    pass_rows = report.pass_table(result)[2:]
    assert len(pass_rows) == len(cells)
    assert sum("→fcfs" in row for row in pass_rows) == len(WORKLOADS)
    assert "### Targets" in table
    read_rows = report.read_table(result)[2:]
    assert len(read_rows) == len(cells) and all(c["prompt_read_s"] > 0 for c in cells)


def _cached_groups() -> Workload:
    """Group A has 192 of its 256 tokens cached, group B 96, group C none; arrivals interleave C, B, A."""
    prefix = {g: token_array(segment_tokens(g, n)) for g, n in (("A", 192), ("B", 96), ("C", 192))}
    names = ["C", "B", "A"] * 4
    prompts = tuple(
        prefix[g] + token_array(segment_tokens(f"q{i}", 256 - len(prefix[g]))) for i, g in enumerate(names)
    )
    groups = tuple("CBA".index(g) for g in names)
    return Workload("cached-groups", prompts, groups, (prefix["A"], prefix["B"]), ())


def test_cht_picks_agree_with_sglang_lpm_on_cached_groups():
    workload = _cached_groups()
    bench_baseline.prepare()
    lpm = bench_baseline.sorted_order(bench_baseline.build_queue(workload), "lpm")
    cht = cht_side.picks(workload, chunk_size=16, num_per_pass=8)
    group_of = workload.groups
    assert [group_of[i] for i in lpm[:8]] == [2] * 4 + [1] * 4
    assert set(cht[:4]) == set(lpm[:4])
    assert set(cht[4:8]) == set(lpm[4:8])


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    argv = [
        "overhead",
        "--workloads",
        "shared",
        "--queue-sizes",
        "8",
        "--prompt-lens",
        "128",
        "--per-pass",
        "4",
    ]
    assert cli.main(argv + ["--repeat", "1", "--min-time", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["config"]["plan"]["num_per_pass"] == 4
    assert [c["num_waiting"] for c in result["cells"]] == [8]
    assert "| shared | 8 | 128 |" in capsys.readouterr().out


def test_chunk_size_sweep_quick(capsys):
    assert cli.main(["chunk-size", "--quick", "--repeat", "1", "--min-time", "0"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| shared |")]
    chunk_sizes = [int(row.split("|")[4]) for row in rows]
    num_nodes = [int(row.split("|")[5]) for row in rows]
    assert chunk_sizes == sorted(chunk_sizes) and len(chunk_sizes) == 3
    assert num_nodes == sorted(num_nodes, reverse=True) and num_nodes[0] > num_nodes[-1]
