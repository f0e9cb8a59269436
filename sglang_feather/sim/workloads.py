"""Seeded synthetic workloads: shared-prefix groups, long documents with questions, chat, no sharing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sglang_feather.sim.trace import SimRequest
from sglang_feather.workload import (
    ORDERS,
    Segment,
    SharedPrefixSpec,
    WorkloadRequest,
    poisson_arrivals,
    zipf_weights,
)


@dataclass(frozen=True)
class WorkloadConfig:
    """The shared-prefix spec every tool runs, plus the document workloads' knobs; each generator reads the
    knobs it documents. The spec's num_turns is chat's: gsp, paper and none are one turn, as bench_serving."""

    spec: SharedPrefixSpec = SharedPrefixSpec(num_turns=4)
    prompt_len: int = 1024
    num_docs: int = 20
    doc_len_range: tuple[int, int] = (3000, 32000)
    questions_range: tuple[int, int] = (5, 20)
    think_s: float = 1.0
    num_cold: int = 20
    """starvation: cold prompts among the hot groups."""
    cold_len: int = 16384
    """starvation: tokens of each cold prompt (shared with nothing)."""
    eos_outputs: bool = False
    """Outputs end at EOS: each request asks for the output cap (output_len_max, else output_len) and stops at
    its drawn length, so the engine reserves more than it uses (gsp, paper, none, chat)."""

    @property
    def max_new_tokens(self) -> int | None:
        """What each request of the spec asks for; None = exactly its output (`ignore_eos`)."""
        if not self.eos_outputs:
            return None
        return self.spec.output_len if self.spec.output_len_max is None else self.spec.output_len_max

    def with_spec(self, **changes: Any) -> WorkloadConfig:
        """This config with the spec's fields `changes` replaced."""
        return replace(self, spec=replace(self.spec, **changes))


def _order(reqs: list[SimRequest], spec: SharedPrefixSpec, rng: np.random.Generator) -> list[SimRequest]:
    """`reqs`, listed as generated, put in the spec's arrival order of their groups; then its arrival rate."""
    first: dict[str | None, int] = {}
    seen: Counter[str | None] = Counter()
    groups, members = [], []
    for r in reqs:
        groups.append(first.setdefault(r.group, len(first)))
        members.append(seen[r.group])
        seen[r.group] += 1
    reqs = [reqs[i] for i in ORDERS[spec.order](np.array(groups), np.array(members), rng)]
    if spec.rate is None:
        return reqs
    times = poisson_arrivals(rng, len(reqs), spec.rate)
    return [replace(r, arrival_s=float(t)) for r, t in zip(reqs, times, strict=True)]


def _sim_request(r: WorkloadRequest, group: str, cfg: WorkloadConfig, think_s: float = 0.0) -> SimRequest:
    return SimRequest(
        r.rid,
        r.arrival_s,
        r.output_len,
        r.segments,
        group=group,
        follows=r.follows,
        delay_s=think_s if r.follows else 0.0,
        output_key=r.answer_key,
        max_new_tokens=cfg.max_new_tokens,
    )


def generated_shared_prefix(cfg: WorkloadConfig) -> list[SimRequest]:
    """SGLang bench_serving's generated-shared-prefix: groups share a system prompt, then a unique question.

    Reads the spec's num_groups, num_requests, prefix_len (system prompt), question_len, output_len,
    popularity (uniform|zipf, zipf_alpha), order, rate, seed; one turn.
    """
    spec = replace(cfg.spec, num_turns=1)
    return [_sim_request(r, f"g{r.group}", cfg) for r in spec.requests()]


def paper(cfg: WorkloadConfig) -> list[SimRequest]:
    """The Feather paper's experiment: 8 groups x 100 requests on a shared prefix (prefix_len), shuffled."""
    return generated_shared_prefix(cfg.with_spec(num_groups=8, num_requests=800, popularity="uniform"))


def no_sharing(cfg: WorkloadConfig) -> list[SimRequest]:
    """num_requests unrelated prompts of prompt_len tokens (groups of one), each with output_len outputs."""
    spec = replace(
        cfg.spec,
        num_groups=cfg.spec.num_requests,
        prefix_len=cfg.prompt_len,
        question_len=0,
        popularity="uniform",
        num_turns=1,
    )
    return [_sim_request(r, f"g{r.group}", cfg) for r in spec.requests()]


def long_documents(cfg: WorkloadConfig) -> list[SimRequest]:
    """L-Eval-shaped: num_docs documents of doc_len_range tokens, each asked questions_range questions.

    Each request is document + one question (question_len) with output_len outputs; listed document by
    document, then put in the spec's order (random: shuffled) and rate.
    """
    spec = cfg.spec
    rng = np.random.default_rng(spec.seed)
    lo, hi = cfg.doc_len_range
    qlo, qhi = cfg.questions_range
    reqs = []
    for d in range(cfg.num_docs):
        doc = Segment(f"s{spec.seed}/doc{d}", int(rng.integers(lo, hi + 1)))
        for q in range(int(rng.integers(qlo, qhi + 1))):
            segs = (doc, Segment(f"s{spec.seed}/doc{d}.q{q}", spec.question_len))
            reqs.append(SimRequest(f"d{d}-{q}", 0.0, spec.output_len, segs, group=f"doc{d}"))
    return _order(reqs, spec, rng)


def rag(cfg: WorkloadConfig) -> list[SimRequest]:
    """Retrieval-augmented generation: num_requests requests, each one document + a unique question.

    num_docs documents of doc_len_range tokens; each request picks its document with Zipf(zipf_alpha)
    popularity (rank 1 most popular), question_len question tokens, output_len outputs; listed in draw
    order, then put in the spec's order and rate.
    """
    spec = cfg.spec
    rng = np.random.default_rng(spec.seed)
    lo, hi = cfg.doc_len_range
    lengths = rng.integers(lo, hi + 1, size=cfg.num_docs)
    docs = rng.choice(cfg.num_docs, size=spec.num_requests, p=zipf_weights(cfg.num_docs, spec.zipf_alpha))
    reqs = []
    for i, d in enumerate(docs):
        segs = (
            Segment(f"s{spec.seed}/rag{d}", int(lengths[d])),
            Segment(f"s{spec.seed}/rag{d}.q{i}", spec.question_len),
        )
        reqs.append(SimRequest(f"r{i}-d{d}", 0.0, spec.output_len, segs, group=f"doc{d}"))
    return _order(reqs, spec, rng)


def multi_turn_chat(cfg: WorkloadConfig) -> list[SimRequest]:
    """num_requests conversations of num_turns turns under one shared system prompt (prefix_len).

    Turn k's prompt is the system prompt plus every earlier question and answer, so it extends turn k-1's
    cached sequence; turn k arrives think_s after turn k-1 finishes. Conversations start offline or Poisson.
    """
    spec = replace(cfg.spec, num_groups=1, popularity="uniform")
    return [_sim_request(r, f"c{r.member}", cfg, cfg.think_s) for r in spec.requests()]


def starvation(cfg: WorkloadConfig) -> list[SimRequest]:
    """The aging guard's test: `num_cold` cold prompts of `cold_len` tokens (sharing nothing) among the hot
    generated-shared-prefix traffic of the spec (its groups, prefix, rate), each cold prompt arriving at a
    uniformly drawn time within the hot trace's arrival span."""
    hot = generated_shared_prefix(cfg)
    rng = np.random.default_rng(cfg.spec.seed + 1)
    span = max(r.arrival_s for r in hot)
    cold = [
        SimRequest(
            f"cold{i}",
            float(rng.uniform(0.0, span)),
            cfg.spec.output_len,
            (Segment(f"s{cfg.spec.seed}/cold{i}", cfg.cold_len),),
            group=f"cold{i}",
        )
        for i in range(cfg.num_cold)
    ]
    return sorted(hot + cold, key=lambda r: r.arrival_s)


@dataclass(frozen=True)
class Phase:
    """One phase of `phase_shift`: a workload of this module and the spec fields it changes."""

    label: str
    workload: str
    spec: dict[str, Any]


PHASE_SHIFT = (
    Phase("8 groups x 4K", "gsp", {"num_groups": 8, "prefix_len": 4096}),
    Phase("unique prompts", "none", {}),
    Phase("64 groups x 1K", "gsp", {"num_groups": 64, "prefix_len": 1024}),
)
"""Issue 22's example of a workload that shifts: 8 groups sharing 4K-token prefixes, then prompts that share
nothing (prompt_len tokens each), then 64 groups sharing 1K-token prefixes."""


def phase_shift(cfg: WorkloadConfig) -> list[SimRequest]:
    """The phases of `PHASE_SHIFT` one after the other, num_requests each (the spec's question_len,
    output_len, order and seed; uniform group sizes). Phase k's rids, groups and segment keys start with
    `p{k}`, so no two phases share a token. With a rate, each phase's Poisson arrivals start where the
    previous phase's ended; without one every request arrives at t = 0 in phase order (a client limit,
    --max-concurrency, then sends them phase by phase). A phase has at most num_requests groups (a small
    trace's phases keep one request per group)."""
    out: list[SimRequest] = []
    start = 0.0
    for k, phase in enumerate(PHASE_SHIFT):
        spec = dict(phase.spec)
        if "num_groups" in spec:
            spec["num_groups"] = min(spec["num_groups"], cfg.spec.num_requests)
        sub = cfg.with_spec(popularity="uniform", **spec)
        reqs = [_in_phase(r, k, start) for r in WORKLOADS[phase.workload](sub)]
        start = max((r.arrival_s for r in reqs), default=start)
        out += reqs
    return out


def _in_phase(r: SimRequest, k: int, start: float) -> SimRequest:
    tag = f"p{k}"
    return replace(
        r,
        rid=f"{tag}-{r.rid}",
        arrival_s=start + r.arrival_s,
        segments=tuple(replace(s, key=f"{tag}/{s.key}") for s in r.segments),
        group=None if r.group is None else f"{tag}-{r.group}",
        follows=None if r.follows is None else f"{tag}-{r.follows}",
        output_key=None if r.output_key is None else f"{tag}/{r.output_key}",
    )


WORKLOADS: dict[str, Callable[[WorkloadConfig], list[SimRequest]]] = {
    "gsp": generated_shared_prefix,
    "paper": paper,
    "leval": long_documents,
    "rag": rag,
    "chat": multi_turn_chat,
    "none": no_sharing,
    "starvation": starvation,
    "phase-shift": phase_shift,
}


def make_workload(name: str, cfg: WorkloadConfig) -> list[SimRequest]:
    gen = WORKLOADS.get(name)
    if gen is None:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    return gen(cfg)
