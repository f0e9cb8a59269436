"""`python -m sglang_feather.cluster_demo`: its defaults, flags and the per-policy summary (no server)."""

from sglang_feather.cluster_demo import cluster_spec, format_summary, parse_args
from sglang_feather.serving.bench import BenchResult
from sglang_feather.serving.cluster import ClusterRun, WorkerStats
from sglang_feather.serving.placement import Placement
from sglang_feather.serving.prefill_log import PrefillTotals


def test_defaults_are_16_groups_of_8_on_2_workers_for_four_policies():
    args = parse_args([])
    assert (args.workload.spec.num_groups, args.workload.num_requests, args.workload.spec.prefix_len) == (
        16,
        128,
        512,
    )
    assert args.policies == ["fcfs", "lpm", "dfs-weight", "feather"]
    assert (args.repeat, args.workers, args.max_concurrency) == (3, 2, 64)


def test_feather_flags_reach_feather_workers_only_and_router_flags_the_router():
    args = parse_args(["--feather-args", "--feather-stopper static", "--router-args=--log-level debug"])
    assert cluster_spec(args, "feather", "cpu").worker_args == ("--feather-stopper", "static")
    assert cluster_spec(args, "lpm", "cpu").worker_args == ()
    assert cluster_spec(args, "lpm", "cpu").router.extra_args == ("--log-level", "debug")


def run(policy: str, split: int, hits: tuple[int, int], drift: float | None) -> ClusterRun:
    bench = BenchResult("w", 128, 128, 10.0, 12.8, 400.0, 900.0, 1.0, 2.0, 3.0, 4.0, 0.8)
    workers = tuple(
        WorkerStats(
            f"http://127.0.0.1:{port}", 64, PrefillTotals(cached_tokens=hit, new_tokens=100 - hit), drift, 0
        )
        for port, hit in zip((1, 2), hits, strict=True)
    )
    return ClusterRun(policy, bench, workers, Placement({}, 16, split), {"spill": float(split)})


def test_the_summary_gives_median_and_range_and_the_worst_worker():
    table = format_summary({"feather": [run("feather", 2, (80, 70), 0.0), run("feather", 4, (90, 60), 0.0)]})
    header, row = table.splitlines()
    assert "split groups" in header and "max drift" in header
    assert "3 [2-4]" in row  # split groups
    assert "65.0 [60.0-70.0]" in row  # the lower worker's hit rate
    assert row.rstrip().endswith("0")
    baseline = format_summary({"fcfs": [run("fcfs", 5, (50, 50), None)]})
    assert baseline.splitlines()[1].rstrip().endswith("-")  # no Feather, no drift counter
