"""`python -m kernels_bench.serving --dry-small` runs a baseline and Feather end to end on CPU and writes JSON and a
plot (the other policies are the same code path with another `--schedule-policy`: tests/serving checks the argv)."""

import json
import subprocess
import sys

from conftest import REPO

POLICIES = ["fcfs", "feather"]


def test_dry_small_runs_a_baseline_and_feather_on_every_workload(tmp_path, tiny_model):
    out = tmp_path / "serving"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels_bench.serving",
            "--dry-small",
            "--policies",
            ",".join(POLICIES),
            "--model",
            tiny_model,
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    assert [run["policy"] for run in results["runs"]] == POLICIES
    for policy_run in results["runs"]:
        benches = [run["bench"] for run in policy_run["runs"]]
        assert [b["workload"] for b in benches] == ["shared-128", "no-sharing"]
        assert all(b["completed"] == b["num_requests"] for b in benches), benches
    shared, alone = results["runs"][0]["runs"][0]["bench"], results["runs"][0]["runs"][1]["bench"]
    assert shared["cache_hit_rate"] > 0 and alone["cache_hit_rate"] == 0
    assert results["runs"][-1]["runs"][0]["feather"], "feather run exported no Feather metrics"
    assert (out / "results.png").stat().st_size > 0
    assert "shared-128" in (out / "table.txt").read_text()
