"""KV-limited workloads for vLLM's model-free harness: the simulator's generators on pools of a few prefixes."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sglang_feather.offline.vllm_inputs import STEP_S, TINY_VOCAB, EngineShape, ReplayRequest
from sglang_feather.sim.trace import SimRequest, TokenSource
from sglang_feather.sim.workloads import WorkloadConfig, make_workload
from sglang_feather.workload import Segment, SharedPrefixSpec


@dataclass(frozen=True)
class KvLimitedWorkload:
    """A simulator workload (`sglang_feather.sim.workloads.WORKLOADS`) and the engine it runs on, whose KV pool
    holds only a few of its shared prefixes."""

    description: str
    generator: str
    """Name of the simulator's workload generator."""
    config: WorkloadConfig
    engine: EngineShape

    def requests(self, seed: int) -> list[SimRequest]:
        return make_workload(self.generator, self.config.with_spec(seed=seed))

    def replay(self, seed: int) -> list[ReplayRequest]:
        """The requests with their tokens, a chat turn's answer as what the fake model samples, times in steps."""
        tokens = TokenSource(vocab_size=TINY_VOCAB)
        return [
            ReplayRequest(
                r.rid,
                tokens.prompt(r).tolist(),
                None
                if r.output_key is None
                else tokens.segment(Segment(r.output_key, r.output_len)).tolist(),
                r.output_len,
                steps(r.arrival_s),
                r.follows,
                steps(r.delay_s),
            )
            for r in self.requests(seed)
        ]


def steps(seconds: float) -> int:
    """The harness step at or after `seconds`."""
    return math.ceil(seconds / STEP_S - 1e-9)


_ENGINE = EngineShape(
    block_size=16, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=2048
)

WORKLOADS: dict[str, KvLimitedWorkload] = {
    "rag": KvLimitedWorkload(
        "RAG: 200 requests, each one of 24 documents (384-1024 tokens, Zipf 1.0 popularity) + a 32-token "
        "question, 32 output tokens, Poisson 8 req/s; 256-block (4096-token) pool",
        "rag",
        WorkloadConfig(
            spec=SharedPrefixSpec(num_requests=200, question_len=32, output_len=32, rate=8.0),
            num_docs=24,
            doc_len_range=(384, 1024),
        ),
        _ENGINE,
    ),
    "groups": KvLimitedWorkload(
        "shared-prefix groups: 200 requests in 12 groups (640-token prefix, uniform sizes, random order) + a "
        "48-token question, 32 output tokens, Poisson 8 req/s; 256-block (4096-token) pool",
        "gsp",
        WorkloadConfig(
            spec=SharedPrefixSpec(
                num_groups=12, num_requests=200, prefix_len=640, question_len=48, output_len=32, rate=8.0
            )
        ),
        _ENGINE,
    ),
    "chat": KvLimitedWorkload(
        "multi-turn chat: 40 conversations x 4 turns under one 256-token system prompt, 96-token questions, "
        "48-token answers, 0.5 s think time, conversations Poisson 1/s; 192-block (3072-token) pool",
        "chat",
        WorkloadConfig(
            spec=SharedPrefixSpec(
                num_requests=40, num_turns=4, prefix_len=256, question_len=96, output_len=48, rate=1.0
            ),
            think_s=0.5,
        ),
        replace(_ENGINE, num_blocks=192),
    ),
}
"""Name -> a KV-limited workload: RAG-like Zipf documents, shared-prefix groups, multi-turn chat."""
