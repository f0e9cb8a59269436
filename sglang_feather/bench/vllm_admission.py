"""`bench vllm-admission`: vLLM FCFS, vLLM 0.34's cache-aware admission window and Feather on KV-limited
workloads (model-free harness), and their scheduler CPU per step with W requests waiting."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from sglang_feather.bench.cli_types import add_json_flag, int_list, publish, seed_list
from sglang_feather.bench.markdown import header, row
from sglang_feather.bench.report import machine_line, run_meta
from sglang_feather.bench.vllm_workloads import WORKLOADS
from sglang_feather.offline.vllm_inputs import STEP_S

DEFINITIONS = {
    "hit rate": "tokens vLLM's prefix cache gave the admitted requests / tokens of their sequences at admission "
    "(a preempted request's readmission counts again)",
    "recomputed tokens": "tokens of full KV blocks computed while the same chained block (same prefix) had "
    "been computed before in the run, by any request (a preempted request's re-prefill included); what an "
    "unbounded prefix cache would have saved; the mean over seeds",
    "preemptions": "vLLM's preemptions, mean over seeds",
    "CPU/step": "median over steps of schedule() + update_from_output() in thread CPU time, then the median "
    "over seeds",
    "max wait": "steps from a request's arrival to the first step that schedules it, the maximum over requests "
    "and seeds",
    "mean wait": "the same, mean over requests and seeds",
    "steps": "steps until every request finished, mean over seeds",
}
MAX_WAIT_SLACK = 1.10
"""Feather's max wait may exceed the better window's by 10 % (issue 52)."""
WINDOWS = ("vllm-window16", "vllm-window-all")


def run(
    model: Path,
    policies: Sequence[str],
    workloads: Sequence[str],
    seeds: Sequence[int],
    cpu_waiting: Sequence[int],
    cpu_repeats: int,
    progress=None,
) -> dict:
    import torch
    import vllm

    from sglang_feather.offline import vllm_admission as harness

    for policy in policies:  # a policy this vLLM cannot run is refused before any run starts
        harness.build(policy, harness.CPU_SHAPE, model, num_requests=1)
    started, load_before = time.time(), os.getloadavg()
    runs = []
    for workload in workloads:
        for seed in seeds:
            for policy in policies:
                t0 = time.perf_counter()
                result = harness.run(
                    policy,
                    WORKLOADS[workload].replay(seed),
                    WORKLOADS[workload].engine,
                    model,
                    workload=workload,
                    seed=seed,
                )
                runs.append({**asdict(result), "hit_rate": result.hit_rate})
                print(
                    f"[vllm-admission] {workload} seed {seed} {policy}: {result.num_steps} steps, "
                    f"{time.perf_counter() - t0:.1f} s",
                    file=progress or sys.stderr,
                    flush=True,
                )
    cpu = []
    for num_waiting in cpu_waiting:
        for policy in policies:
            cpu.append(asdict(harness.cpu_per_step(policy, num_waiting, model, repeats=cpu_repeats)))
    meta = {
        **run_meta(started, load_before, {"vllm": vllm.__version__, "torch": torch.__version__}),
        "model": str(model),
        "step_s": STEP_S,
        "seeds": list(seeds),
        "policies": {name: harness.POLICIES[name].description for name in policies},
        "workloads": {name: WORKLOADS[name].description for name in workloads},
        "engines": {name: asdict(WORKLOADS[name].engine) for name in workloads},
        "cpu_shape": asdict(harness.CPU_SHAPE),
        "definitions": DEFINITIONS,
    }
    return {"meta": meta, "runs": runs, "summary": summarize(runs), "cpu": cpu}


def summarize(runs: list[dict]) -> list[dict]:
    """One row per workload and policy, over its seeds (`DEFINITIONS`)."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        cells.setdefault((r["workload"], r["policy"]), []).append(r)
    return [
        {
            "workload": workload,
            "policy": policy,
            "num_seeds": len(rs),
            "hit_rate": sum(r["num_hit_tokens"] for r in rs)
            / max(sum(r["num_queried_tokens"] for r in rs), 1),
            "num_recomputed_tokens": statistics.fmean(r["num_recomputed_tokens"] for r in rs),
            "num_preemptions": statistics.fmean(r["num_preemptions"] for r in rs),
            "cpu_per_step_us": statistics.median(r["cpu_per_step_us"] for r in rs),
            "max_wait_steps": max(r["max_wait_steps"] for r in rs),
            "mean_wait_steps": statistics.fmean(r["mean_wait_steps"] for r in rs),
            "num_steps": statistics.fmean(r["num_steps"] for r in rs),
        }
        for (workload, policy), rs in cells.items()
    ]


def verdicts(summary: list[dict]) -> list[str]:
    """Per workload: Feather against the window setting with fewer recomputed tokens (issue 52's bar)."""
    by = {(s["workload"], s["policy"]): s for s in summary}
    lines = []
    for workload in dict.fromkeys(s["workload"] for s in summary):
        windows = [by[(workload, w)] for w in WINDOWS if (workload, w) in by]
        feather = by.get((workload, "feather"))
        if not windows or feather is None:
            continue
        best = min(windows, key=lambda s: (s["num_recomputed_tokens"], s["max_wait_steps"]))
        recomputed_ok = feather["num_recomputed_tokens"] <= best["num_recomputed_tokens"]
        wait_bar = best["max_wait_steps"] * MAX_WAIT_SLACK
        wait_ok = feather["max_wait_steps"] <= wait_bar
        lines.append(
            f"- {workload}: Feather against {best['policy']}: recomputed tokens "
            f"{feather['num_recomputed_tokens']:,.0f} vs {best['num_recomputed_tokens']:,.0f} "
            f"({'met' if recomputed_ok else 'NOT met'}); max wait {feather['max_wait_steps']} vs "
            f"{best['max_wait_steps']} steps, bar {wait_bar:.0f} ({'met' if wait_ok else 'NOT met'})"
        )
    return lines


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"{machine_line(meta)}; started {meta['started_utc']}, run took {meta['wall_s']:.0f} s; "
        f"seeds {', '.join(map(str, meta['seeds']))}; one step = {meta['step_s']} s of Feather's clock.",
        "",
        *(f"- `{name}`: {text}" for name, text in meta["policies"].items()),
        *(f"- workload `{name}`: {text}" for name, text in meta["workloads"].items()),
        "",
    ]
    if result["summary"]:
        lines += header(
            [
                "workload",
                "policy",
                "hit rate",
                "recomputed tokens",
                "preemptions",
                "CPU/step µs",
                "max wait",
                "mean wait",
                "steps",
            ],
            num_left=2,
        )
        for s in result["summary"]:
            lines.append(
                row(
                    [
                        s["workload"],
                        s["policy"],
                        f"{s['hit_rate']:.3f}",
                        f"{s['num_recomputed_tokens']:,.0f}",
                        f"{s['num_preemptions']:.1f}",
                        f"{s['cpu_per_step_us']:.0f}",
                        str(s["max_wait_steps"]),
                        f"{s['mean_wait_steps']:.1f}",
                        f"{s['num_steps']:.0f}",
                    ]
                )
            )
        lines += ["", *verdicts(result["summary"]), ""]
        lines += [f"- {name}: {text}" for name, text in meta["definitions"].items()]
    if result["cpu"]:
        lines += [
            "",
            *header(["waiting", "policy", "CPU/step µs", "runs µs", "KV usage", "running"], num_left=2),
        ]
        for c in result["cpu"]:
            runs = " / ".join(f"{us:.0f}" for us in c["runs_us"])
            lines.append(
                row(
                    [
                        str(c["num_waiting"]),
                        c["policy"],
                        f"{c['cpu_per_step_us']:.0f}",
                        runs,
                        f"{c['kv_usage']:.2f}",
                        f"{c['num_running']:.0f}",
                    ]
                )
            )
    return "\n".join(lines)


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name)


def _check_names(what: str, names: Sequence[str], registry) -> None:
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(registry)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        default=Path("models/tiny-llama"),
        help="model folder whose config and tokenizer vLLM reads (no weights are loaded; default %(default)s)",
    )
    parser.add_argument(
        "--policies",
        type=_name_list,
        default=("vllm-fcfs", "vllm-window16", "vllm-window-all", "feather"),
        help="comma list (default: all four); the window ones need vLLM 0.34+",
    )
    parser.add_argument(
        "--workloads", type=_name_list, default=("rag", "groups", "chat"), help="comma list; empty: none"
    )
    parser.add_argument("--seeds", type=seed_list, default=(0, 1, 2), help="comma list of seeds")
    parser.add_argument(
        "--cpu-waiting",
        type=_cpu_list,
        default=(100, 2000),
        help="waiting-queue sizes W for the CPU-per-step measurement (comma list; empty: skip it)",
    )
    parser.add_argument("--cpu-repeats", type=int, default=3, help="runs per CPU cell, the median reported")
    add_json_flag(parser)


def _cpu_list(text: str) -> tuple[int, ...]:
    return int_list(text) if text else ()


def main(args: argparse.Namespace) -> int:
    # vLLM's CUDA wheels (0.33, 0.34 here) cannot infer a device without it; the harness runs no kernel.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from sglang_feather.offline.vllm_admission import POLICIES

    _check_names("policy", args.policies, POLICIES)
    _check_names("workload", args.workloads, WORKLOADS)
    result = run(args.model, args.policies, args.workloads, args.seeds, args.cpu_waiting, args.cpu_repeats)
    return publish(markdown(result), result, args.json)
