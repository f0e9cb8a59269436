"""Smoke test of `bench adapter` on real SGLang 0.5.23 objects (timings are never asserted)."""

from __future__ import annotations

import json

from sglang_feather.bench import __main__ as cli
from sglang_feather.bench import adapter


def test_tiny_run_measures_both_sides_through_the_plugin(tmp_path):
    out = tmp_path / "adapter.json"
    args = cli.build_parser().parse_args(
        ["adapter", "--queue-sizes", "12", "--prompt-lens", "256", "--running", "4,8", "--repeat", "2"]
        + ["--decode-block", "3", "--json", str(out)]
    )
    assert args.main(args) == 0
    result = json.loads(out.read_text())
    cells = result["cells"]
    assert [(c["num_waiting"], c["prompt_len"], c["num_running"]) for c in cells] == [
        (12, 256, 4),
        (12, 256, 8),
    ]
    for c in cells:
        assert c["num_samples"] == 2
        # Both sides admit under SGLang's budgets; Feather's own share is part of its whole pass.
        assert c["baseline_admitted"] > 0 and c["feather_admitted"] > 0
        assert c["feather_step_admitted"] == c["feather_admitted"], "the step path admits as the planned pass"
        assert c["plan_gain"] > 0 and c["feather_step_adapter_s"]["median"] > 0
        assert 0 < c["feather_adapter_s"]["median"] <= c["feather_pass_s"]["max"]
        assert c["baseline_calc_priority_s"]["median"] <= c["baseline_pass_s"]["max"]
        for key in ("decode_step_s", "self_check_s"):
            assert 0 < c[key]["min"] <= c[key]["median"] <= c[key]["max"]
        assert c["calc_priority_ratio"] > 0 and c["pass_ratio"] > 0
    table = adapter.markdown(result).splitlines()
    assert result["meta"]["tree_cache"] == "UnifiedRadixCache (RustUnifiedTreeCore)"
    assert "SGLang tree cache: UnifiedRadixCache (RustUnifiedTreeCore)." in table
    assert sum(line.startswith("| 12 | 256 |") for line in table) == 2


def test_metrics_flag_runs_feathers_sides_with_their_prometheus_series(tmp_path, monkeypatch):
    from sglang_feather.offline import bench_adapter
    from sglang_feather.sglang.metrics import FeatherMetrics

    built = []
    monkeypatch.setattr(FeatherMetrics, "__init__", _recording(FeatherMetrics.__init__, built))
    out = tmp_path / "adapter.json"
    args = cli.build_parser().parse_args(
        ["adapter", "--queue-sizes", "12", "--prompt-lens", "256", "--running", "4", "--repeat", "2"]
        + ["--decode-block", "3", "--metrics", "--json", str(out)]
    )
    assert args.main(args) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["metrics"] is True
    assert "Feather's Prometheus series on (--enable-metrics)" in adapter.markdown(result)
    assert len(built) == 2, "the planned and the step-path harness, each with its own series"
    (cell,) = result["cells"]
    assert cell["feather_admitted"] > 0
    labels = {key: str(value) for key, value in bench_adapter.METRICS_LABELS.items()}
    admissions = [m.registry.get_sample_value("sglang:feather_admissions_total", labels) for m in built]
    assert all(n >= 2 * cell["feather_admitted"] for n in admissions), "every sample's admissions counted"


def _recording(init, built):
    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    return record
