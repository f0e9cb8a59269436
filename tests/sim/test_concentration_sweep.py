"""The concentration sweep: its 81-cell grid, and the table and map its runs are summarised into."""

import json

import pytest

from sglang_feather.sim import sweeps
from sglang_feather.sim.plots import plot_concentration_map


def test_the_grid_is_the_issues_81_cells_with_the_private_split_stated():
    cases = list(sweeps.concentration_cases())
    assert len(cases) == 81 and len({c.label for c in cases}) == 81
    specs = [c.knobs.spec for c in cases]
    assert {s.question_len + s.output_len for s in specs} == {128, 512, 2048}
    assert {s.num_groups for s in specs} == {8, 32, 128}
    assert {s.prefix_len for s in specs} == {1024, 4096, 16384}
    assert {c.gpu for c in cases} == {"a100-80gb", "h200", "rtx6000-ada"}
    assert all(s.popularity == "zipf" and s.zipf_alpha == 1.1 and s.rate == 40.0 for s in specs)


def _row(case, policy, tok_s, held=0):
    return {
        "case": case,
        "policy": policy,
        "output_tok_s": tok_s,
        "groups_per_decode_step": 2.0,
        "mean_decode_batch": 10.0,
        "locked_tokens_per_decode_step": 1000.0,
        "feather_num_concentrated": held,
        "batch_order": "admission",
        "seed": 0,
    }


def test_the_table_takes_the_better_baseline_and_counts_cells_below_the_bar(tmp_path):
    rows = [
        _row("h200 8g 1K private128", "fcfs", 100.0),
        _row("h200 8g 1K private128", "dfs-weight", 90.0),
        _row("h200 8g 1K private128", "feather", 99.0, held=3),
        _row("h200 8g 1K private128", "feather-noconc", 90.0),
        _row("h200 32g 1K private128", "fcfs", 100.0),
        _row("h200 32g 1K private128", "dfs-weight", 120.0),
        _row("h200 32g 1K private128", "feather", 108.0),
        _row("h200 32g 1K private128", "feather-noconc", 108.0),
    ]
    cells = sweeps.concentration_rows(rows)
    assert [c["best_baseline"] for c in cells] == ["fcfs", "dfs-weight"]
    assert [c["x_best"] for c in cells] == pytest.approx([0.99, 0.9])
    assert cells[0]["x_noconc"] == pytest.approx(1.1) and cells[0]["num_concentrated"] == 3
    table = sweeps.concentration_table(rows)
    assert "cells below 0.98: 1" in table and "min 0.900 (h200 32g 1K private128)" in table
    path = plot_concentration_map(cells, tmp_path / "map.png")
    assert path.stat().st_size > 1000


def test_the_sweep_reprints_saved_runs_with_its_table(tmp_path, capsys):
    saved = tmp_path / "runs.json"
    saved.write_text(
        json.dumps(
            [
                _row("a100-80gb 8g 4K private512", p, t)
                for p, t in (("fcfs", 50.0), ("dfs-weight", 60.0), ("feather", 61.0))
            ]
        )
    )
    assert sweeps.main(["concentration", "--load", str(saved)]) == 0
    assert "x best (dfs/fcfs)" in capsys.readouterr().out
