"""Smoke test of `bench events` on a real server-built SGLang cache (timings are never asserted)."""

from __future__ import annotations

import json

from sglang_feather.bench import __main__ as cli
from sglang_feather.bench import events


def test_the_translator_feeds_every_chunk_and_reports_sglangs_own_cost(tmp_path):
    out = tmp_path / "events.json"
    args = cli.build_parser().parse_args(
        ["events", "--page-sizes", "1,4", "--prompt-lens", "200", "--prompts", "3", "--rounds", "2"]
        + ["--json", str(out)]
    )
    assert args.main(args) == 0
    result = json.loads(out.read_text())
    cells = result["events"]
    assert [c["page_size"] for c in cells] == [1, 4]
    for c in cells:
        assert c["num_chunks"] == 3 * (200 // 64), "every whole chunk of every prompt is cached a round"
        for key in ("store_us_per_chunk", "evict_us_per_chunk"):
            assert 0 < c[key]["min"] <= c[key]["median"] <= c[key]["max"]
    lines = events.markdown(result).splitlines()
    assert sum(line.startswith("| 1 | 200 | 3 | 9 |") for line in lines) == 1
