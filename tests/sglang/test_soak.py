"""Thousands of requests through Feather's plugin hooks on real SGLang objects: flat memory, drained indexes."""

from __future__ import annotations

import pytest

from sglang_feather.admission import component as admission_component
from sglang_feather.bench import cht_side
from sglang_feather.cht.nodes import COMPACT_MIN
from sglang_feather.offline.soak import SoakConfig, run_soak

CONFIG = SoakConfig(
    num_requests=2_000,
    warmup_requests=600,
    num_waiting=128,
    max_new_tokens=8,
    abort_p=0.2,
    retract_p=0.2,
    num_checkpoints=4,
)


@pytest.mark.parametrize("backend", list(cht_side.backends()))
def test_soak_memory_is_flat_and_every_index_drains(backend, monkeypatch):
    # The Python tree's memory is visible to tracemalloc; the compiled one's only to its own counters.
    monkeypatch.setattr(admission_component, "new_tree", cht_side.backends()[backend])
    result = run_soak(CONFIG)

    assert result.num_finished + result.num_aborted == CONFIG.num_requests
    assert result.num_aborted > 10 and result.num_retracted > 10
    assert result.num_errors == 0 and result.num_drift == 0
    assert result.num_misses == 0, "the mirror's sorted part followed the queue (checked at every checkpoint)"
    assert result.traced_growth_mb < 1.0, result.at_end
    assert result.feather_traced_growth_mb < 0.5, result.at_end
    loaded = max(c.tracked["tree_requests"] for c in result.checkpoints)
    assert loaded > CONFIG.num_waiting  # the checkpoints saw full queues and a running batch
    for drained in (result.after_warmup, result.at_end):
        tracked = dict(drained.tracked)
        # The root heaps keep at most COMPACT_MIN stale entries each once nothing is tracked.
        assert tracked.pop("tree_index_entries") <= 3 * COMPACT_MIN
        tracked.pop("records")  # not an index: decisions awaiting their reward, cleared by the next window
        assert set(tracked.values()) == {0}, drained.tracked
