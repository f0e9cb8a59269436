"""Command-line options of `python -m sglang_feather.sim` (the single place that turns flags into configs)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any

from sglang_feather.admission import AdmissionConfig
from sglang_feather.options import ConfigError, add_flags, build, declared, flag, given_flags
from sglang_feather.sim import profile
from sglang_feather.sim.attention import ATTENTION_KERNELS
from sglang_feather.sim.engine import BATCH_ORDERS, EngineConfig
from sglang_feather.sim.policies import POLICIES
from sglang_feather.sim.token_ratio import NewTokenRatio, parse_ratio
from sglang_feather.sim.workloads import WORKLOADS, WorkloadConfig
from sglang_feather.workload import WorkloadFlags

DEFAULT_POLICIES = "fcfs,lpm,dfs-weight,feather"

NOT_SIMULATED = {"state_path": "a simulated run starts with a fresh stopper and keeps nothing it learned"}
"""Declared Feather options the simulator has no flag for, with why."""

FEATHER_FLAGS = tuple(opt for opt in declared(AdmissionConfig) if opt.name not in NOT_SIMULATED)
"""`--feather-*` flags, spelt and checked as SGLang's (`sglang_feather.options`)."""


WORKLOAD_FLAGS = WorkloadFlags(
    WorkloadConfig().spec,
    per_group=True,
    scopes={
        "num_groups": "gsp",
        "num_requests": "none, rag, chat",
        "prefix_len": "gsp, paper, chat",
        "popularity": "gsp",
        "zipf_alpha": "gsp, rag (documents are its groups)",
        "num_turns": "chat",
        "prompts_per_group": "gsp",
    },
)
"""`--num-groups`, `--prefix-len`, ...: the shared-prefix spec's fields (`sglang_feather.workload`)."""

SIM_WORKLOAD_FIELDS = {f.name for f in fields(WorkloadConfig)} - {"spec"}
"""The simulator's own workload knobs (leval, rag, none, chat), with hand-written flags."""


def _ratio(text: str) -> NewTokenRatio:
    try:
        return parse_ratio(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep or int(lo) > int(hi):
        raise argparse.ArgumentTypeError(f"expected LO:HI with LO <= HI, got {text!r}")
    return int(lo), int(hi)


def build_parser() -> argparse.ArgumentParser:
    d = WorkloadConfig()
    e = EngineConfig()
    p = argparse.ArgumentParser(
        prog="python -m sglang_feather.sim",
        description="Replay a workload through a model of SGLang 0.5.23 continuous batching on one GPU and "
        "compare scheduling policies (fcfs, lpm, dfs-weight run SGLang's own code; feather runs Admission).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="paper",
        help="gsp: SGLang generated-shared-prefix; paper: 8 groups x 100; leval: long documents with "
        "several questions; rag: Zipf-popular documents + a question; chat: multi-turn conversations; "
        "none: no sharing; starvation: cold prompts among gsp's hot groups",
    )
    w.add_argument("--trace", help="replay this JSONL trace instead of generating a workload")
    w.add_argument("--export-trace", help="write the (generated) trace to this JSONL file")
    WORKLOAD_FLAGS.add_to(w, aliases={"popularity": ("--group-dist",)})
    w.add_argument(
        "--ordered",
        dest="order",
        action="store_const",
        const="contiguous",
        default=argparse.SUPPRESS,
        help="same as --order contiguous: requests grouped in arrival order",
    )
    w.add_argument("--prompt-len", type=int, default=d.prompt_len, help="none: prompt tokens")
    w.add_argument("--num-docs", type=int, default=d.num_docs, help="leval, rag: documents")
    w.add_argument(
        "--doc-len-range", type=_range, default=d.doc_len_range, help="leval, rag: document tokens LO:HI"
    )
    w.add_argument(
        "--questions-range",
        type=_range,
        default=d.questions_range,
        help="leval: questions per document LO:HI",
    )
    w.add_argument(
        "--think-s", type=float, default=d.think_s, help="chat: seconds between a reply and the next turn"
    )
    w.add_argument("--num-cold", type=int, default=d.num_cold, help="starvation: cold prompts among the hot")
    w.add_argument("--cold-len", type=int, default=d.cold_len, help="starvation: tokens per cold prompt")
    w.add_argument(
        "--eos-outputs",
        action="store_true",
        help="outputs end at EOS: requests ask for the output cap (--output-len-max, else --output-len) and "
        "stop at their drawn length (gsp, paper, none, chat); pair with --new-token-ratio sglang",
    )
    w.add_argument(
        "--sweep", help="KEY=V1,V2,...: rerun for each value of a workload option, e.g. prefix_len=1024,4096"
    )

    s = p.add_argument_group("policies")
    s.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated, from {sorted(POLICIES)}")
    add_flags(
        p.add_argument_group("feather (the options of SGLang's --schedule-policy feather)"), FEATHER_FLAGS
    )

    g = p.add_argument_group("cost model")
    g.add_argument("--gpu", choices=profile.available("gpu"), default="h200", help="GPU profile")
    g.add_argument("--model", choices=profile.available("model"), default="llama-3-8b", help="model profile")
    g.add_argument(
        "--profile-override",
        action="append",
        default=[],
        metavar="FILE",
        help="JSON file of measured constants merged over the profile (repeatable; docs/simulator.md)",
    )

    n = p.add_argument_group("engine (SGLang server arguments)")
    n.add_argument(
        "--mem-fraction-static",
        type=float,
        default=e.mem_fraction_static,
        help="GPU memory share for weights + KV",
    )
    n.add_argument(
        "--max-prefill-tokens", type=int, default=e.max_prefill_tokens, help="prefill token budget per pass"
    )
    n.add_argument(
        "--chunked-prefill-size", type=int, default=e.chunked_prefill_size, help="chunk budget per pass"
    )
    n.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    n.add_argument("--max-running-requests", type=int, default=e.max_running_requests, help="request slots")
    n.add_argument(
        "--new-token-ratio",
        type=_ratio,
        default=e.new_token_ratio,
        help="share of remaining outputs reserved per running request: a fixed ratio (1 = exact for "
        "fixed-length outputs; below 1 allows retraction) or 'sglang', SGLang's schedule (0.7 decaying to "
        "0.098 over 600 decode steps, reset when idle, re-estimated after a retraction)",
    )
    n.add_argument("--block-size", type=int, default=e.block_size, help="simulator prefix-cache block tokens")
    n.add_argument(
        "--kv-capacity-tokens", type=int, help="KV pool tokens (default: from the profile's memory)"
    )
    n.add_argument(
        "--warm-cache", action="store_true", help="start with every shared prefix cached (paper's warm-up)"
    )
    n.add_argument(
        "--overlap-schedule",
        action=argparse.BooleanOptionalAction,
        default=e.overlap_schedule,
        help="SGLang's overlap scheduler (its default): a step takes max(GPU, CPU), and a finished prefill is "
        "cached only after the next pass is scheduled (--no-overlap-schedule = --disable-overlap-schedule)",
    )
    n.add_argument(
        "--batch-order",
        choices=sorted(BATCH_ORDERS),
        default=e.batch_order,
        help="running-batch order: admission (SGLang's merge_batch appends) or prefix (requests sharing a "
        "prefix contiguous, re-sorted after each merge)",
    )
    n.add_argument(
        "--attention",
        choices=sorted(ATTENTION_KERNELS),
        default=e.attention,
        help="decode attention kernel: plain (request by request: SGLang 0.5.23, vLLM 0.18+), cascade (vLLM "
        "0.7-0.17: a prefix every running request shares read once, >= 256 tokens and >= 8 requests) or "
        "grouped (each distinct shared prefix read once: --attention-backend feather_grouped)",
    )
    n.add_argument(
        "--max-concurrency",
        type=int,
        help="client limit on requests in flight, as bench_serving --max-concurrency (default: none)",
    )
    n.add_argument(
        "--fixed-cpu-ms", type=float, help="charge this scheduler CPU per call instead of measuring"
    )

    o = p.add_argument_group("output")
    o.add_argument("--json", help="write every summary and the profile provenance to this JSON file")
    o.add_argument("--plot-dir", help="with --sweep: write throughput_vs_<key>.png here")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument(
        "--wait-bins",
        type=int,
        default=0,
        help="also print queue-wait quantiles per prompt-length quantile bin (this many bins; 0 = off)",
    )
    o.add_argument(
        "--long-wait-s", type=float, default=20.0, help="with --wait-bins: count waits longer than this"
    )
    return p


def workload_config(args: argparse.Namespace, **sweep: Any) -> WorkloadConfig:
    """The workload of the flags given, a sweep's `{key: value}` taken as given too."""
    args = argparse.Namespace(**{**vars(args), **sweep})
    if args.workload != "gsp" and not hasattr(args, "num_groups"):
        # Only gsp reads the group count (the others set their own), so its default must not limit theirs.
        args.num_groups = 1
    try:
        spec = WORKLOAD_FLAGS.spec(args, per_group=args.workload == "gsp")
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    return WorkloadConfig(spec, **{k: v for k, v in vars(args).items() if k in SIM_WORKLOAD_FIELDS})


def admission_config(args: argparse.Namespace) -> AdmissionConfig:
    """Feather's options from the flags given; the others keep production's defaults."""
    try:
        return build(AdmissionConfig, given_flags(args, FEATHER_FLAGS), flag)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        mem_fraction_static=args.mem_fraction_static,
        max_prefill_tokens=args.max_prefill_tokens,
        chunked_prefill_size=None if args.no_chunked_prefill else args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        new_token_ratio=args.new_token_ratio,
        block_size=args.block_size,
        kv_capacity_tokens=args.kv_capacity_tokens,
        overlap_schedule=args.overlap_schedule,
        batch_order=args.batch_order,
        max_concurrency=args.max_concurrency,
        warm_cache=args.warm_cache,
        attention=args.attention,
    )


def sweep_values(text: str | None) -> tuple[str | None, list[int | float]]:
    if text is None:
        return None, [0]
    key, sep, values = text.partition("=")
    if not sep or key not in SIM_WORKLOAD_FIELDS | {opt.dest() for opt in WORKLOAD_FLAGS.options()}:
        raise SystemExit(f"--sweep: expected KEY=V1,V2 with KEY a workload option, got {text!r}")
    return key, [json.loads(v) for v in values.split(",")]
