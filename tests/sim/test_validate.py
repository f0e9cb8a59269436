"""The cost model held to published measurements (`sim/validate.py`)."""

from __future__ import annotations

import pytest

from sglang_feather.sim.validate import ROWS, Published, Scoring, judge, main, outlier_effect


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_scored_row_is_within_tolerance_or_its_miss_is_explained(row):
    verdict = judge(row)
    if row.scoring is Scoring.OUT_OF_SCOPE:
        assert row.predict is None and row.note.startswith("missing input: "), row
        return
    assert verdict.predicted is not None
    if row.scoring is Scoring.IN_SAMPLE:
        assert "set from this row" in row.note, row
        return
    # A stated miss must still miss (a model change that fixes it must drop the note), and nothing else may.
    assert verdict.within is (not row.note), (row.name, verdict.predicted, row.measured)


def test_points_are_judged_by_distance_and_sign():
    def row(measured: float, predicted: float) -> Published:
        return Published("r", "s", "x", measured, "%", Scoring.POINTS, lambda: predicted)

    assert judge(row(-3.9, -1.7)).within
    assert not judge(row(-3.9, 1.0)).within  # within 5 points, wrong sign
    assert not judge(row(12.0, 0.0)).within
    ratio = Published("r", "s", "x", 10.0, "ms", Scoring.RATIO, lambda: 12.4)
    assert (
        judge(ratio).within
        and not judge(Published("r", "s", "x", 10.0, "ms", Scoring.RATIO, lambda: 12.6)).within
    )


def test_the_papers_one_outlier_halves_throughput_only_under_the_all_or_nothing_cascade():
    for gpu in ("rtx6000-ada", "a100-80gb"):
        assert outlier_effect(gpu, "cascade", 2048) < 0.5
        for kernel in ("plain", "plain-fa2", "grouped"):
            assert outlier_effect(gpu, kernel, 2048) > 0.99


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("| MISS") == sum(
        1 for r in ROWS if r.note and r.scoring in (Scoring.POINTS, Scoring.RATIO)
    )
    assert out.read_text().count('"name"') == len(ROWS)
