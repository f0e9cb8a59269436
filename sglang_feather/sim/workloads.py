"""Seeded synthetic workloads: shared-prefix groups, long documents with questions, chat, no sharing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from sglang_feather.sim.trace import SimRequest
from sglang_feather.workload import (
    Segment,
    SharedPrefixSpec,
    WorkloadRequest,
    poisson_arrivals,
    zipf_weights,
)


@dataclass(frozen=True)
class WorkloadConfig:
    """Every generator's knobs; each generator reads the ones it documents and ignores the rest."""

    seed: int = 0
    num_groups: int = 8
    prompts_per_group: int = 100
    prefix_len: int = 4096
    question_len: int = 20
    output_len: int = 50
    group_dist: str = "uniform"
    zipf_alpha: float = 1.0
    ordered: bool = False
    num_requests: int = 800
    prompt_len: int = 1024
    num_docs: int = 20
    doc_len_range: tuple[int, int] = (3000, 32000)
    questions_range: tuple[int, int] = (5, 20)
    num_turns: int = 4
    think_s: float = 1.0
    rate: float | None = None
    """Poisson arrivals at this many requests/s; None = all at t=0 (offline)."""


def _order(reqs: list[SimRequest], cfg: WorkloadConfig, rng: np.random.Generator) -> list[SimRequest]:
    if not cfg.ordered:
        reqs = [reqs[i] for i in rng.permutation(len(reqs))]
    if cfg.rate is None:
        return reqs
    times = poisson_arrivals(rng, len(reqs), cfg.rate)
    return [replace(r, arrival_s=float(t)) for r, t in zip(reqs, times, strict=True)]


def _shared_prefix_spec(cfg: WorkloadConfig, **overrides) -> SharedPrefixSpec:
    knobs = dict(
        num_groups=cfg.num_groups,
        num_requests=cfg.num_groups * cfg.prompts_per_group,
        prefix_len=cfg.prefix_len,
        question_len=cfg.question_len,
        output_len=cfg.output_len,
        popularity=cfg.group_dist,
        zipf_alpha=cfg.zipf_alpha,
        order="contiguous" if cfg.ordered else "random",
        rate=cfg.rate,
        seed=cfg.seed,
    )
    return SharedPrefixSpec(**{**knobs, **overrides})


def _sim_request(r: WorkloadRequest, group: str, think_s: float = 0.0) -> SimRequest:
    return SimRequest(
        r.rid,
        r.arrival_s,
        r.output_len,
        r.segments,
        group=group,
        follows=r.follows,
        delay_s=think_s if r.follows else 0.0,
        output_key=r.answer_key,
    )


def generated_shared_prefix(cfg: WorkloadConfig) -> list[SimRequest]:
    """SGLang bench_serving's generated-shared-prefix: groups share a system prompt, then a unique question.

    Knobs: num_groups, prompts_per_group, prefix_len (system prompt), question_len, output_len,
    group_dist (uniform|zipf, zipf_alpha), ordered (False = shuffled arrival, as bench_serving), rate, seed.
    """
    return [_sim_request(r, f"g{r.group}") for r in _shared_prefix_spec(cfg).requests()]


def paper(cfg: WorkloadConfig) -> list[SimRequest]:
    """The Feather paper's experiment: 8 groups x 100 requests on a shared prefix (prefix_len), shuffled."""
    return generated_shared_prefix(replace(cfg, num_groups=8, prompts_per_group=100, group_dist="uniform"))


def no_sharing(cfg: WorkloadConfig) -> list[SimRequest]:
    """num_requests unrelated prompts of prompt_len tokens (groups of one), each with output_len outputs."""
    spec = _shared_prefix_spec(
        cfg,
        num_groups=cfg.num_requests,
        num_requests=cfg.num_requests,
        prefix_len=cfg.prompt_len,
        question_len=0,
        popularity="uniform",
    )
    return [_sim_request(r, f"g{r.group}") for r in spec.requests()]


def long_documents(cfg: WorkloadConfig) -> list[SimRequest]:
    """L-Eval-shaped: num_docs documents of doc_len_range tokens, each asked questions_range questions.

    Each request is document + one question (question_len) with output_len outputs; arrivals shuffled.
    """
    rng = np.random.default_rng(cfg.seed)
    lo, hi = cfg.doc_len_range
    qlo, qhi = cfg.questions_range
    reqs = []
    for d in range(cfg.num_docs):
        doc = Segment(f"s{cfg.seed}/doc{d}", int(rng.integers(lo, hi + 1)))
        for q in range(int(rng.integers(qlo, qhi + 1))):
            segs = (doc, Segment(f"s{cfg.seed}/doc{d}.q{q}", cfg.question_len))
            reqs.append(SimRequest(f"d{d}-{q}", 0.0, cfg.output_len, segs, group=f"doc{d}"))
    return _order(reqs, cfg, rng)


def rag(cfg: WorkloadConfig) -> list[SimRequest]:
    """Retrieval-augmented generation: num_requests requests, each one document + a unique question.

    num_docs documents of doc_len_range tokens; each request picks its document with Zipf(zipf_alpha)
    popularity (rank 1 most popular), question_len question tokens, output_len outputs; rate for Poisson.
    """
    rng = np.random.default_rng(cfg.seed)
    lo, hi = cfg.doc_len_range
    lengths = rng.integers(lo, hi + 1, size=cfg.num_docs)
    docs = rng.choice(cfg.num_docs, size=cfg.num_requests, p=zipf_weights(cfg.num_docs, cfg.zipf_alpha))
    reqs = []
    for i, d in enumerate(docs):
        segs = (
            Segment(f"s{cfg.seed}/rag{d}", int(lengths[d])),
            Segment(f"s{cfg.seed}/rag{d}.q{i}", cfg.question_len),
        )
        reqs.append(SimRequest(f"r{i}-d{d}", 0.0, cfg.output_len, segs, group=f"doc{d}"))
    return _order(reqs, cfg, rng)


def multi_turn_chat(cfg: WorkloadConfig) -> list[SimRequest]:
    """num_requests conversations of num_turns turns under one shared system prompt (prefix_len).

    Turn k's prompt is the system prompt plus every earlier question and answer, so it extends turn k-1's
    cached sequence; turn k arrives think_s after turn k-1 finishes. Conversations start offline or Poisson.
    """
    spec = _shared_prefix_spec(
        cfg, num_groups=1, num_requests=cfg.num_requests, num_turns=cfg.num_turns, popularity="uniform"
    )
    return [_sim_request(r, f"c{r.member}", cfg.think_s) for r in spec.requests()]


WORKLOADS: dict[str, Callable[[WorkloadConfig], list[SimRequest]]] = {
    "gsp": generated_shared_prefix,
    "paper": paper,
    "leval": long_documents,
    "rag": rag,
    "chat": multi_turn_chat,
    "none": no_sharing,
}


def make_workload(name: str, cfg: WorkloadConfig) -> list[SimRequest]:
    gen = WORKLOADS.get(name)
    if gen is None:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    return gen(cfg)
