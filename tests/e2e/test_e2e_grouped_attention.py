"""Live: `--attention-backend feather_grouped` gives torch_native's greedy outputs on 200 requests of nested
prefix groups (float32, the CPU profile with its overlap scheduler, chunked prefill and 16-token pages)."""

from __future__ import annotations

import random

import pytest
from conftest import serving
from e2e_client import FLOAT32, generate_all, greedy_payload, post_json

from sglang_feather.serving.completions import FIRST_TOKEN_ID, TINY_VOCAB_SIZE
from sglang_feather.serving.metrics import scrape

GROUPED = ("--attention-backend", "feather_grouped")
NUM_NEW_TOKENS = 12
NEAR_TIE = 1e-4
"""A differing greedy token counts as a mismatch only where the reference's top-2 log-probabilities are
further apart than this: closer, the sums' order alone (batch shape, kernel) may pick either."""
SEGMENTS = "sglang:feather_decode_shared_segments_sum"


def nested_prompts(seed: int) -> list[list[int]]:
    """200 prompts: 2 system prompts x 4 documents x 25 questions of 4-40 tokens, shuffled."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(FIRST_TOKEN_ID, TINY_VOCAB_SIZE) for _ in range(n)]

    prompts = [
        system + document + tokens(rng.randint(4, 40))
        for system in (tokens(120), tokens(70))
        for document in (tokens(100), tokens(33), tokens(150), tokens(64))
        for _ in range(25)
    ]
    rng.shuffle(prompts)
    return prompts


@pytest.fixture(scope="module")
def native_and_grouped(tmp_path_factory, tiny_model):
    servers = [("fcfs", FLOAT32), ("fcfs", (*FLOAT32, *GROUPED))]
    with serving(tmp_path_factory.mktemp("grouped-attention"), tiny_model, servers) as started:
        yield started


def _run(server, prompts) -> list[dict]:
    post_json(server.base_url, "/flush_cache", {})
    payloads = [greedy_payload(p, NUM_NEW_TOKENS, return_logprob=True, top_logprobs_num=2) for p in prompts]
    return generate_all(server.base_url, payloads)


def _mismatches(reference: list[dict], other: list[dict]) -> tuple[list[int], int]:
    """Requests whose outputs differ where the reference's choice was clear, and how many differ at a near-tie."""
    clear, ties = [], 0
    for i, (a, b) in enumerate(zip(reference, other, strict=True)):
        ids_a, ids_b = a["output_ids"], b["output_ids"]
        if ids_a == ids_b:
            continue
        first = next(k for k, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y)
        (top, _, _), (second, _, _) = a["meta_info"]["output_top_logprobs"][first][:2]
        if top - second > NEAR_TIE:
            clear.append(i)
        else:
            ties += 1
    return clear, ties


def test_grouped_greedy_outputs_equal_torch_natives(native_and_grouped):
    native, grouped = native_and_grouped
    prompts = nested_prompts(seed=11)
    reference = _run(native, prompts)
    again = _run(native, prompts)
    got = _run(grouped, prompts)

    assert all(len(r["output_ids"]) == NUM_NEW_TOKENS for r in reference + got)
    assert len({tuple(r["output_ids"]) for r in reference}) > len(prompts) // 2, (
        "outputs barely depend on the prompt"
    )
    self_clear, self_ties = _mismatches(reference, again)
    assert not self_clear, f"torch_native against itself: {len(self_clear)} clear mismatches"
    clear, ties = _mismatches(reference, got)
    assert not clear, f"{len(clear)} of {len(prompts)} outputs differ where torch_native's choice was clear"
    assert ties <= max(2, 2 * self_ties), f"{ties} near-tie flips against torch_native's own {self_ties}"
    # The decode path really grouped: shared prefix segments were read once per step.
    assert scrape(grouped.base_url).total(SEGMENTS) > 0
    assert "attention backend feather_grouped" in grouped.log_path.read_text()
