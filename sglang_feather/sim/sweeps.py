"""`python -m sglang_feather.sim.sweeps NAME`: the documented multi-seed experiments, as median [min-max] tables."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

import numpy as np

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.attention import ATTENTION_KERNELS
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu, MeasuredCpu
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.profile import load_profile
from sglang_feather.sim.report import summarize, wait_by_length
from sglang_feather.sim.run import RunSpec, simulate
from sglang_feather.sim.token_ratio import SGLANG_RATIO
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec

# How it works.
#
# A sweep is a list of cases (workload, its knobs, engine options, GPU profile); every case runs every
# policy on the same trace for each seed (the seed draws the trace: shuffle, arrivals, documents). Ratios to
# FCFS are taken per seed, side by side, then summarised as median and range over the seeds. Workload
# parameters not given by an issue are stated in each case's label and in docs/simulator.md.

POLICIES = ("fcfs", "lpm", "dfs-weight", "feather")


@dataclass(frozen=True)
class Case:
    label: str
    """Unique within a sweep; cases equal but for the batch order share `label` up to the order's name."""
    workload: str
    knobs: WorkloadConfig
    engine: EngineConfig
    gpu: str = "h200"
    model: str = "llama-3-8b"


def _demo() -> Iterator[Case]:
    """The live CPU demo's workload (make demo): 8 groups x 16, 512-token prefix, 32-token questions and
    outputs, bench_serving --max-concurrency 64, cold cache; chunked prefill 4096 (SGLang's default for a
    host under 35 GB, the CPU server's case)."""
    knobs = WorkloadConfig(SharedPrefixSpec.per_group(8, 16, prefix_len=512, question_len=32, output_len=32))
    for overlap in (True, False):
        engine = EngineConfig(overlap_schedule=overlap, max_concurrency=64, chunked_prefill_size=4096)
        yield Case(f"demo overlap={'on' if overlap else 'off'}", "gsp", knobs, engine)


RAG = WorkloadConfig(
    SharedPrefixSpec(zipf_alpha=1.0, num_requests=600, rate=20.0, question_len=64, output_len=128),
    num_docs=200,
    doc_len_range=(3000, 12000),
)
"""Issue 10's unseen RAG trace: 200 documents of 3K-12K tokens, Zipf popularity, Poisson 20 req/s; the
request count (30 s of arrivals), question and output lengths are this sweep's choice."""


def _rag() -> Iterator[Case]:
    for gpu in ("h200", "a100-80gb"):
        yield Case(f"{gpu} rag", "rag", RAG, EngineConfig(), gpu)


NO_SHARING = WorkloadConfig(SharedPrefixSpec(num_requests=400, output_len=128), prompt_len=2048)
"""Issue 10's parity check: 400 unrelated 2K-token prompts (nothing shared), all at t=0, so the server is
saturated and any batching loss shows in throughput."""


def _no_sharing() -> Iterator[Case]:
    for gpu in ("h200", "a100-80gb"):
        yield Case(f"{gpu} no-sharing", "none", NO_SHARING, EngineConfig(), gpu)


def _order_cases() -> Iterator[tuple[str, str, WorkloadConfig]]:
    for groups in (8, 16, 64):
        knobs = WorkloadConfig(
            SharedPrefixSpec.per_group(
                groups, 512 // groups, prefix_len=2048, question_len=32, output_len=256, rate=32.0
            )
        )
        yield f"gsp {groups}g", "gsp", knobs
    yield "rag", "rag", RAG.with_spec(num_requests=300)
    chat = WorkloadConfig(
        SharedPrefixSpec(
            num_requests=64, num_turns=4, prefix_len=2048, question_len=64, output_len=128, rate=8.0
        ),
        think_s=1.0,
    )
    yield "chat", "chat", chat


def _batch_order() -> Iterator[Case]:
    for gpu in ("h200", "a100-80gb", "rtx6000-ada"):
        for label, workload, knobs in _order_cases():
            for order in ("admission", "prefix"):
                yield Case(f"{gpu} {label} {order}", workload, knobs, EngineConfig(batch_order=order), gpu)


_GSP_32ZIPF = WorkloadConfig(
    SharedPrefixSpec(
        num_groups=32,
        num_requests=2000,
        prefix_len=4096,
        question_len=128,
        output_len=128,
        popularity="zipf",
        zipf_alpha=1.1,
        rate=40.0,
    )
)

KV_PRESSURE = {
    "rag": WorkloadConfig(
        SharedPrefixSpec(zipf_alpha=0.9, num_requests=1000, rate=25.0, question_len=128, output_len=128),
        num_docs=700,
        doc_len_range=(2048, 16384),
    ),
    "gsp-32zipf": _GSP_32ZIPF,
    "chat": WorkloadConfig(
        SharedPrefixSpec(
            num_requests=150, num_turns=5, prefix_len=1024, question_len=512, output_len=256, rate=5.0
        ),
        think_s=5.0,
    ),
    "gsp-32zipf-4000": _GSP_32ZIPF.with_spec(num_requests=4000),
}
"""Issue 21's KV-limited shapes, smaller (so a 2-core machine runs them): RAG (700 documents of 2K-16K
tokens, Zipf 0.9, Poisson 25 req/s, 1,000 requests), 32 groups with 4K system prompts and Zipf(1.1)
sizes at Poisson 40 req/s (2,000 requests), and 150 five-turn conversations (think time 5 s); and the 32
groups at the issue's own size (4,000 requests), where the backlog outlasts the first wave of the KV pool
(at 2,000 every policy but dfs-weight empties the queue while the first wave is admitted, so that wave holds
whatever arrived and no order chooses its groups). Question, output, system-prompt lengths and the chat
rate are this sweep's choice (stated here)."""


def _kv_pressure() -> Iterator[Case]:
    for name, knobs in KV_PRESSURE.items():
        workload = "chat" if name == "chat" else "rag" if name == "rag" else "gsp"
        yield Case(f"a100-80gb {name}", workload, knobs, EngineConfig(), "a100-80gb")


STARVATION = {
    "overload": WorkloadConfig(
        SharedPrefixSpec(
            num_groups=4, num_requests=3000, prefix_len=8192, question_len=128, output_len=128, rate=100.0
        )
    ),
    "keeps-up": WorkloadConfig(
        SharedPrefixSpec(
            num_groups=4, num_requests=1000, prefix_len=8192, question_len=128, output_len=128, rate=12.0
        )
    ),
}
"""20 cold 16K-token prompts among 4 hot groups with 8K system prompts: at 100 req/s (30 s of arrivals, far
beyond what one GPU serves) and at 12 req/s (about 83 s). Run with `feather-60s` (a 60 s bound, so a
2-core machine reaches it in minutes) beside the default."""


def _starvation() -> Iterator[Case]:
    for gpu in ("a100-80gb", "h200"):
        for name, knobs in STARVATION.items():
            yield Case(f"{gpu} starvation {name}", "starvation", knobs, EngineConfig(), gpu)


CONCENTRATION_PRIVATE = {128: (96, 32), 512: (384, 128), 2048: (1536, 512)}
"""Private part per request -> (question, output) tokens: three quarters question, one quarter output."""


def concentration_cases(num_requests: int = 1000) -> Iterator[Case]:
    """Issue 49's grid (81 cells): private part 128 / 512 / 2,048 tokens x 8 / 32 / 128 groups x 1K / 4K / 16K
    prefixes x A100 / H200 / RTX 6000 Ada; Zipf(1.1) group sizes in random order, Poisson 40 req/s (a queue
    builds wherever the GPU cannot serve 40 req/s), `num_requests` requests, SGLang's defaults."""
    for gpu in ("a100-80gb", "h200", "rtx6000-ada"):
        for prefix_len in (1024, 4096, 16384):
            for num_groups in (8, 32, 128):
                for private, (question_len, output_len) in CONCENTRATION_PRIVATE.items():
                    spec = SharedPrefixSpec(
                        num_groups=num_groups,
                        num_requests=num_requests,
                        prefix_len=prefix_len,
                        question_len=question_len,
                        output_len=output_len,
                        popularity="zipf",
                        zipf_alpha=1.1,
                        rate=40.0,
                    )
                    label = f"{gpu} {num_groups}g {prefix_len // 1024}K private{private}"
                    yield Case(label, "gsp", WorkloadConfig(spec), EngineConfig(), gpu)


def concentration_eos_cases(num_requests: int = 1000) -> Iterator[Case]:
    """Issue 49's row with EOS-terminated outputs and SGLang's decaying `new_token_ratio` (0.7 down to 0.098)
    instead of the grid's exact fixed 1.0: A100, 32 groups, 4K prefixes, the grid's three private parts, each
    output drawn from half to 1.5 times the grid's (the same mean) with the cap as `max_new_tokens`."""
    engine = EngineConfig(new_token_ratio=SGLANG_RATIO)
    for private, (question_len, output_len) in CONCENTRATION_PRIVATE.items():
        spec = SharedPrefixSpec(
            num_groups=32,
            num_requests=num_requests,
            prefix_len=4096,
            question_len=question_len,
            output_len=output_len // 2,
            output_len_max=output_len * 3 // 2,
            popularity="zipf",
            zipf_alpha=1.1,
            rate=40.0,
        )
        label = f"a100-80gb 32g 4K private{private} eos"
        yield Case(label, "gsp", WorkloadConfig(spec, eos_outputs=True), engine, "a100-80gb")


def _decode_heavy() -> Iterator[Case]:
    """Issue 48's decode-bound shapes under each attention kernel: the live demo's (`--decode-heavy`: 16 groups
    x 16 prompts, 2K prefixes, 32-token questions, 64-token outputs) and the issue's (16 x 32, 128-token
    outputs), every request at t=0 in shuffled order (groups interleave), 64 running at most, so a batch
    cannot hold every group at once and which groups run together decides what a step reads."""
    shapes = {"16x16 out64": (16, 64), "16x32 out128": (32, 128)}
    for gpu in ("a100-80gb", "h200", "rtx6000-ada"):
        for name, (per_group, output_len) in shapes.items():
            spec = SharedPrefixSpec.per_group(
                16, per_group, prefix_len=2048, question_len=32, output_len=output_len, order="random"
            )
            for attention in ATTENTION_KERNELS:
                engine = EngineConfig(max_running_requests=64, attention=attention)
                yield Case(f"{gpu} {name} {attention}", "gsp", WorkloadConfig(spec), engine, gpu)


SWEEPS: dict[str, Callable[[], Iterator[Case]]] = {
    "demo": _demo,
    "rag": _rag,
    "no-sharing": _no_sharing,
    "batch-order": _batch_order,
    "kv-pressure": _kv_pressure,
    "starvation": _starvation,
    "concentration": concentration_cases,
    "concentration-eos": concentration_eos_cases,
    "decode-heavy": _decode_heavy,
}

VARIANTS: dict[str, tuple[str, dict]] = {
    "feather-noguard": ("feather", {"max_wait_s": None}),
    "feather-60s": ("feather", {"max_wait_s": 60.0}),
    "feather-bound-only": ("feather", {"due_when_overtaken": False}),
    "feather-noconc": ("feather", {"concentrate": False}),
    "feather-ucb": ("feather", {"stopper": "ucb"}),
    "feather-static": ("feather", {"stopper": "static"}),
    "feather-cap4": ("feather", {"stopper": "static", "stopper_options": {"max_groups": 4}}),
}
"""Extra policy names a sweep may run: a policy with some admission options changed."""

METRICS = (
    ("x_fcfs", "x FCFS", "{:.2f}"),
    ("output_tok_s", "tok/s", "{:.0f}"),
    ("cache_hit_rate", "hit %", "{:.1%}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
    ("wait_p99_s", "wait p99 s", "{:.2f}"),
    ("max_queue_wait_s", "max wait s", "{:.1f}"),
    ("wait_len_corr", "corr(wait,len)", "{:.2f}"),
    ("wait_len_corr_given_arrival", "corr(wait,len) given arrival", "{:.2f}"),
    ("num_wait_over", "waits > 20 s", "{:.0f}"),
    ("groups_per_decode_step", "groups/step", "{:.1f}"),
)
WAIT_METRICS = tuple((f"max_wait_q{i}", f"max wait s, length Q{i}", "{:.1f}") for i in range(1, 5))
"""Longest queue wait per prompt-length quartile (Q1 shortest prompts): does waiting grow with length?"""


STARVATION_METRICS = (
    ("x_fcfs", "x FCFS", "{:.2f}"),
    ("output_tok_s", "tok/s", "{:.0f}"),
    ("cache_hit_rate", "hit %", "{:.1%}"),
    ("cold_wait_p50_s", "cold wait p50 s", "{:.1f}"),
    ("cold_wait_max_s", "cold wait max s", "{:.1f}"),
    ("max_queue_wait_s", "max wait s (all)", "{:.1f}"),
    ("wait_len_corr", "corr(wait,len)", "{:.2f}"),
)


def cold_waits(log) -> dict[str, float]:
    """Queue waits of the starvation trace's cold prompts (groups named cold*); empty for other traces."""
    waits = [r.admit_s - r.arrival_s for r in log.requests if r.group.startswith("cold")]
    if not waits:
        return {}
    return {"cold_wait_p50_s": float(np.median(waits)), "cold_wait_max_s": float(max(waits))}


def _cell(values: list[float], fmt: str) -> str:
    med, low, high = (fmt.format(float(f(values))) for f in (np.median, min, max))
    return med if low == high else f"{med} [{low}-{high}]"


def run_spec(policy: str) -> RunSpec:
    """The run of a policy name or of a variant in VARIANTS."""
    if policy not in VARIANTS:
        return RunSpec(policy)
    base, changes = VARIANTS[policy]
    return RunSpec(base, replace(AdmissionConfig(), **changes))


def run_case(case: Case, policies: tuple[str, ...], seeds: list[int], cpu) -> list[dict]:
    cost = PhysicsCostModel(load_profile(case.gpu, case.model))
    rows = []
    for seed in seeds:
        requests = make_workload(case.workload, case.knobs.with_spec(seed=seed))
        base = None
        for policy in policies:
            log = simulate(requests, cost, run_spec(policy), case.engine, cpu)
            s = replace(summarize(policy, log), policy=policy)
            quartiles = wait_by_length(log, 4, 20.0)
            over = sum(b.num_over for b in quartiles)
            base = s.output_tok_s if policy == "fcfs" else base
            row = {"case": case.label, "seed": seed, "batch_order": case.engine.batch_order}
            row["attention"] = case.engine.attention
            row |= {**asdict(s), "num_wait_over": over}
            row |= {f"max_wait_q{i + 1}": b.wait_max_s for i, b in enumerate(quartiles)}
            row["x_fcfs"] = s.output_tok_s / base if base else float("nan")
            row |= cold_waits(log)
            row |= {f"feather_{k}": v for k, v in (log.admission or {}).items()}
            rows.append(row)
            print(
                f"{case.label} seed={seed} {policy}: {s.output_tok_s:.0f} tok/s", file=sys.stderr, flush=True
            )
    return rows


def table(rows: list[dict], policies: tuple[str, ...], metrics=METRICS) -> str:
    head = ["case", "policy", *(h for _, h, _ in metrics)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in dict.fromkeys(r["case"] for r in rows):
        for policy in policies:
            mine = [r for r in rows if r["case"] == case and r["policy"] == policy]
            if mine:
                cells = [
                    _cell([r[k] for r in mine], fmt) if all(k in r for r in mine) else "–"
                    for k, _, fmt in metrics
                ]
                lines.append("| " + " | ".join([case, policy, *cells]) + " |")
    return "\n".join(lines)


def order_table(rows: list[dict]) -> str:
    """Prefix order over admission order, per case, policy and seed (median [min-max]): TPOT, tok/s, TTFT."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        base = r["case"].removesuffix(" " + r["batch_order"])
        by_key.setdefault((base, r["policy"], r["seed"]), {})[r["batch_order"]] = r
    ratios: dict[tuple, list[tuple[float, ...]]] = {}
    for (base, policy, _), pair in by_key.items():
        if {"admission", "prefix"} <= set(pair):
            a, p = pair["admission"], pair["prefix"]
            ratios.setdefault((base, policy), []).append(
                (a["x_fcfs"], p["x_fcfs"])
                + tuple(
                    p[k] / a[k] if a[k] else float("nan")
                    for k in ("tpot_p50_ms", "output_tok_s", "ttft_p99_s")
                )
                + (a["ttft_p99_s"], a["cache_hit_rate"], a["groups_per_decode_step"])
            )
    lines = [
        "| case | policy | x FCFS (admission order) | x FCFS (prefix order) | TPOT p50 prefix/admission "
        "| tok/s prefix/admission | TTFT p99 prefix/admission | TTFT p99 s (admission) | hit % (admission) "
        "| groups/step (admission) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    formats = ("{:.2f}",) * 6 + ("{:.1%}", "{:.1f}")
    for (base, policy), vals in ratios.items():
        cols = list(zip(*vals, strict=True))
        cells = [_cell(list(c), fmt) for c, fmt in zip(cols, formats, strict=True)]
        lines.append("| " + " | ".join([base, policy, *cells]) + " |")
    return "\n".join(lines)


CONCENTRATION_BASELINES = ("dfs-weight", "fcfs")
"""The policies issue 49's bar compares Feather with: it must reach 0.98x the better of them in every cell."""


def concentration_rows(rows: list[dict]) -> list[dict]:
    """Per case of a run with feather, fcfs and dfs-weight (and feather-noconc, the rule off): Feather's ratio to
    the better baseline and to itself without the rule, with groups per decode step, mean batch and the KV
    tokens running requests lock. Seeds are summarised by their median."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by_policy: dict[str, list[dict]] = {}
        for r in rows:
            if r["case"] == case:
                by_policy.setdefault(r["policy"], []).append(r)
        if not {"feather", *CONCENTRATION_BASELINES} <= set(by_policy):
            continue

        def med(policy: str, key: str, runs: dict[str, list[dict]] = by_policy) -> float:
            return float(np.median([r.get(key, float("nan")) for r in runs[policy]]))

        best = max(CONCENTRATION_BASELINES, key=lambda policy: med(policy, "output_tok_s"))
        row = {"case": case, "best_baseline": best}
        for policy in by_policy:
            row[f"{policy}_tok_s"] = med(policy, "output_tok_s")
            row[f"{policy}_groups"] = med(policy, "groups_per_decode_step")
            row[f"{policy}_batch"] = med(policy, "mean_decode_batch")
            row[f"{policy}_locked"] = med(policy, "locked_tokens_per_decode_step")
        row["x_best"] = row["feather_tok_s"] / row[f"{best}_tok_s"]
        if "feather-noconc" in by_policy:
            row["x_noconc"] = row["feather_tok_s"] / row["feather-noconc_tok_s"]
            row["num_concentrated"] = med("feather", "feather_num_concentrated")
        out.append(row)
    return out


def concentration_table(rows: list[dict]) -> str:
    cells = concentration_rows(rows)
    lines = [
        "| case | fcfs | dfs-weight | feather | rule off | x best (dfs/fcfs) | x rule off | groups/step "
        "feather / dfs | batch feather / dfs | locked K tok feather / dfs | held |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        off = c.get("feather-noconc_tok_s", float("nan"))
        lines.append(
            f"| {c['case']} | {c['fcfs_tok_s']:.0f} | {c['dfs-weight_tok_s']:.0f} | {c['feather_tok_s']:.0f} "
            f"| {off:.0f} | {c['x_best']:.3f} | {c.get('x_noconc', float('nan')):.3f} "
            f"| {c['feather_groups']:.1f} / {c['dfs-weight_groups']:.1f} "
            f"| {c['feather_batch']:.0f} / {c['dfs-weight_batch']:.0f} "
            f"| {c['feather_locked'] / 1e3:.1f} / {c['dfs-weight_locked'] / 1e3:.1f} "
            f"| {c.get('num_concentrated', float('nan')):.0f} |"
        )
    worst = min(cells, key=lambda c: c["x_best"], default=None)
    if worst is not None:
        lines.append("")
        lines.append(
            f"{len(cells)} cells; Feather / the better of dfs-weight and FCFS: min {worst['x_best']:.3f} "
            f"({worst['case']}), median {np.median([c['x_best'] for c in cells]):.3f}; cells below 0.98: "
            f"{sum(c['x_best'] < 0.98 for c in cells)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_feather.sim.sweeps", description=__doc__)
    p.add_argument("sweep", choices=sorted(SWEEPS), help="which experiment")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (each draws a new trace)")
    p.add_argument("--first-seed", type=int, default=0, help="start the seeds here (K..K+N-1)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated; fcfs first for ratios")
    p.add_argument("--only", default="", help="run only cases whose label contains this text")
    p.add_argument(
        "--fixed-cpu-ms", type=float, help="charge this scheduler CPU per call instead of measuring"
    )
    p.add_argument(
        "--attention",
        choices=sorted(ATTENTION_KERNELS),
        help="decode attention kernel of every case (default: each case's own, `plain` unless it names one)",
    )
    p.add_argument("--json", help="write every run's summary here")
    p.add_argument("--plot", help="concentration: draw the map of where the rule pays to this PNG")
    p.add_argument(
        "--load",
        nargs="+",
        metavar="JSON",
        help="print the tables of runs saved with --json instead of running",
    )
    args = p.parse_args(argv)
    policies = tuple(x for x in args.policies.split(",") if x)
    cpu = MeasuredCpu() if args.fixed_cpu_ms is None else FixedCpu(args.fixed_cpu_ms / 1e3)
    rows = []
    if args.load:
        for path in args.load:
            with open(path, encoding="utf-8") as f:
                rows += [r for r in json.load(f) if args.only in r["case"]]
    else:
        cases = list(SWEEPS[args.sweep]())
        if args.attention is not None:
            own = sorted({c.engine.attention for c in cases} - {EngineConfig().attention})
            if own:  # overriding would run one kernel under labels that name others
                raise SystemExit(
                    f"{args.sweep} runs its cases under kernels of their own ({', '.join(own)}): "
                    "pick them with --only, not --attention"
                )
        for case in cases:
            if args.attention is not None:
                case = replace(case, engine=replace(case.engine, attention=args.attention))
            if args.only in case.label:
                seeds = list(range(args.first_seed, args.first_seed + args.seeds))
                rows += run_case(case, policies, seeds, cpu)
                if args.json:  # after every case: a long sweep cut short keeps what it ran
                    _save(rows, args.json)
    print(table(rows, policies))
    if rows and all("cold_wait_max_s" in r for r in rows):
        print()
        print(table(rows, policies, STARVATION_METRICS))
    if all("max_wait_q1" in r for r in rows):
        print()
        print(table(rows, policies, WAIT_METRICS))
    if len({r["batch_order"] for r in rows}) > 1:
        print()
        print(order_table(rows))
    if concentration_rows(rows):
        print()
        print(concentration_table(rows))
        if args.plot:
            from sglang_feather.sim.plots import plot_concentration_map

            print(f"map: {plot_concentration_map(concentration_rows(rows), args.plot)}")
    if args.json:
        _save(rows, args.json)
    return 0


def _save(rows: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    raise SystemExit(main())
