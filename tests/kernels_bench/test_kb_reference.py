"""Reference decode attention (SDPA over gathered K/V), the split-K algorithm and the Triton kernel, on CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from kernels_bench.aot_check import compile_kernels
from kernels_bench.paged import make_inputs
from kernels_bench.reference import sdpa_decode, select_rows
from kernels_bench.splitk import plan_splits, splitk_decode
from kernels_bench.workload import HeadShape, WorkloadSpec, build_workload

REPO = Path(__file__).resolve().parents[2]
SMALL = HeadShape(num_q_heads=8, num_kv_heads=2, head_dim=16)


def naive_decode(inputs) -> torch.Tensor:
    """Token-by-token softmax attention per request and query head, in float64, through the page table."""
    batch, num_q_heads, head_dim = inputs.q.shape
    num_kv_heads = inputs.k_cache.shape[2]
    page_size = inputs.page_size
    out = torch.zeros(batch, num_q_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(num_q_heads):
            kv_head = h // (num_q_heads // num_kv_heads)
            q = inputs.q[b, h].double()
            scores, values = [], []
            for t in range(int(inputs.seq_lens[b])):
                page = int(inputs.page_table[b, t // page_size])
                k = inputs.k_cache[page, t % page_size, kv_head].double()
                scores.append(float(q @ k) * inputs.scale)
                values.append(inputs.v_cache[page, t % page_size, kv_head].double())
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for w, v in zip(weights, values, strict=True):
                out[b, h] += (w / total) * v
    return out


def inputs_for(spec: WorkloadSpec, seed: int = 0, *, uneven: bool = False):
    inputs = make_inputs(
        build_workload(spec),
        device="cpu",
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(seed),
        shape=SMALL,
    )
    if uneven:
        shorter = inputs.seq_lens - torch.arange(spec.batch_size, dtype=torch.int32) * 7
        inputs = replace(inputs, seq_lens=shorter.clamp_min(1).to(torch.int32))
    return inputs


CASES = [
    WorkloadSpec(batch_size=3, num_groups=2, prefix_len=13, suffix_len=4, page_size=4, order="interleaved"),
    WorkloadSpec(batch_size=4, num_groups=4, prefix_len=9, suffix_len=3, page_size=1),
    WorkloadSpec(batch_size=5, num_groups=2, prefix_len=32, suffix_len=7, page_size=16, order="random"),
]


@pytest.mark.parametrize(
    "spec", CASES, ids=lambda s: f"B{s.batch_size}G{s.num_groups}p{s.page_size}{s.order}"
)
@pytest.mark.parametrize("uneven", [False, True])
def test_sdpa_over_gathered_kv_matches_the_naive_loop(spec, uneven):
    inputs = inputs_for(spec, uneven=uneven)
    torch.testing.assert_close(sdpa_decode(inputs), naive_decode(inputs), rtol=1e-10, atol=1e-12)


def test_float32_reference_of_selected_rows_matches_the_full_batch():
    inputs = inputs_for(CASES[2], seed=3).to(torch.bfloat16)
    rows = torch.tensor([0, 3, 4])
    full = sdpa_decode(inputs, compute_dtype=torch.float32)
    torch.testing.assert_close(
        sdpa_decode(select_rows(inputs, rows), compute_dtype=torch.float32), full[rows]
    )


@pytest.mark.parametrize("num_sms,block_n", [(1, 4), (8, 4), (64, 8)])
def test_split_k_partials_merge_to_the_reference_even_with_empty_splits(num_sms, block_n):
    inputs = inputs_for(CASES[2], seed=1, uneven=True)
    plan = plan_splits(5, int(inputs.seq_lens.max()), 2, num_sms, block_n=block_n, min_split_tokens=4)
    assert plan.split_len % block_n == 0 and plan.num_splits * plan.split_len >= int(inputs.seq_lens.max())
    torch.testing.assert_close(splitk_decode(inputs, plan), sdpa_decode(inputs), rtol=1e-10, atol=1e-12)


def test_split_plan_fills_the_gpu_for_small_batches_and_stops_splitting_large_ones():
    small = plan_splits(1, 10020, 8, 132)
    large = plan_splits(512, 10020, 8, 132)
    assert small.num_splits > 1 and small.num_splits * 8 >= 132
    assert large.num_splits == 1 and large.split_len >= 10020
    assert plan_splits(1, 100, 8, 132).num_splits == 1


TRITON_SCRIPT = """
import json
from dataclasses import replace
import torch
from kernels_bench.aot_check import compile_kernels
from kernels_bench.paged import make_inputs
from kernels_bench.reference import sdpa_decode
from kernels_bench.splitk import plan_splits
from kernels_bench.triton_decode import TritonDecode
from kernels_bench.workload import HeadShape, WorkloadSpec, build_workload

shape = HeadShape(num_q_heads=8, num_kv_heads=2, head_dim=16)
results = []
for case in json.loads(CASES):
    spec = WorkloadSpec(**case["spec"])
    gen = torch.Generator().manual_seed(0)
    inputs = make_inputs(build_workload(spec), device="cpu", dtype=torch.float32, generator=gen, shape=shape)
    inputs = replace(inputs, seq_lens=inputs.seq_lens - torch.tensor(case["shorten"], dtype=torch.int32))
    max_len = int(inputs.seq_lens.max())
    plan = plan_splits(spec.batch_size, max_len, 2, case["num_sms"], block_n=16, min_split_tokens=16)
    out = TritonDecode(inputs, plan)()
    ref = sdpa_decode(inputs, compute_dtype=torch.float64)
    empty = int(((plan.num_splits * plan.split_len - inputs.seq_lens) // plan.split_len).max())
    results.append({"splits": plan.num_splits, "empty": empty, "err": float((out.double() - ref).abs().max())})
print(json.dumps(results))
"""
TRITON_CASES = [
    {"spec": asdict(CASES[0]) | {"prefix_len": 37, "suffix_len": 5}, "num_sms": 8, "shorten": [0, 0, 0]},
    {"spec": asdict(WorkloadSpec(2, 1, 40, 9, page_size=1)), "num_sms": 8, "shorten": [0, 20]},
    {"spec": asdict(WorkloadSpec(4, 4, 16, 3, page_size=16)), "num_sms": 1, "shorten": [0, 0, 0, 0]},
]


@pytest.mark.slow
def test_triton_kernel_matches_the_reference_in_the_triton_interpreter():
    """The real Triton kernel source, run on CPU by Triton's interpreter, in a fresh process because
    TRITON_INTERPRET must be set before Triton is first imported. float32 only: the interpreter's bf16 dot
    is not faithful; the GPU run checks bf16 against a float32 reference before timing."""
    script = f"CASES = {json.dumps(json.dumps(TRITON_CASES))}\n" + TRITON_SCRIPT
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["splits"] > 1 for r in results] == [True, True, False]
    assert results[1]["empty"] >= 1, "the uneven case must leave a split empty"
    assert max(r["err"] for r in results) < 1e-5, results


def test_triton_kernels_compile_to_a_hopper_cubin_without_a_gpu():
    """Ahead-of-time compilation for sm_90 (H100/H200): catches compiled-path errors the interpreter cannot."""
    compiled = compile_kernels(90)
    assert [c.kernel for c in compiled] == ["_split_kernel", "_merge_kernel"]
    assert all(c.has_cubin and c.arch == 90 for c in compiled)
    assert 0 < compiled[0].shared_bytes <= 227 * 1024
