"""A shared-prefix workload sent concurrently to an OpenAI-compatible /v1/completions endpoint."""

from __future__ import annotations

import json
import random
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

FIRST_TOKEN_ID = 4
"""Prompt token ids start above the tiny model's specials (<unk> <s> </s> <pad>)."""


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """`num_groups` random system prompts of `prefix_len` tokens, each followed by `prompts_per_group`
    different questions; the groups arrive interleaved, so an arrival-order scheduler mixes them."""

    num_groups: int = 8
    prompts_per_group: int = 25
    prefix_len: int = 128
    question_len: int = 16
    output_len: int = 16
    vocab_size: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_groups", "prompts_per_group", "prefix_len", "question_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"SharedPrefixWorkload.{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"vocab_size must exceed {FIRST_TOKEN_ID}, got {self.vocab_size}")

    @property
    def num_requests(self) -> int:
        return self.num_groups * self.prompts_per_group

    def prompts(self) -> list[list[int]]:
        """Token-id prompts in arrival order: request i belongs to group i % num_groups."""
        rng = random.Random(self.seed)
        draw = lambda n: [rng.randrange(FIRST_TOKEN_ID, self.vocab_size) for _ in range(n)]  # noqa: E731
        prefixes = [draw(self.prefix_len) for _ in range(self.num_groups)]
        return [prefixes[i % self.num_groups] + draw(self.question_len) for i in range(self.num_requests)]


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
    base_url: str, model: str, workload: SharedPrefixWorkload, *, concurrency: int, timeout_s: float = 600.0
) -> RunResult:
    """Send every prompt with at most `concurrency` in flight; results in prompt order."""
    prompts = workload.prompts()
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
