"""Feather's learning stoppers under continuous (Poisson) arrivals keep up with the offered load."""

from __future__ import annotations

import pytest
from sim_helpers import run

from sglang_feather.sim.report import summarize
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec


def _throughput(log) -> float:
    return summarize("feather", log).output_tok_s


@pytest.mark.parametrize("stopper", ["ucb", "qlearn"])
def test_learning_stopper_serves_poisson_arrivals_like_fcfs(cost, stopper):
    """Regression: with the prefill's time inside the reward window of the ADD that caused it, a STOP (a bare
    decode step) always earned more, ucb learned to stop, and the batch starved while the queue grew (1467 vs
    6448 tok/s on 64 groups x 8 at 32 req/s, H200). The stopped request is prefilled later anyway, so the
    window now measures decode steps only."""
    requests = make_workload(
        "gsp",
        WorkloadConfig(
            SharedPrefixSpec.per_group(
                16, 8, prefix_len=2048, question_len=32, output_len=128, rate=32, seed=0
            )
        ),
    )
    fcfs = _throughput(run(requests, cost, "fcfs"))
    feather = _throughput(run(requests, cost, "feather", stopper=stopper))
    assert feather >= 0.95 * fcfs, (feather, fcfs)
