"""Per-policy summary of a run (throughput, latency, cache, homogeneity, scheduler CPU) as table and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sglang_feather.sim.metrics import RunLog, StepKind


@dataclass(frozen=True)
class Summary:
    policy: str
    num_requests: int
    output_tokens: int
    duration_s: float
    output_tok_s: float
    req_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    max_queue_wait_s: float
    wait_p50_s: float
    wait_p99_s: float
    wait_len_corr: float
    """Pearson correlation of queue wait (arrival to first admission) with prompt length; 0 if undefined."""
    wait_len_corr_given_arrival: float
    """The same correlation with the linear effect of arrival time taken out of both (partial correlation):
    where prompts grow over a trace (chat: later turns are longer) and so does the load, waits track length
    through time alone; this one is near 0 unless the schedule itself favours a length."""
    cache_hit_rate: float
    groups_per_decode_step: float
    mean_decode_batch: float
    locked_tokens_per_decode_step: float
    """Cached prompt tokens running requests lock, averaged over decode steps (`StepRecord.num_locked_tokens`)."""
    num_prefill_steps: int
    num_decode_steps: int
    num_retractions: int
    num_policy_passes: int
    cpu_ms_per_pass: float
    cpu_pct_of_gpu: float
    gpu_s: float
    cpu_s: float
    output_tok_s_serial_cpu: float
    """Throughput had every step taken GPU + CPU time (no overlap scheduler)."""
    output_tok_s_overlap_cpu: float
    """Throughput had every step taken max(GPU, CPU) (SGLang's overlap scheduler)."""
    bound_tok_s: float = 0.0
    """The same schedule's throughput with perfect sharing: every decode step reading each shared prefix node of
    its batch once (a cascade kernel), the steps' CPU time and the idle gaps unchanged."""
    pct_of_bound: float = 0.0
    """`output_tok_s` as a share of `bound_tok_s`."""
    tree_cache: str | None = None
    """The SGLang tree cache the policy ran on (SGLang baselines only)."""


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _corr(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2 or np.std(xs) == 0 or np.std(ys) == 0:
        return 0.0
    return float(np.corrcoef(xs, ys)[0, 1])


def _partial_corr(xs: list[float], ys: list[float], zs: list[float]) -> float:
    """corr(xs, ys) after removing from both their least-squares line in zs; 0 if undefined."""
    if len(xs) < 3 or np.std(zs) == 0:
        return _corr(xs, ys)
    basis = np.column_stack([np.asarray(zs, dtype=float), np.ones(len(zs))])

    def residual(values: list[float]) -> np.ndarray:
        v = np.asarray(values, dtype=float)
        return v - basis @ np.linalg.lstsq(basis, v, rcond=None)[0]

    return _corr(list(residual(xs)), list(residual(ys)))


def summarize(policy: str, log: RunLog) -> Summary:
    reqs = log.requests
    wait = [r.admit_s - r.arrival_s for r in reqs]
    out = sum(r.output_len for r in reqs)
    ttft = [r.first_token_s - r.arrival_s for r in reqs]
    tpot = [(r.finish_s - r.first_token_s) / (r.output_len - 1) for r in reqs if r.output_len > 1]
    decode = [s for s in log.steps if s.kind is StepKind.DECODE]
    gpu = sum(s.gpu_s for s in log.steps)
    cpu = sum(s.cpu_s for s in log.steps)
    busy = sum(s.gpu_s + s.cpu_s for s in log.steps)
    overlap = sum(max(s.gpu_s, s.cpu_s) for s in log.steps)
    actual = overlap if log.overlap_schedule else busy
    idle = max(0.0, log.end_s - actual)
    filled = log.cache_hit_tokens + log.cache_miss_tokens
    step_of = (lambda gpu, cpu: max(gpu, cpu)) if log.overlap_schedule else (lambda gpu, cpu: gpu + cpu)
    saved = sum(step_of(s.gpu_s, s.cpu_s) - step_of(s.bound_gpu_s, s.cpu_s) for s in log.steps)
    bound_s = log.end_s - saved
    bound_tok_s = out / bound_s if bound_s > 0 else 0.0
    return Summary(
        policy=policy,
        num_requests=len(reqs),
        output_tokens=out,
        duration_s=log.end_s,
        output_tok_s=out / log.end_s if log.end_s else 0.0,
        req_s=len(reqs) / log.end_s if log.end_s else 0.0,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        tpot_p50_ms=_pct(tpot, 50) * 1e3,
        tpot_p99_ms=_pct(tpot, 99) * 1e3,
        max_queue_wait_s=max(wait, default=0.0),
        wait_p50_s=_pct(wait, 50),
        wait_p99_s=_pct(wait, 99),
        wait_len_corr=_corr(wait, [r.prompt_len for r in reqs]),
        wait_len_corr_given_arrival=_partial_corr(
            wait, [r.prompt_len for r in reqs], [r.arrival_s for r in reqs]
        ),
        cache_hit_rate=log.cache_hit_tokens / filled if filled else 0.0,
        groups_per_decode_step=float(np.mean([s.num_groups for s in decode])) if decode else 0.0,
        mean_decode_batch=float(np.mean([s.batch_size for s in decode])) if decode else 0.0,
        locked_tokens_per_decode_step=float(np.mean([s.num_locked_tokens for s in decode]))
        if decode
        else 0.0,
        num_prefill_steps=len(log.steps) - len(decode),
        num_decode_steps=len(decode),
        num_retractions=log.num_retractions,
        num_policy_passes=log.num_policy_passes,
        cpu_ms_per_pass=log.policy_cpu_s / log.num_policy_passes * 1e3 if log.num_policy_passes else 0.0,
        cpu_pct_of_gpu=100 * cpu / gpu if gpu else 0.0,
        gpu_s=gpu,
        cpu_s=cpu,
        output_tok_s_serial_cpu=out / (busy + idle) if busy + idle else 0.0,
        output_tok_s_overlap_cpu=out / (overlap + idle) if overlap + idle else 0.0,
        tree_cache=log.tree_cache,
        bound_tok_s=bound_tok_s,
        pct_of_bound=(out / log.end_s) / bound_tok_s if bound_tok_s and log.end_s else 0.0,
    )


COLUMNS = (
    ("policy", "policy", "{}"),
    ("output_tok_s", "tok/s", "{:.0f}"),
    ("req_s", "req/s", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
    ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"),
    ("wait_p99_s", "wait p99 s", "{:.2f}"),
    ("max_queue_wait_s", "max wait s", "{:.2f}"),
    ("wait_len_corr", "corr(wait,len)", "{:.2f}"),
    ("wait_len_corr_given_arrival", "corr(wait,len) given arrival", "{:.2f}"),
    ("cache_hit_rate", "hit", "{:.1%}"),
    ("groups_per_decode_step", "groups/step", "{:.2f}"),
    ("mean_decode_batch", "batch", "{:.0f}"),
    ("cpu_ms_per_pass", "CPU ms/pass", "{:.3f}"),
    ("cpu_pct_of_gpu", "CPU %GPU", "{:.2f}"),
    ("output_tok_s_serial_cpu", "tok/s serial", "{:.0f}"),
    ("output_tok_s_overlap_cpu", "tok/s overlap", "{:.0f}"),
    ("bound_tok_s", "bound tok/s", "{:.0f}"),
    ("pct_of_bound", "% of bound", "{:.1%}"),
)


@dataclass(frozen=True)
class WaitBin:
    """Queue waits of the requests whose prompt length falls in [min_len, max_len]."""

    min_len: int
    max_len: int
    num_requests: int
    wait_p50_s: float
    wait_p90_s: float
    wait_max_s: float
    num_over: int
    """Requests in the bin that waited longer than the threshold given to `wait_by_length`."""


def wait_by_length(log: RunLog, num_bins: int = 4, over_s: float = 20.0) -> list[WaitBin]:
    """Queue-wait quantiles per prompt-length quantile bin (equal request counts per bin)."""
    reqs = sorted(log.requests, key=lambda r: r.prompt_len)
    out = []
    for part in np.array_split(np.arange(len(reqs)), num_bins):
        if not len(part):
            continue
        chunk = [reqs[i] for i in part]
        wait = [r.admit_s - r.arrival_s for r in chunk]
        out.append(
            WaitBin(
                chunk[0].prompt_len,
                chunk[-1].prompt_len,
                len(chunk),
                _pct(wait, 50),
                _pct(wait, 90),
                max(wait),
                sum(w > over_s for w in wait),
            )
        )
    return out


WAIT_COLUMNS = (
    ("policy", "{}"),
    ("prompt tokens", "{}"),
    ("requests", "{}"),
    ("wait p50 s", "{:.2f}"),
    ("wait p90 s", "{:.2f}"),
    ("max wait s", "{:.2f}"),
    ("waits > {over:g} s", "{}"),
)


def wait_table(rows: list[tuple[str, list[WaitBin]]], over_s: float = 20.0) -> str:
    """Markdown table of `wait_by_length` results, one block of bins per policy."""
    head = [name.format(over=over_s) for name, _ in WAIT_COLUMNS]
    cells = []
    for policy, bins in rows:
        for b in bins:
            span = f"{b.min_len}-{b.max_len}"
            values = (policy, span, b.num_requests, b.wait_p50_s, b.wait_p90_s, b.wait_max_s, b.num_over)
            cells.append([fmt.format(v) for (_, fmt), v in zip(WAIT_COLUMNS, values, strict=True)])
    return _markdown([head, *cells])


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def table(summaries: list[Summary]) -> str:
    rows = [[head for _, head, _ in COLUMNS]]
    for s in summaries:
        rows.append([fmt.format(getattr(s, key)) for key, _, fmt in COLUMNS])
    return _markdown(rows)


def tree_cache_lines(summaries: list[Summary]) -> list[str]:
    """One line per SGLang tree cache the table's baselines ran on, naming those policies."""
    by_cache: dict[str, list[str]] = {}
    for s in summaries:
        if s.tree_cache is not None:
            by_cache.setdefault(s.tree_cache, []).append(s.policy)
    return [f"SGLang tree cache ({', '.join(policies)}): {cache}" for cache, policies in by_cache.items()]


def write_json(path: str | Path, meta: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**meta, "runs": runs}, f, indent=2, default=str)


def summary_dict(s: Summary) -> dict[str, Any]:
    return asdict(s)
