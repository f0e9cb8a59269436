"""Several SGLang workers running one policy behind SMG, driven by bench_serving through the router."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_feather.serving.bench import BenchConfig, BenchResult, BenchTarget, Workload, run_bench
from sglang_feather.serving.compare import ServerDied
from sglang_feather.serving.metrics import scrape
from sglang_feather.serving.placement import REQUEST_LOG_ARGS, Placement, read_placement
from sglang_feather.serving.prefill_log import PrefillTotals, log_size, read_prefill_totals
from sglang_feather.serving.router import Router, RouterSpec
from sglang_feather.serving.server import Server, ServerSpec

DRIFT = "sglang:feather_drift_total"
ERRORS = "sglang:feather_errors_total"


@dataclass(frozen=True)
class ClusterSpec:
    """`num_workers` SGLang servers, all with `policy`, behind one SMG router."""

    model: str
    policy: str
    num_workers: int = 2
    device: str = "cpu"
    worker_args: tuple[str, ...] = ()
    router: RouterSpec = field(default_factory=RouterSpec)


@dataclass(frozen=True)
class WorkerStats:
    url: str
    requests: int
    """Shared-prefix requests this worker received (its request log)."""
    prefill: PrefillTotals
    drift: float | None
    """Feather's self-check corrections since startup (None: the worker runs no Feather)."""
    errors: float | None

    @property
    def hit_rate(self) -> float | None:
        return self.prefill.hit_rate


@dataclass(frozen=True)
class ClusterRun:
    policy: str
    bench: BenchResult
    workers: tuple[WorkerStats, ...]
    placement: Placement
    branches: Mapping[str, float]
    """SMG's cache_aware decisions by branch (`tree_match`, `spill`, `expected_wait_fallback`)."""


def worker_servers(spec: ClusterSpec, out_dir: Path, python: str, startup_timeout_s: float) -> list[Server]:
    server_spec = ServerSpec(
        spec.model, spec.policy, device=spec.device, extra_args=REQUEST_LOG_ARGS + spec.worker_args
    )
    return [
        Server(
            server_spec,
            log_path=out_dir / f"worker{i}.log",
            python=python,
            startup_timeout_s=startup_timeout_s,
        )
        for i in range(spec.num_workers)
    ]


def worker_stats(server: Server, offset: int, requests: int) -> WorkerStats:
    metrics = scrape(server.base_url)
    return WorkerStats(
        url=server.base_url,
        requests=requests,
        prefill=read_prefill_totals(server.log_path, offset),
        drift=metrics.total(DRIFT),
        errors=metrics.total(ERRORS),
    )


def run_cluster(
    spec: ClusterSpec,
    workload: Workload,
    config: BenchConfig,
    out_dir: Path,
    *,
    tokenizer: str | None = None,
    python: str = sys.executable,
    startup_timeout_s: float = 300.0,
) -> ClusterRun:
    """Start the workers side by side, then SMG, run bench_serving through SMG, and stop everything;
    `startup_timeout_s` bounds each worker's wait to be healthy."""
    out_dir.mkdir(parents=True, exist_ok=True)
    servers = worker_servers(spec, out_dir, python, startup_timeout_s)
    try:
        for server in servers:
            server.launch()
        for server in servers:
            server.wait_ready()
        with Router(spec.router, [s.base_url for s in servers], log_path=out_dir / "router.log") as router:
            offsets = {s.base_url: log_size(s.log_path) for s in servers}
            target = BenchTarget(router.base_url, spec.model, tokenizer or spec.model)
            bench = run_bench(target, workload, config, out_dir, python=python)
            dead = [s.base_url for s in servers if not s.is_running()]
            if dead or not router.is_running():
                raise ServerDied(f"{spec.policy}: {dead or 'the router'} exited during {workload.name}")
            where = read_placement({s.base_url: (s.log_path, offsets[s.base_url]) for s in servers})
            workers = tuple(
                worker_stats(s, offsets[s.base_url], where.requests.get(s.base_url, 0)) for s in servers
            )
            return ClusterRun(spec.policy, bench, workers, where, router.branches())
    finally:
        for server in servers:
            server.stop()


def max_drift(runs: Sequence[ClusterRun]) -> float | None:
    values = [w.drift for run in runs for w in run.workers if w.drift is not None]
    return max(values) if values else None
