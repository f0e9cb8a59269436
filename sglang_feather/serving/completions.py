"""The shared-prefix workload sent concurrently to an OpenAI-compatible /v1/completions endpoint."""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sglang_feather.workload import SharedPrefixSpec

FIRST_TOKEN_ID = 4
"""Prompt token ids start above the tiny model's specials (<unk> <s> </s> <pad>)."""
TINY_VOCAB_SIZE = 1024


@dataclass(frozen=True)
class Completion:
    text: str | None
    num_tokens: int
    finish_reason: str | None
    latency_s: float
    error: str | None = None


@dataclass(frozen=True)
class RunResult:
    completions: tuple[Completion, ...]
    wall_s: float

    @property
    def num_failed(self) -> int:
        return sum(c.error is not None for c in self.completions)

    @property
    def texts(self) -> list[str | None]:
        return [c.text for c in self.completions]

    @property
    def output_tokens_per_s(self) -> float:
        return sum(c.num_tokens for c in self.completions) / self.wall_s

    def latency_quantile(self, q: float) -> float:
        latencies = sorted(c.latency_s for c in self.completions)
        return latencies[min(int(q * len(latencies)), len(latencies) - 1)]

    @property
    def mean_latency_s(self) -> float:
        return statistics.fmean(c.latency_s for c in self.completions)


def complete(base_url: str, model: str, prompt: list[int], max_tokens: int, timeout_s: float) -> Completion:
    """One greedy completion (temperature 0, ignore_eos so every request decodes exactly max_tokens)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reply = json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as exc:
        return Completion(None, 0, None, time.monotonic() - began, error=f"{type(exc).__name__}: {exc}")
    choice = reply["choices"][0]
    num_tokens = reply.get("usage", {}).get("completion_tokens", 0)
    return Completion(choice["text"], num_tokens, choice.get("finish_reason"), time.monotonic() - began)


def run(
    base_url: str,
    model: str,
    workload: SharedPrefixSpec,
    *,
    concurrency: int,
    vocab_size: int = TINY_VOCAB_SIZE,
    timeout_s: float = 600.0,
) -> RunResult:
    """Send every first-turn prompt (ids in [FIRST_TOKEN_ID, vocab_size)) with at most `concurrency` in flight;
    results in arrival order."""
    prompts = [p.tolist() for p in workload.prompts(low=FIRST_TOKEN_ID, high=vocab_size)]
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(complete, base_url, model, p, workload.output_len, timeout_s) for p in prompts]
        completions = tuple(f.result() for f in futures)
    return RunResult(completions, time.monotonic() - began)


def prefix_cache_counters(base_url: str) -> tuple[float, float]:
    """(queried tokens, hit tokens) of vLLM's prefix cache from /metrics, summed over label sets."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["vllm:prefix_cache_queries_total"], totals["vllm:prefix_cache_hits_total"]
