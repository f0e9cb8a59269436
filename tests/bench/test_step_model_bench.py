"""Smoke test of `bench step-model` (timings are never asserted, only that both calls were timed)."""

import json

from sglang_feather.bench.__main__ import main


def test_the_benchmark_times_both_calls(tmp_path, capsys):
    path = tmp_path / "step.json"
    assert (
        main(["step-model", "--steps", "50", "--consults", "10", "--rounds", "2", "--json", str(path)]) == 0
    )
    result = json.loads(path.read_text())
    assert len(result["step_us"]) == 2 and all(t > 0 for t in result["consult_us"])
    assert "`observe_step` (fit update)" in capsys.readouterr().out
