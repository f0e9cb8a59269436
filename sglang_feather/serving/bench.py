"""Run SGLang's own bench_serving client against a server and parse its JSON result."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sglang_feather.serving.process import ProcessGroup
from sglang_feather.workload import SharedPrefixSpec

BENCH_MODULE = "sglang.benchmark.serving"


class BenchError(RuntimeError):
    """bench_serving failed or wrote no usable result."""


@dataclass(frozen=True)
class Workload:
    """A named shared-prefix workload, sent by bench_serving's generated-shared-prefix dataset.

    bench_serving draws its own prompt text from the spec's shape: groups of equal size (uniform) or with
    Zipf-sampled groups, a system prompt per group, one question each, shuffled (order random) or in group
    order (contiguous); arrival times come from `BenchConfig.request_rate`, not from the spec.
    """

    name: str
    spec: SharedPrefixSpec

    def __post_init__(self) -> None:
        spec = self.spec
        if spec.num_requests % spec.num_groups:
            raise ValueError(
                f"workload {self.name!r}: bench_serving needs num_requests ({spec.num_requests}) to be a "
                f"multiple of num_groups ({spec.num_groups})"
            )
        if spec.order not in GSP_ORDERED:
            raise ValueError(
                f"workload {self.name!r}: bench_serving sends order {sorted(GSP_ORDERED)}, not {spec.order!r}"
            )
        if spec.rate is not None:
            raise ValueError(f"workload {self.name!r}: give the request rate as BenchConfig.request_rate")
        if spec.num_turns != 1:
            raise ValueError(
                f"workload {self.name!r}: multi-turn serving runs are not wired to bench_serving"
            )

    @property
    def num_requests(self) -> int:
        return self.spec.num_requests

    @classmethod
    def no_sharing(cls, name: str, num_requests: int, prompt_len: int, output_len: int) -> Workload:
        """Every request gets its own random system prompt: nothing is shared."""
        spec = SharedPrefixSpec(
            num_groups=num_requests,
            num_requests=num_requests,
            prefix_len=prompt_len,
            question_len=1,
            output_len=output_len,
        )
        return cls(name, spec)

    def dataset_args(self) -> list[str]:
        spec = self.spec
        args = [
            "--dataset-name",
            "generated-shared-prefix",
            "--gsp-num-groups",
            str(spec.num_groups),
            "--gsp-prompts-per-group",
            str(spec.num_requests // spec.num_groups),
            "--gsp-system-prompt-len",
            str(spec.prefix_len),
            "--gsp-question-len",
            str(spec.question_len),
            "--gsp-output-len",
            str(spec.output_len),
        ]
        if spec.popularity == "zipf":
            args += ["--gsp-group-distribution", "zipf", "--gsp-zipf-alpha", str(spec.zipf_alpha)]
        return args + (["--gsp-ordered"] if GSP_ORDERED[spec.order] else [])


GSP_ORDERED = {"random": False, "contiguous": True}
"""Spec order -> bench_serving's --gsp-ordered (it shuffles the requests unless told not to)."""


@dataclass(frozen=True)
class BenchConfig:
    max_concurrency: int | None = None
    request_rate: float | None = None
    seed: int = 1
    warmup_requests: int = 1
    flush_cache: bool = False
    """Flush the server's prefix cache after the warmup requests, so the run starts cold."""
    output_details: bool = False
    """Per-request TTFTs and inter-token gaps in the result line (gives `BenchResult.e2e_max_ms`)."""
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class BenchResult:
    workload: str
    num_requests: int
    completed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_throughput: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    cache_hit_rate: float | None
    e2e_p50_ms: float | None = None
    e2e_max_ms: float | None = None
    """Slowest request's first token plus its inter-token gaps (None without `--output-details`)."""

    @property
    def num_failed(self) -> int:
        return self.num_requests - self.completed

    @classmethod
    def from_record(cls, record: Mapping, workload: Workload) -> BenchResult:
        try:
            cache = record.get("cache_report")
            return cls(
                workload=workload.name,
                num_requests=workload.num_requests,
                completed=int(record["completed"]),
                duration_s=float(record["duration"]),
                request_throughput=float(record["request_throughput"]),
                output_throughput=float(record["output_throughput"]),
                total_throughput=float(record["total_throughput"]),
                ttft_p50_ms=float(record["median_ttft_ms"]),
                ttft_p99_ms=float(record["p99_ttft_ms"]),
                tpot_p50_ms=float(record["median_tpot_ms"]),
                tpot_p99_ms=float(record["p99_tpot_ms"]),
                cache_hit_rate=float(cache["cache_hit_rate_pct"]) / 100 if cache else None,
                e2e_p50_ms=float(record["median_e2e_latency_ms"]),
                e2e_max_ms=max_e2e_ms(record),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchError(f"bench_serving record lacks or mangles {exc}: keys {sorted(record)}") from exc


def max_e2e_ms(record: Mapping) -> float | None:
    """The largest time to a request's last token, from `--output-details` (successful requests only).

    bench_serving's own E2E latency also counts the stream's closing chunk after the last token; the record
    keeps only its percentiles, so the maximum is rebuilt from each request's TTFT and inter-token gaps.
    """
    if "ttfts" not in record:
        return None
    errors = record.get("errors") or [""] * len(record["ttfts"])
    latencies = [
        ttft + sum(itls)
        for ttft, itls, error in zip(record["ttfts"], record["itls"], errors, strict=True)
        if not error
    ]
    return 1000 * max(latencies) if latencies else None


def read_result(path: Path, workload: Workload) -> BenchResult:
    """The last JSON line of a bench_serving --output-file (the tool appends one line per run)."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError as exc:
        raise BenchError(f"bench_serving wrote no result file {path}") from exc
    if not lines:
        raise BenchError(f"bench_serving result file {path} is empty")
    try:
        record = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BenchError(f"bench_serving result file {path} is not JSON lines: {exc}") from exc
    return BenchResult.from_record(record, workload)


def bench_argv(
    base_url: str, model: str, tokenizer: str, workload: Workload, config: BenchConfig, *, backend: str
) -> list[str]:
    argv = [
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        *workload.dataset_args(),
        "--seed",
        str(config.seed),
        "--warmup-requests",
        str(config.warmup_requests),
        "--cache-report",
        "--disable-tqdm",
    ]
    if config.max_concurrency is not None:
        argv += ["--max-concurrency", str(config.max_concurrency)]
    if config.request_rate is not None:
        argv += ["--request-rate", str(config.request_rate)]
    if config.flush_cache:
        argv.append("--flush-cache")
    if config.output_details:
        argv.append("--output-details")
    return argv + list(config.extra_args)


def bench_env(base_env: Mapping[str, str], tokenizer: str, cache_root: Path) -> dict[str, str]:
    """Offline env whose HOME is private to the tokenizer.

    bench_serving caches generated prompts under ~/.cache keyed by the tokenizer's class name only, so two
    models with the same tokenizer class would share (wrongly sized) prompts; a per-tokenizer HOME avoids it.
    """
    home = Path(base_env.get("HOME", str(Path.home())))
    tag = hashlib.sha1(os.path.abspath(tokenizer).encode()).hexdigest()[:12]
    env = dict(base_env)
    env.setdefault("HF_HOME", str(home / ".cache" / "huggingface"))
    env["HOME"] = str(cache_root / tag)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    return env


@dataclass(frozen=True)
class BenchTarget:
    base_url: str
    model: str
    tokenizer: str
    backend: str = "sglang"


def run_bench(
    target: BenchTarget,
    workload: Workload,
    config: BenchConfig,
    out_dir: Path,
    *,
    python: str = sys.executable,
    timeout_s: float = 3600.0,
) -> BenchResult:
    """Run bench_serving to completion (killing its process group on any failure) and parse its result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / f"{workload.name}.jsonl"
    result_path.unlink(missing_ok=True)
    argv = [
        python,
        "-m",
        BENCH_MODULE,
        *bench_argv(
            target.base_url, target.model, target.tokenizer, workload, config, backend=target.backend
        ),
        "--output-file",
        str(result_path),
    ]
    env = bench_env(os.environ, target.tokenizer, Path.home() / ".cache" / "sglang-feather" / "bench-home")
    group = ProcessGroup(argv, env=env, log_path=out_dir / f"{workload.name}.bench.log")
    try:
        exit_code = group.wait(timeout_s)
    except subprocess.TimeoutExpired as exc:
        group.stop(grace_s=5.0)
        raise BenchError(f"bench_serving still running after {timeout_s:.0f} s\n{group.log_tail()}") from exc
    except BaseException:
        group.stop(grace_s=5.0)
        raise
    group.stop(grace_s=5.0)
    if exit_code != 0:
        raise BenchError(f"bench_serving exited with code {exit_code}\n{group.log_tail()}")
    return read_result(result_path, workload)
