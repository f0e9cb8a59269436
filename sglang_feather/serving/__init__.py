"""Engine-agnostic serving harness: launch a server, drive it with SGLang's bench_serving, compare policies."""

from sglang_feather.serving.bench import BenchConfig, BenchError, BenchResult, Workload, run_bench
from sglang_feather.serving.compare import PolicyFailure, PolicyRun, run_policies, run_policy
from sglang_feather.serving.metrics import MetricsSnapshot, parse_metrics
from sglang_feather.serving.server import Server, ServerSpec, ServerStartError
from sglang_feather.serving.table import format_table

__all__ = [
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "MetricsSnapshot",
    "PolicyFailure",
    "PolicyRun",
    "Server",
    "ServerSpec",
    "ServerStartError",
    "Workload",
    "format_table",
    "parse_metrics",
    "run_bench",
    "run_policies",
    "run_policy",
]
