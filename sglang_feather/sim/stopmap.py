"""`python -m sglang_feather.sim.stopmap`: where a stopper's STOP pays, per GPU, groups, prefix, KV room and rate."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sglang_feather.admission import AdmissionConfig
from sglang_feather.policy import learning_policy_names, step_policy_names
from sglang_feather.sim.attention import ATTENTION_KERNELS
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.profile import load_profile
from sglang_feather.sim.report import summarize
from sglang_feather.sim.run import RunSpec, simulate
from sglang_feather.sim.sweeps import KV_PRESSURE, NO_SHARING
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec

# How it works.
#
# Each cell is one trace (workload, GPU profile, KV pool) run through Feather with every stopper on the same
# requests, scheduler CPU charged as zero so only the schedule counts: `always` (never stops), `static` with
# its physical group cap (as many groups as the profile's usable L2 holds prefixes of this length per layer,
# at least 1), each learning stopper of the registry at its defaults (`LEARNERS`: from the reward or each step), and `static` at each fixed
# group cap of `THRESHOLDS`; the best of the fixed caps and `always` is the cell's oracle. Every run is
# reported beside the physical bound of its own schedule (`Summary.bound_tok_s`: each decode step reading every
# shared prefix node once, as a cascade kernel would). The cells span the axes without the full product
# (a 2-core machine runs the map in 3-4 minutes per kernel and seed): gsp with Zipf(1.1) group sizes at 8, 32
# and 64 groups and 1K, 4K and 8K prefixes on A100 and RTX 6000 Ada, a subset on H200, a small KV pool and a
# low arrival rate at 32 groups x 4K, the KV-limited RAG trace,
# and unrelated prompts (where a STOP must cost nothing). `--requests` sets each gsp cell's request count.

THRESHOLDS = (2, 4, 8, 16)
"""The group caps the oracle sweeps (`static`'s `max_groups`)."""
LEARNERS = (*learning_policy_names(), *step_policy_names())
"""The stoppers that learn, from the throughput reward or from every decode step, each run at its defaults."""
BASELINES = ("dfs-weight",)
"""SGLang's policy run beside Feather in the cells the issue sets a bar on."""
DEFAULT_REQUESTS = 600
GSP_RATE = 40.0
"""The issue's arrival rate for 32 Zipf groups (req/s); the low-rate cells use `LOW_RATE`."""
LOW_RATE = 10.0
SMALL_POOL_TOKENS = 120_000
"""A KV pool of 120K tokens: about 29 4K prefixes, so 32 groups' prefixes do not all stay cached."""


@dataclass(frozen=True)
class Cell:
    label: str
    workload: str
    knobs: WorkloadConfig
    gpu: str
    prefix_len: int
    engine: EngineConfig = field(default_factory=EngineConfig)
    baselines: tuple[str, ...] = ()


def _gsp(groups: int, prefix: int, requests: int, seed: int, rate: float = GSP_RATE) -> WorkloadConfig:
    spec = SharedPrefixSpec(
        seed=seed,
        num_groups=groups,
        num_requests=requests,
        prefix_len=prefix,
        question_len=128,
        output_len=128,
        popularity="zipf",
        zipf_alpha=1.1,
        rate=rate,
    )
    return WorkloadConfig(spec)


def cells(requests: int, seed: int = 0) -> Iterator[Cell]:
    """The map's cells, every trace drawn with workload seed `seed`."""
    for gpu in ("a100-80gb", "rtx6000-ada"):
        for groups in (8, 32, 64):
            for prefix in (1024, 4096, 8192):
                bar = groups == 32 and prefix == 4096
                yield Cell(
                    f"{gpu} gsp {groups}g {prefix // 1024}K",
                    "gsp",
                    _gsp(groups, prefix, requests, seed),
                    gpu,
                    prefix,
                    baselines=BASELINES if bar else (),
                )
        small = EngineConfig(kv_capacity_tokens=SMALL_POOL_TOKENS)
        yield Cell(f"{gpu} gsp 32g 4K small-kv", "gsp", _gsp(32, 4096, requests, seed), gpu, 4096, small)
        low = _gsp(32, 4096, requests, seed, LOW_RATE)
        yield Cell(f"{gpu} gsp 32g 4K {LOW_RATE:g}req/s", "gsp", low, gpu, 4096)
    for groups, prefix in ((8, 1024), (32, 4096), (64, 8192)):
        yield Cell(
            f"h200 gsp {groups}g {prefix // 1024}K",
            "gsp",
            _gsp(groups, prefix, requests, seed),
            "h200",
            prefix,
        )
    rag = KV_PRESSURE["rag"].with_spec(num_requests=requests, seed=seed)
    yield Cell("a100-80gb rag kv-limited", "rag", rag, "a100-80gb", 9216, baselines=BASELINES)
    none = NO_SHARING.with_spec(num_requests=min(requests, 400), seed=seed)
    for gpu in ("a100-80gb", "h200"):
        yield Cell(f"{gpu} no-sharing", "none", none, gpu, 0)


def physical_cap(cost: PhysicsCostModel, prefix_len: int) -> int:
    """Prefixes of `prefix_len` tokens the profile's usable L2 holds per layer (at least 1)."""
    if prefix_len <= 0:
        return 1
    return max(1, int(cost.l2_usable_tokens // prefix_len))


def _variants(cap: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, policy, admission options) per run of a cell."""
    runs: list[tuple[str, str, dict[str, Any]]] = [
        ("always", "feather", {"stopper": "always"}),
        (f"static (cap {cap})", "feather", {"stopper": "static", "stopper_options": {"max_groups": cap}}),
        *((name, "feather", {"stopper": name}) for name in LEARNERS),
    ]
    runs += [
        (f"cap {t}", "feather", {"stopper": "static", "stopper_options": {"max_groups": t}})
        for t in THRESHOLDS
        if t != cap
    ]
    return runs


def run_cell(cell: Cell, attention: str = "plain") -> dict[str, Any]:
    """Every stopper (and the cell's baselines) on the cell's trace, decode attention by `attention`."""
    engine = replace(cell.engine, attention=attention)
    requests = make_workload(cell.workload, cell.knobs)
    cost = PhysicsCostModel(load_profile(cell.gpu, "llama-3-8b"))
    cap = physical_cap(cost, cell.prefix_len)
    runs = []
    plans = [*_variants(cap), *((name, name, {}) for name in cell.baselines)]
    if cell.baselines:  # the bar cells also measure what STOP holds back: the whole pass, or new groups only
        plans += [
            ("ucb, STOP ends the pass", "feather", {"stopper": "ucb", "stop_scope": "pass"}),
            (f"static (cap {cap}), STOP ends the pass", "feather", {**plans[1][2], "stop_scope": "pass"}),
        ]
    for label, policy, options in plans:
        spec = RunSpec(policy, AdmissionConfig(**options))
        log = simulate(requests, cost, spec, engine, FixedCpu(0.0))
        runs.append({"label": label, "summary": asdict(summarize(label, log)), "admission": log.admission})
    return {
        "cell": cell.label,
        "gpu": cell.gpu,
        "attention": attention,
        "seed": cell.knobs.spec.seed,
        "num_requests": len(requests),
        "cap": cap,
        "runs": runs,
    }


def _tok_s(result: dict[str, Any], label_start: str) -> float:
    return next(r["summary"]["output_tok_s"] for r in result["runs"] if r["label"].startswith(label_start))


def oracle(result: dict[str, Any]) -> tuple[str, float]:
    """The best fixed setting: `always` or a fixed group cap (the physical cap counts as one)."""
    fixed = [
        r
        for r in result["runs"]
        if r["label"] == "always" or (r["label"].startswith(("cap ", "static")) and "pass" not in r["label"])
    ]
    best = max(fixed, key=lambda r: r["summary"]["output_tok_s"])
    return best["label"], best["summary"]["output_tok_s"]


def table(results: list[dict[str, Any]]) -> str:
    """One row per cell: tok/s of each stopper as a ratio to always, the oracle, and each as % of its bound."""
    head = [
        "cell",
        "always tok/s (% bound)",
        "static",
        *LEARNERS,
        "oracle",
        "dfs-weight",
        "ucb consults/stops",
    ]
    rows = [head, ["---"] * len(head)]
    for res in results:
        base = _tok_s(res, "always")
        by = {r["label"]: r for r in res["runs"]}
        always = by["always"]["summary"]

        def cell(label: str, by=by, base=base) -> str:
            s = by[label]["summary"]
            return f"{s['output_tok_s'] / base:.3f} ({s['pct_of_bound']:.0%})"

        static = next(label for label in by if label.startswith("static") and "pass" not in label)
        best, best_tok = oracle(res)
        dfs = cell("dfs-weight") if "dfs-weight" in by else ""
        ucb = by["ucb"]["admission"]
        rows.append(
            [
                res["cell"] + (f" s{res['seed']}" if "seed" in res else ""),
                f"{always['output_tok_s']:.0f} ({always['pct_of_bound']:.0%})",
                f"{cell(static)} {static[7:]}",
                *(cell(name) if name in by else "" for name in LEARNERS),  # saved runs may lack a later one
                f"{best_tok / base:.3f} ({best})",
                dfs,
                f"{ucb['num_consults']}/{ucb['num_stops']}",
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


PAYING_GAIN = 0.05
"""A cell where the oracle beats `always` by this much is one where a STOP pays."""


def learner_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per learning stopper: the share of the oracle's gain it reaches where a STOP pays (>= 5 %), with its
    consults and stops there, its worst ratio to `always` where the oracle is `always` itself, and its worst
    where the oracle beats `always` by less than 5 %."""
    lines = []
    for learner in LEARNERS:
        shares, flat, near = [], [], []
        for res in results:
            runs = {r["label"]: r for r in res["runs"]}
            if learner not in runs:
                continue
            by = {label: r["summary"]["output_tok_s"] for label, r in runs.items()}
            base = by["always"]
            best, best_tok = oracle(res)
            label = res["cell"] + (f" s{res['seed']}" if "seed" in res else "")
            ratio = by[learner] / base
            if best_tok / base - 1 >= PAYING_GAIN:
                counts = runs[learner]["admission"]
                share = (by[learner] - base) / (best_tok - base)
                shares.append(f"{share:.0%} ({label}, {counts['num_consults']}/{counts['num_stops']})")
            elif best == "always":
                flat.append((ratio, label))
            else:
                near.append((ratio, label))
        paying = ", ".join(shares) or "none"
        lines.append(
            f"{learner}: share of the oracle's gain in the {len(shares)} cells where a STOP pays >= "
            f"{PAYING_GAIN:.0%} (consults/stops): {paying}; worst ratio to always in the {len(flat)} cells where "
            f"always is best: {_worst(flat)}; in the {len(near)} where the oracle gains less: {_worst(near)}"
        )
    return lines


def _worst(ratios: list[tuple[float, str]]) -> str:
    if not ratios:
        return "-"
    ratio, label = min(ratios)
    return f"{ratio:.3f} ({label})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_feather.sim.stopmap", description=__doc__)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="requests per gsp/rag cell")
    parser.add_argument("--only", default=None, help="run only the cells whose label contains this text")
    parser.add_argument(
        "--attention",
        choices=sorted(ATTENTION_KERNELS),
        default="plain",
        help="decode attention kernel of every run (the simulator's --attention)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed of every cell's trace")
    parser.add_argument("--json", default=None, help="write every run's summary and counters here")
    parser.add_argument("--load", nargs="+", default=None, help="reprint the table of saved runs")
    args = parser.parse_args(argv)
    if args.load:
        results = [res for path in args.load for res in json.load(open(path, encoding="utf-8"))["cells"]]
        print(table(results))
        print("\n".join(learner_lines(results)))
        return 0
    results = []
    for c in cells(args.requests, args.seed):
        if args.only is not None and args.only not in c.label:
            continue
        results.append(run_cell(c, args.attention))
        print(table(results[-1:]).split("\n")[-1], flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                meta = {"requests": args.requests, "attention": args.attention, "seed": args.seed}
                meta["thresholds"] = THRESHOLDS
                json.dump({**meta, "cells": results}, f, indent=1)
    print(table(results))
    print("\n".join(learner_lines(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
