"""Without sharing, reordering has nothing to gain: every policy's throughput is within 2% of FCFS.

Scheduler CPU is charged as zero here so that only ordering and batching decisions are compared; the
measured CPU cost is reported by the CLI instead.
"""

from __future__ import annotations

import pytest
from sim_helpers import run

from sglang_feather.policy import policy_names
from sglang_feather.sim.report import summarize
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec

RUNS = [("lpm", None), ("dfs-weight", None)] + [("feather", s) for s in policy_names()]


@pytest.fixture(scope="module")
def no_sharing():
    return make_workload(
        "none", WorkloadConfig(SharedPrefixSpec(num_requests=60, output_len=30, seed=1), prompt_len=700)
    )


@pytest.fixture(scope="module")
def fcfs_tput(cost, no_sharing):
    return summarize("fcfs", run(no_sharing, cost, "fcfs")).output_tok_s


@pytest.mark.parametrize(("policy", "stopper"), RUNS)
def test_no_sharing_parity_with_fcfs(cost, no_sharing, fcfs_tput, policy, stopper):
    spec = {} if stopper is None else {"stopper": stopper}
    s = summarize(policy, run(no_sharing, cost, policy, **spec))
    assert abs(s.output_tok_s / fcfs_tput - 1) <= 0.02, (s.output_tok_s, fcfs_tput, s.mean_decode_batch)
