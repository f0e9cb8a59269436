"""The grouped decode's Triton span kernel on CPU: Triton's interpreter against the torch reference, and the
compiled path built ahead of time for sm_90."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
"""The Triton interpreter runs each program in numpy, and the AOT compile takes seconds: `make test` only."""

REPO = Path(__file__).resolve().parents[2]

KERNEL_SCRIPT = """
import json, math
import torch
from sglang_feather.sglang.grouped_attention.kernel import attend_with_lse_unfused
from sglang_feather.sglang.grouped_attention.triton_spans import span_attention

gen = torch.Generator().manual_seed(0)
def randint(low, high):
    return int(torch.randint(low, high + 1, (), generator=gen))

def bucket(spans, kv_heads, rows, tokens, dim, lengths, *, index_dtype=torch.int64, strided=False, **blocks):
    '''A bucket over shuffled pool slots; pads point at poison slots (NaN K/V) that must never be read.'''
    real = sum(lengths)
    k_buffer = torch.randn(real + 3, kv_heads, dim, generator=gen)
    v_buffer = torch.randn(real + 3, kv_heads, dim, generator=gen)
    k_buffer[real:] = float("nan")
    v_buffer[real:] = float("nan")
    order = torch.randperm(real, generator=gen)
    kv_index = torch.full((spans, tokens), real + 1, dtype=torch.int64)
    start = 0
    for s, length in enumerate(lengths):
        kv_index[s, :length] = order[start : start + length]
        start += length
    if strided:  # one KV head's rows not adjacent in memory: [S, M, Hkv, D] seen as [S, Hkv, M, D]
        queries = torch.randn(spans, rows, kv_heads, dim, generator=gen).transpose(1, 2)
    else:
        queries = torch.randn(spans, kv_heads, rows, dim, generator=gen)
    scaling = 1.0 / math.sqrt(dim)
    length_tensor = torch.tensor(lengths, dtype=torch.int32 if index_dtype == torch.int32 else torch.int64)
    out, lse = span_attention(
        queries, k_buffer, v_buffer, kv_index.to(index_dtype), length_tensor, scaling, **blocks
    )
    return compared(queries, k_buffer, v_buffer, kv_index, lengths, scaling, out, lse)

def compared(queries, k_buffer, v_buffer, slots, lengths, scaling, out, lse):
    '''The kernel's (out, lse) against the torch reference on K/V gathered at `slots` [S, T] (pads masked).'''
    spans, kv_heads, rows, dim = queries.shape
    tokens = slots.shape[1]
    pad = torch.arange(tokens)[None, :] >= torch.tensor(lengths)[:, None]
    gather = slots.masked_fill(pad, 0)
    keys = k_buffer.nan_to_num()[gather].transpose(1, 2)  # a poisoned pad is masked, never a NaN product
    values = v_buffer.nan_to_num()[gather].transpose(1, 2)
    mask = torch.zeros(spans, 1, 1, tokens).masked_fill(pad[:, None, None, :], float("-inf"))
    ref_out, ref_lse = attend_with_lse_unfused(queries, keys, values, mask, scaling)
    live = torch.tensor(lengths) > 0
    return {
        "shape": [spans, kv_heads, rows, tokens, dim],
        "lengths": lengths,
        "out_dtype": str(out.dtype),
        "out_shape": list(out.shape),
        "lse_shape": list(lse.shape),
        "err_out": float((out[live] - ref_out[live]).abs().max()),
        "err_lse": float((lse[live] - ref_lse[live]).abs().max()),
        "empty_out": float(out[~live].abs().max()) if (~live).any() else 0.0,
        "empty_lse": [float(x) for x in lse[~live].flatten()[:1]],
    }

def paged(spans, kv_heads, rows, page_size, dim, lengths):
    '''A bucket of whole pages (SGLang's paged pool): each span's pages shuffled in the pool; every slot past a
    span's length in its last page, and the pad page, poisoned (NaN K/V) so reading one shows.'''
    num_pages = [-(-length // page_size) for length in lengths]
    total = sum(num_pages) + 1  # + the pad page
    k_buffer = torch.randn(total * page_size, kv_heads, dim, generator=gen)
    v_buffer = torch.randn(total * page_size, kv_heads, dim, generator=gen)
    order = torch.randperm(total - 1, generator=gen)
    pad_page = total - 1
    kv_pages = torch.full((spans, max(num_pages)), pad_page, dtype=torch.int64)
    start = 0
    for s, (length, count) in enumerate(zip(lengths, num_pages)):
        kv_pages[s, :count] = order[start : start + count]
        start += count
    slots = (kv_pages[:, :, None] * page_size + torch.arange(page_size)).view(spans, -1)
    tokens = slots.shape[1]
    pad = torch.arange(tokens)[None, :] >= torch.tensor(lengths)[:, None]
    for buffer in (k_buffer, v_buffer):
        buffer[slots[pad]] = float("nan")
    queries = torch.randn(spans, kv_heads, rows, dim, generator=gen)
    scaling = 1.0 / math.sqrt(dim)
    out, lse = span_attention(
        queries, k_buffer, v_buffer, kv_pages, torch.tensor(lengths), scaling, page_size=page_size
    )
    return compared(queries, k_buffer, v_buffer, slots, lengths, scaling, out, lse)

results = []
for case in range(7):
    spans, kv_heads, rows = randint(1, 5), randint(1, 2), randint(1, 9)
    tokens, dim = randint(2, 70), (16, 32)[case % 2]
    lengths = [randint(1, tokens - 1) for _ in range(spans)]
    if case % 3 == 0:
        lengths[randint(0, spans - 1)] = tokens  # the bucket's longest span fills it, as DecodePlan builds
    index_dtype = torch.int32 if case == 4 else torch.int64
    results.append(bucket(spans, kv_heads, rows, tokens, dim, lengths, index_dtype=index_dtype,
                          strided=case % 2 == 1))
results.append(bucket(1, 1, 1, 1, 16, [1]))  # one key, one row
results.append(bucket(2, 2, 37, 70, 32, [70, 33], block_m=16, block_n=16))  # 3 row blocks, 5 key tiles
results.append(paged(3, 2, 5, 16, 32, [40, 16, 7]))  # whole, partial and one-page spans of 16-slot pages
results.append(paged(2, 1, 3, 4, 16, [13, 4]))
results.append(bucket(3, 2, 5, 20, 16, [20, 0, 7]))  # an empty span: output 0, lse -inf
print(json.dumps(results))
"""


def _run_interpreted(script: str, timeout: int = 240) -> str:
    """`script` in a fresh process: TRITON_INTERPRET must be set before Triton compiles anything."""
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_span_kernel_matches_the_torch_reference_in_the_triton_interpreter():
    """Random buckets (padding, shuffled slots, NaN poison behind every pad, strided queries, int32 indices,
    rows and keys not multiples of the blocks; pages of 16 and 4 slots with the slots past a span's end poisoned) against `attend_with_lse_unfused` on gathered K/V, float32:
    the interpreter's bf16 dot is not faithful; the GPU bench checks bf16 before it times."""
    results = json.loads(_run_interpreted(KERNEL_SCRIPT).strip().splitlines()[-1])
    assert len(results) == 12
    for result in results:
        spans, kv_heads, rows, _, dim = result["shape"]
        assert result["out_dtype"] == "torch.float32"
        assert result["out_shape"] == [spans, kv_heads, rows, dim]
        assert result["lse_shape"] == [spans, kv_heads, rows]
        assert result["err_out"] < 1e-4 and result["err_lse"] < 1e-4, result
    assert any(max(r["lengths"]) < r["shape"][3] for r in results), (
        "some bucket must be all padding at its end"
    )
    empty = results[-1]
    assert empty["empty_out"] == 0.0 and empty["empty_lse"] == [float("-inf")]


def test_bench_smoke_runs_the_timing_path_in_the_interpreter(tmp_path):
    out = tmp_path / "spans.json"
    env = os.environ | {"PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "kernels_bench.grouped_spans", "--interpret-smoke", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["meta"]["mode"] == "interpret-smoke"
    assert {row["case"] for row in document["rows"]} == {"group_T40", "group_T9", "tails_5-20"}
    assert all(row["ok"] for row in document["checks"]), document["checks"]
    assert "triton_spans" in result.stdout


def test_bench_refuses_a_cpu_without_the_smoke_flag():
    from kernels_bench import grouped_spans

    if grouped_spans.torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert grouped_spans.main(["--device", "cuda"]) == 3
    assert grouped_spans.main(["--device", "cpu"]) == 3


def test_span_kernel_compiles_to_a_hopper_cubin_without_a_gpu():
    """The compiled path (tl.dot tile rules, layouts, shared memory) for Llama-3-8B heads in bf16 as the bench
    launches it: 256 rows of one span in blocks of 64, and 4 rows per tail in a block of 16. Specialised as
    the JIT specialises a launch on contiguous, 16-byte aligned tensors (unit strides constant, the others
    and the pointers divisible by 16), where the K/V row gathers become pipelined 16-byte copies."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sglang_feather.sglang.grouped_attention.triton_spans import _span_kernel

    names = _span_kernel.arg_names
    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "KvPages": "*i64", "Lengths": "*i32"}
    pointers |= {"Out": "*bf16", "Lse": "*fp32"}
    unit = ("stride_qd", "stride_kd", "stride_vd", "stride_pp", "stride_od", "stride_lm")
    strides = [name for name in names if name.startswith("stride_") and name not in unit]
    signature = pointers | {"qk_scale": "fp32", "num_rows": "i32", "max_tokens": "i32"}
    signature |= dict.fromkeys(strides, "i32")
    aligned = {(names.index(name),): [["tt.divisibility", 16]] for name in [*pointers, *strides]}
    for block_m, page_size in ((64, 1), (16, 16)):
        constexprs = dict.fromkeys(unit, 1) | {"NUM_KV_HEADS": 8, "HEAD_DIM": 128, "HEAD_DIM_V": 128}
        constexprs |= {
            "BLOCK_M": block_m,
            "BLOCK_N": 64,
            "BLOCK_D": 128,
            "BLOCK_DV": 128,
            "PAGE_SIZE": page_size,
        }
        source = ASTSource(
            fn=_span_kernel,
            signature={name: signature.get(name, "constexpr") for name in names},
            constexprs={(names.index(name),): value for name, value in constexprs.items()},
            attrs=aligned,
        )
        kernel = triton.compile(
            source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2}
        )
        assert "cubin" in kernel.asm
        assert 0 < kernel.metadata.shared <= 227 * 1024
        ptx = kernel.asm["ptx"]
        assert "cp.async.cg.shared.global" in ptx and "ld.global.b16" not in ptx, "K/V loads not vectorised"
