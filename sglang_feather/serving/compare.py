"""Serve one policy, drive it with each workload in turn, and collect bench results plus scheduler metrics."""

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from sglang_feather.serving.bench import (
    BenchConfig,
    BenchError,
    BenchResult,
    BenchTarget,
    Workload,
    run_bench,
)
from sglang_feather.serving.metrics import MetricsError, MetricsSnapshot, scrape
from sglang_feather.serving.prefill_log import PrefillTotals, log_size, read_prefill_totals
from sglang_feather.serving.process import stop_all
from sglang_feather.serving.server import Server, ServerSpec, ServerStartError


class ServerDied(RuntimeError):
    """The server exited while a benchmark was running against it."""


FEATHER_PASS_SECONDS = "sglang:feather_step_seconds_sum"
"""Sum of the plugin's per-step time histogram (sglang_feather/sglang/metrics.py)."""

RUN_ERRORS = (ServerStartError, BenchError, ServerDied, MetricsError)
"""What a failed policy run raises (anything else is a bug or an interrupt and propagates)."""


@dataclass(frozen=True)
class WorkloadRun:
    policy: str
    bench: BenchResult
    feather: Mapping[str, float] = field(default_factory=dict)
    prefill: PrefillTotals | None = None
    """The server's own prefill log over this workload (SGLang only; after bench_serving's cache flush)."""

    @property
    def feather_pass_s(self) -> float | None:
        """Feather's own scheduler-pass seconds; None when the server exports no Feather metrics."""
        return self.feather.get(FEATHER_PASS_SECONDS)


@dataclass(frozen=True)
class PolicyRun:
    policy: str
    startup_s: float
    runs: tuple[WorkloadRun, ...]


def feather_counters(delta: MetricsSnapshot) -> dict[str, float]:
    """Every Feather sample summed over labels (histogram buckets and creation stamps left out)."""
    names = [n for n in delta.names("feather") if not n.endswith(("_bucket", "_created"))]
    return {n: delta.total(n) or 0.0 for n in names}


def measure(
    base_url: str,
    before: MetricsSnapshot,
    policy: str,
    bench: BenchResult,
    prefill: PrefillTotals | None = None,
) -> WorkloadRun:
    delta = scrape(base_url).minus(before)
    return WorkloadRun(policy=policy, bench=bench, feather=feather_counters(delta), prefill=prefill)


def run_policy(
    spec: ServerSpec,
    workloads: Sequence[Workload],
    config: BenchConfig,
    out_dir: Path,
    *,
    tokenizer: str | None = None,
    python: str = sys.executable,
) -> PolicyRun:
    """One server for `spec`; the prefix cache is flushed before each workload after the first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with Server(spec, log_path=out_dir / "server.log", python=python) as server:
        runs = [
            bench_once(server, workload, replace(config, flush_cache=config.flush_cache or index > 0), out_dir,
                       tokenizer=tokenizer, python=python)
            for index, workload in enumerate(workloads)
        ]  # fmt: skip
        assert server.startup_s is not None
        return PolicyRun(spec.name, server.startup_s, tuple(runs))


def bench_once(
    server: Server,
    workload: Workload,
    config: BenchConfig,
    out_dir: Path,
    *,
    tokenizer: str | None = None,
    python: str = sys.executable,
) -> WorkloadRun:
    """One bench_serving run against a running server, with the server's metrics and (SGLang) prefill log
    read from where they stood before it."""
    spec = server.spec
    target = BenchTarget(server.base_url, spec.model, tokenizer or spec.model, server.engine.bench_backend)
    before, offset = scrape(server.base_url), log_size(server.log_path)
    bench = run_bench(target, workload, config, out_dir, python=python)
    if not server.is_running():
        raise ServerDied(f"{spec.name} server exited during {workload.name}\n{server.log_tail()}")
    prefill = read_prefill_totals(server.log_path, offset) if spec.engine == "sglang" else None
    return measure(server.base_url, before, spec.name, bench, prefill)


@dataclass(frozen=True)
class PolicyFailure:
    policy: str
    error: str


def run_policies(
    specs: Sequence[ServerSpec],
    workloads: Sequence[Workload],
    config: BenchConfig,
    out_dir: Path,
    *,
    tokenizer: str | None = None,
    parallel: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[list[PolicyRun], list[PolicyFailure]]:
    """Each policy on its own server, one after another; a policy that fails is reported and the rest go on.

    `parallel` overlaps the policies: for smoke tests only, since the measurements then disturb each other.
    """

    def one(spec: ServerSpec) -> PolicyRun | PolicyFailure:
        progress(f"[{spec.name}] starting server")
        try:
            run = run_policy(spec, workloads, config, out_dir / spec.name, tokenizer=tokenizer)
        except RUN_ERRORS as err:
            progress(f"[{spec.name}] FAILED: {err}")
            return PolicyFailure(spec.name, str(err))
        progress(f"[{spec.name}] server ready in {run.startup_s:.1f} s; {len(run.runs)} workload(s) done")
        return run

    if parallel:
        with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
            futures = [pool.submit(one, spec) for spec in specs]
            try:
                outcomes = [future.result() for future in futures]
            except BaseException:
                # Worker threads block on their servers and benches; stop those groups so the threads end.
                stop_all()
                raise
    else:
        outcomes = [one(spec) for spec in specs]
    runs = [o for o in outcomes if isinstance(o, PolicyRun)]
    failures = [o for o in outcomes if isinstance(o, PolicyFailure)]
    return runs, failures


@contextmanager
def started_servers(
    specs: Sequence[ServerSpec], out_dir: Path, python: str = sys.executable
) -> Iterator[list[Server]]:
    """Start each server in turn (one at a time, so start-ups do not compete) and stop them all on the way out."""
    servers: list[Server] = []
    try:
        for spec in specs:
            (out_dir / spec.name).mkdir(parents=True, exist_ok=True)
            server = Server(spec, log_path=out_dir / spec.name / "server.log", python=python)
            servers.append(server)
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def bench_servers(
    servers: Sequence[Server],
    workload: Workload,
    config: BenchConfig,
    out_dir: Path,
    *,
    tokenizer: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[list[PolicyRun], list[PolicyFailure]]:
    """One run on each running server, its prefix cache flushed first (cold, as on a fresh server)."""
    runs, failures = [], []
    for server in servers:
        name = server.spec.name
        progress(f"[{name}] running on the server started in {server.startup_s or 0:.1f} s")
        try:
            run = bench_once(
                server, workload, replace(config, flush_cache=True), out_dir / name, tokenizer=tokenizer
            )
        except RUN_ERRORS as err:
            progress(f"[{name}] FAILED: {err}")
            failures.append(PolicyFailure(name, str(err)))
            continue
        runs.append(PolicyRun(name, server.startup_s or 0.0, (run,)))
    return runs, failures
