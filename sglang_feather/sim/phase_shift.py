"""`python -m sglang_feather.sim.phase_shift`: stoppers on a workload that shifts, against the per-phase oracle."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.cpu import FixedCpu, MeasuredCpu
from sglang_feather.sim.engine import EngineConfig
from sglang_feather.sim.metrics import RunLog, StepKind
from sglang_feather.sim.profile import load_profile
from sglang_feather.sim.run import RunSpec, simulate
from sglang_feather.sim.workloads import PHASE_SHIFT, WorkloadConfig, make_workload
from sglang_feather.workload import SharedPrefixSpec

# How it works.
#
# The trace is `workloads.phase_shift` (8 groups x 4K, unique prompts, 64 groups x 1K), every request sent at
# t = 0 in phase order through a client limit of `MAX_CONCURRENCY` requests in flight (bench_serving's
# --max-concurrency): the scheduler sees one phase at a time, except for the requests in flight at a
# boundary, and throughput depends on the schedule (an open arrival rate would fix it at the offered load,
# or, overloaded, queue the phases on top of each other). Feather runs the trace once per stopper. A phase's
# throughput is its output tokens over its span (its first request sent to its last finished). The per-phase
# oracle is, for each phase, the best of the fixed static stoppers of `ORACLE_GRID` (each run over the whole
# trace); a policy's regret in a phase is 1 − its throughput / the oracle's, and over the trace it is the
# oracle's time (Σ phase tokens / oracle throughput) over the policy's. Time to adapt after a shift: the
# phase's decode throughput in `WINDOW_S` windows from the phase's start, compared with the oracle run's
# same windows; it is the start of the first two consecutive windows within `ADAPT_GAP` of the oracle's.

WORKLOAD = WorkloadConfig(
    SharedPrefixSpec(num_requests=400, question_len=128, output_len=128), prompt_len=2048
)
"""400 requests per phase; question and output lengths of the KV-pressure sweep (128, 128), unique prompts of
the no-sharing sweep's 2,048 tokens (sim/sweeps.py); the groups and prefix lengths are issue 22's example."""
MAX_CONCURRENCY = 256
"""Requests in flight: enough to fill A100's KV room in the unique phase (256 x 2.2K tokens, more than the
pool's ~430K minus the cached prefixes) while the shared phases fit, so the phases differ in KV pressure."""
WINDOW_S = 5.0
"""Windows of decode throughput when timing adaptation: a few hundred decode steps each."""
ADAPT_GAP = 0.03
"""Within 3 % of the oracle's window throughput: the issue's bar for the adaptive stopper."""


@dataclass(frozen=True)
class Stopper:
    """A Feather stopper and its options, as `--feather-stopper` and `--feather-stopper-options` give them."""

    name: str
    options: Mapping[str, object] = field(default_factory=dict)

    def admission(self) -> AdmissionConfig:
        return AdmissionConfig(stopper=self.name, stopper_options=dict(self.options))


STOPPERS: dict[str, Stopper] = {
    "always": Stopper("always"),
    "static": Stopper("static"),
    "ucb": Stopper("ucb"),
    "ucb-adaptive": Stopper("ucb-adaptive"),
}
ORACLE_GRID: dict[str, Stopper] = {
    **{f"static max_groups={g}": Stopper("static", {"max_groups": g}) for g in (2, 4, 8, 16, 32, 64)},
    **{f"static min_new_group={m}": Stopper("static", {"min_new_group": m}) for m in (2, 4, 8, 16)},
}
"""The fixed thresholds swept for the per-phase oracle (with `always` and `static` above): a cap on the groups
a decode step reads, or a least group size to admit a new group (`StaticConfig`)."""


def phase_of(rid: str) -> int:
    return int(rid.split("-", 1)[0].removeprefix("p"))


@dataclass(frozen=True)
class PhaseStats:
    tok_s: float
    start_s: float
    end_s: float
    window_tok_s: tuple[float, ...]


def phase_stats(log: RunLog) -> list[PhaseStats]:
    """Per phase: output tokens over span, and decode throughput in WINDOW_S windows from the phase start."""
    out = []
    for k in range(len(PHASE_SHIFT)):
        reqs = [r for r in log.requests if phase_of(r.rid) == k]
        start, end = min(r.arrival_s for r in reqs), max(r.finish_s for r in reqs)
        tokens = sum(r.output_len for r in reqs)
        edges = np.arange(start, end + WINDOW_S, WINDOW_S)
        decode = [s for s in log.steps if s.kind is StepKind.DECODE and start <= s.start_s < end]
        sums = np.histogram([s.start_s for s in decode], bins=edges, weights=[s.num_tokens for s in decode])[
            0
        ]
        out.append(PhaseStats(tokens / (end - start), start, end, tuple(float(x) / WINDOW_S for x in sums)))
    return out


def time_to_adapt(mine: PhaseStats, oracle: PhaseStats) -> float | None:
    """Seconds from the phase start to the first two consecutive windows within ADAPT_GAP of the oracle's."""
    pairs = list(zip(mine.window_tok_s, oracle.window_tok_s, strict=False))
    ok = [m >= (1 - ADAPT_GAP) * o for m, o in pairs]
    for i in range(len(ok) - 1):
        if ok[i] and ok[i + 1]:
            return i * WINDOW_S
    return None


def run(
    gpu: str,
    model: str,
    seed: int,
    names: Sequence[str],
    cpu,
    workload: WorkloadConfig = WORKLOAD,
    max_concurrency: int = MAX_CONCURRENCY,
) -> dict[str, dict]:
    """Every stopper of `names` (from STOPPERS and ORACLE_GRID) over one seed's trace: a row each."""
    cost = PhysicsCostModel(load_profile(gpu, model))
    requests = make_workload("phase-shift", workload.with_spec(seed=seed))
    engine = EngineConfig(max_concurrency=max_concurrency)
    rows: dict[str, dict] = {}
    for name in names:
        stopper = {**STOPPERS, **ORACLE_GRID}[name]
        log = simulate(requests, cost, RunSpec("feather", stopper.admission()), engine, cpu)
        stats = phase_stats(log)
        tokens = [sum(r.output_len for r in log.requests if phase_of(r.rid) == k) for k in range(len(stats))]
        rows[name] = {
            "stopper": name,
            "seed": seed,
            "gpu": gpu,
            "tok_s": sum(tokens) / log.end_s,
            "phase_tok_s": [s.tok_s for s in stats],
            "phase_tokens": tokens,
            "phases": [s.__dict__ | {"window_tok_s": list(s.window_tok_s)} for s in stats],
            "admission": log.admission,
        }
        print(f"{gpu} seed={seed} {name}: {rows[name]['tok_s']:.0f} tok/s", file=sys.stderr, flush=True)
    return rows


def compare(rows: dict[str, dict]) -> dict[str, dict]:
    """Per stopper of STOPPERS: x oracle per phase and over the trace, time to adapt per shift."""
    candidates = list(rows.values())
    num_phases = len(PHASE_SHIFT)
    oracle = [max(candidates, key=lambda r: r["phase_tok_s"][k]) for k in range(num_phases)]
    tokens = oracle[0]["phase_tokens"]
    oracle_time = sum(t / o["phase_tok_s"][k] for k, (t, o) in enumerate(zip(tokens, oracle, strict=True)))
    out = {}
    for name in STOPPERS:
        if name not in rows:
            continue
        r = rows[name]
        mine_time = sum(t / r["phase_tok_s"][k] for k, t in enumerate(tokens))
        adapt = [
            time_to_adapt(_stats(r["phases"][k]), _stats(oracle[k]["phases"][k]))
            for k in range(1, num_phases)
        ]
        out[name] = {
            "x_oracle": [r["phase_tok_s"][k] / oracle[k]["phase_tok_s"][k] for k in range(num_phases)],
            "x_oracle_trace": oracle_time / mine_time,
            "adapt_s": adapt,
            "oracle": [o["stopper"] for o in oracle],
        }
    return out


def _stats(d: dict) -> PhaseStats:
    return PhaseStats(d["tok_s"], d["start_s"], d["end_s"], tuple(d["window_tok_s"]))


def table(rows: dict[str, dict], comparison: dict[str, dict]) -> str:
    labels = [p.label for p in PHASE_SHIFT]
    head = ["stopper", "tok/s", *(f"{lab} tok/s (x oracle)" for lab in labels), "x oracle (trace)"]
    head += [f"adapt s -> {lab}" for lab in labels[1:]]
    head += ["consults", "stops"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in comparison.items():
        r = rows[name]
        cells = [name, f"{r['tok_s']:.0f}"]
        cells += [f"{t:.0f} ({x:.3f})" for t, x in zip(r["phase_tok_s"], c["x_oracle"], strict=True)]
        cells.append(f"{c['x_oracle_trace']:.3f}")
        cells += ["never" if a is None else f"{a:.0f}" for a in c["adapt_s"]]
        admission = r["admission"] or {}
        cells += [str(admission.get("num_consults", "")), str(admission.get("num_stops", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    best = next(iter(comparison.values()))["oracle"] if comparison else []
    oracle_cells = [
        f"{lab}: {name} ({rows[name]['phase_tok_s'][k]:.0f} tok/s)"
        for k, (lab, name) in enumerate(zip(labels, best, strict=True))
    ]
    return "\n".join(lines) + "\n\nper-phase oracle: " + "; ".join(oracle_cells)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_feather.sim.phase_shift", description=__doc__)
    p.add_argument("--gpu", default="a100-80gb")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (each draws a new trace)")
    p.add_argument(
        "--fixed-cpu-ms", type=float, help="charge this scheduler CPU per call instead of measuring"
    )
    p.add_argument("--json", help="write every run and the comparison here")
    p.add_argument("--load", help="print the tables of a run saved with --json instead of running")
    args = p.parse_args(argv)
    cpu = MeasuredCpu() if args.fixed_cpu_ms is None else FixedCpu(args.fixed_cpu_ms / 1e3)
    if args.load:
        with open(args.load, encoding="utf-8") as f:
            runs = json.load(f)["runs"]
    else:
        names = [*STOPPERS, *ORACLE_GRID]
        runs = [run(args.gpu, args.model, seed, names, cpu) for seed in range(args.seeds)]
    comparisons = [compare(rows) for rows in runs]
    for rows, comparison in zip(runs, comparisons, strict=True):
        seed = next(iter(rows.values()))["seed"]
        print(f"\n## phase shift, seed {seed}, on {args.gpu} x {args.model}\n")
        print(table(rows, comparison))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"argv": sys.argv[1:], "runs": runs, "comparisons": comparisons}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
