"""The grouped decode's Triton span kernel against gather + SDPA per request, one layer, Llama-3-8B heads.

How it works: each case is one bucket of `grouped_attention.kernel` built on a shuffled KV pool. `group_T*`
is one shared span of T tokens read by 64 decode queries (4 query heads per KV head: 256 rows per KV head);
`tails_*` is 64 private tails of 64-512 tokens, one query each (4 rows), padded to the longest. Every way
does the same attention, over exactly each request's tokens:
- `triton_spans`: `span_attention` reads K/V through the slot indices, each span once for all its rows;
- `torch_grouped`: today's CUDA path of the grouped decode, one gather of the bucket then three products
  (`attend_with_lse_unfused`);
- `sdpa_per_request`: per request, a gather of its tokens and SDPA with its 4 query heads per KV head as
  rows, in a Python loop (the per-request path, launch costs included);
- `sdpa_batched`: one gather of every request's tokens (padded) and one SDPA call with a padding mask.
Each way is first checked against float32 attention on the same data, then timed with CUDA events after
an L2 flush (`timing.py`; median). `GB/s` divides the K/V bytes of the bucket's real tokens (read once) by
the time. `--interpret-smoke` runs tiny float32 cases through Triton's interpreter on the CPU (a test).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels_bench.timing import TIMERS, TimingConfig
from sglang_feather.sglang.grouped_attention.kernel import attend_with_lse_unfused

NO_DEVICE = 3
"""Exit status when no CUDA device is visible and `--interpret-smoke` is not given."""

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}
"""Largest absolute output error against float32 attention (outputs are averages of N(0, 1) values)."""


@dataclass(frozen=True)
class Heads:
    num_kv_heads: int
    group: int
    head_dim: int


LLAMA3_8B = Heads(num_kv_heads=8, group=4, head_dim=128)
SMOKE = Heads(num_kv_heads=2, group=2, head_dim=16)


@dataclass(frozen=True)
class CaseSpec:
    name: str
    span_lengths: tuple[int, ...]
    queries_per_span: int


def gpu_cases(num_requests: int = 64, seed: int = 0) -> list[CaseSpec]:
    gen = torch.Generator().manual_seed(seed)
    tails = tuple(int(x) for x in torch.randint(64, 513, (num_requests,), generator=gen))
    return [
        CaseSpec("group_T2048", (2048,), num_requests),
        CaseSpec("group_T8192", (8192,), num_requests),
        CaseSpec("tails_64-512", tails, 1),
    ]


SMOKE_CASES = [
    CaseSpec("group_T40", (40,), 3),
    CaseSpec("group_T9", (9,), 2),
    CaseSpec("tails_5-20", (5, 20, 13), 1),
]


@dataclass
class Bucket:
    """One bucket on a shuffled pool, plus each request's own slots for the per-request ways."""

    queries: torch.Tensor  # [S, Hkv, N * group, D]
    k_buffer: torch.Tensor  # [num_slots, Hkv, D]
    v_buffer: torch.Tensor
    kv_index: torch.Tensor  # [S, T] int64, pads at slot 0
    lengths: torch.Tensor  # [S] int32
    mask: torch.Tensor | None  # [S, 1, 1, T] additive, None when no pads
    request_slots: list[torch.Tensor]  # per request, its span's slots
    request_span: list[int]  # per request, its span
    request_row: list[int]  # per request, its query's index n within the span
    scaling: float


def build_bucket(spec: CaseSpec, heads: Heads, dtype: torch.dtype, device: str, seed: int) -> Bucket:
    gen = torch.Generator().manual_seed(seed)
    lengths = list(spec.span_lengths)
    num_spans, max_tokens, total = len(lengths), max(lengths), sum(lengths)
    hkv, group, dim = heads.num_kv_heads, heads.group, heads.head_dim
    num_slots = total + 1  # slot 0 is a dummy, as in SGLang's pools
    k_buffer = torch.randn(num_slots, hkv, dim, generator=gen).to(device, dtype)
    v_buffer = torch.randn(num_slots, hkv, dim, generator=gen).to(device, dtype)
    order = torch.randperm(total, generator=gen) + 1
    kv_index = torch.zeros(num_spans, max_tokens, dtype=torch.int64)
    starts = [sum(lengths[:s]) for s in range(num_spans)]
    for s, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        kv_index[s, :length] = order[start : start + length]
    pad = torch.arange(max_tokens)[None, :] >= torch.tensor(lengths)[:, None]
    mask = None
    if pad.any():
        mask = torch.zeros(num_spans, 1, 1, max_tokens).masked_fill(pad[:, None, None, :], float("-inf"))
        mask = mask.to(device, dtype)
    rows = spec.queries_per_span * group
    queries = torch.randn(num_spans, hkv, rows, dim, generator=gen).to(device, dtype)
    kv_index = kv_index.to(device)
    request_slots, request_span, request_row = [], [], []
    for s, length in enumerate(lengths):
        for n in range(spec.queries_per_span):
            request_slots.append(kv_index[s, :length])
            request_span.append(s)
            request_row.append(n)
    return Bucket(
        queries=queries,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        kv_index=kv_index,
        lengths=torch.tensor(lengths, dtype=torch.int32, device=device),
        mask=mask,
        request_slots=request_slots,
        request_span=request_span,
        request_row=request_row,
        scaling=1.0 / math.sqrt(dim),
    )


def reference(bucket: Bucket) -> torch.Tensor:
    """float32 attention of the bucket (gather, then plain products): [S, Hkv, rows, Dv]."""
    keys = bucket.k_buffer[bucket.kv_index].float().transpose(1, 2)
    values = bucket.v_buffer[bucket.kv_index].float().transpose(1, 2)
    mask = None if bucket.mask is None else bucket.mask.float()
    return attend_with_lse_unfused(bucket.queries.float(), keys, values, mask, bucket.scaling)[0]


def ways(bucket: Bucket, group: int, block_ms: list[int | None]) -> dict[str, Callable[[], torch.Tensor]]:
    """Name -> a launcher that returns [S, Hkv, rows, Dv] (the per-request ways write into one buffer)."""
    from sglang_feather.sglang.grouped_attention.triton_spans import span_attention

    b = bucket
    found: dict[str, Callable[[], torch.Tensor]] = {}
    for block_m in block_ms:
        name = "triton_spans" if block_m is None else f"triton_spans[bm={block_m}]"
        found[name] = lambda block_m=block_m: span_attention(
            b.queries, b.k_buffer, b.v_buffer, b.kv_index, b.lengths, b.scaling, block_m=block_m
        )[0]

    def torch_grouped() -> torch.Tensor:
        flat = b.kv_index.view(-1)
        shape = (*b.kv_index.shape, b.k_buffer.shape[1], -1)
        keys = b.k_buffer.index_select(0, flat).view(shape).transpose(1, 2)
        values = b.v_buffer.index_select(0, flat).view(shape).transpose(1, 2)
        return attend_with_lse_unfused(b.queries, keys, values, b.mask, b.scaling)[0]

    out = torch.empty(
        *b.queries.shape[:3], b.v_buffer.shape[2], dtype=b.queries.dtype, device=b.queries.device
    )

    def sdpa_per_request() -> torch.Tensor:
        for slots, span, n in zip(b.request_slots, b.request_span, b.request_row, strict=True):
            keys = b.k_buffer.index_select(0, slots).transpose(0, 1)[None]  # [1, Hkv, L, D]
            values = b.v_buffer.index_select(0, slots).transpose(0, 1)[None]
            rows = slice(n * group, (n + 1) * group)
            q = b.queries[span, :, rows][None]  # [1, Hkv, group, D]: a KV head's query heads as rows
            out[span, :, rows] = F.scaled_dot_product_attention(q, keys, values, scale=b.scaling)[0]
        return out

    span_of = torch.tensor(b.request_span, device=b.queries.device)
    row_of = torch.tensor(b.request_row, device=b.queries.device)
    hkv, dim = b.queries.shape[1], b.queries.shape[3]

    def sdpa_batched() -> torch.Tensor:
        index = b.kv_index.index_select(0, span_of)  # [R, T]
        shape = (*index.shape, hkv, -1)
        keys = b.k_buffer.index_select(0, index.view(-1)).view(shape).transpose(1, 2)  # [R, Hkv, T, D]
        values = b.v_buffer.index_select(0, index.view(-1)).view(shape).transpose(1, 2)
        q = b.queries.view(b.queries.shape[0], hkv, -1, group, dim)[span_of, :, row_of]  # [R, Hkv, group, D]
        mask = None if b.mask is None else b.mask.index_select(0, span_of)
        result = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=b.scaling)
        view = out.view(out.shape[0], hkv, -1, group, out.shape[3])
        view[span_of, :, row_of] = result
        return out

    found |= {
        "torch_grouped": torch_grouped,
        "sdpa_per_request": sdpa_per_request,
        "sdpa_batched": sdpa_batched,
    }
    return found


def run_case(
    spec: CaseSpec, heads: Heads, dtype: torch.dtype, device: str, timing: TimingConfig, block_ms, seed: int
) -> tuple[list[dict], list[dict]]:
    bucket = build_bucket(spec, heads, dtype, device, seed)
    expected = reference(bucket)
    real_tokens = sum(spec.span_lengths)
    kv_bytes = 2 * real_tokens * heads.num_kv_heads * heads.head_dim * bucket.k_buffer.element_size()
    rows, checks = [], []
    for name, fn in ways(bucket, heads.group, block_ms).items():
        err = float((fn().float() - expected).abs().max())
        ok = err <= TOLERANCE[dtype]
        checks.append({"case": spec.name, "way": name, "max_abs_err": err, "ok": ok})
        if not ok:
            continue
        t = TIMERS[device]([fn], timing)
        rows.append(
            {
                "case": spec.name,
                "way": name,
                "spans": len(spec.span_lengths),
                "rows_per_span_head": bucket.queries.shape[2],
                "real_tokens": real_tokens,
                "padded_tokens": bucket.kv_index.numel(),
                "kv_bytes": kv_bytes,
                "median_ms": t.median_ms,
                "p10_ms": t.p10_ms,
                "p90_ms": t.p90_ms,
                "gb_per_s": kv_bytes / (t.median_ms * 1e6),
            }
        )
    return rows, checks


def format_table(rows: list[dict]) -> str:
    lines = [f"{'case':<14} {'way':<24} {'median ms':>10} {'p10':>8} {'p90':>8} {'GB/s':>8} {'/ triton':>9}"]
    for row in rows:
        base = next((r for r in rows if r["case"] == row["case"] and r["way"] == "triton_spans"), None)
        ratio = f"{row['median_ms'] / base['median_ms']:>8.2f}x" if base else f"{'-':>9}"
        lines.append(
            f"{row['case']:<14} {row['way']:<24} {row['median_ms']:>10.4f} {row['p10_ms']:>8.4f} "
            f"{row['p90_ms']:>8.4f} {row['gb_per_s']:>8.1f} {ratio}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kernels_bench.grouped_spans",
        description="Time the grouped decode's Triton span kernel against gather + SDPA per request "
        "(Llama-3-8B heads: 8 KV x 128, 4 query heads each). Needs a CUDA device; on a CPU only "
        "--interpret-smoke runs.",
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument(
        "--block-ms",
        default="auto,16",
        help="comma list of BLOCK_M for the Triton kernel ('auto' = its default choice); default auto,16",
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--flush-mb", type=int, default=256, help="L2 flush buffer before each repeat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--interpret-smoke",
        action="store_true",
        help="CPU: tiny float32 cases through Triton's interpreter (checks the script, times nothing real)",
    )
    parser.add_argument("--out", type=Path, help="JSON output (default results/grouped_spans.json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.interpret_smoke:
        module = "sglang_feather.sglang.grouped_attention.triton_spans"
        if module in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("error: the Triton kernel was compiled for a GPU before --interpret-smoke", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated, i.e. on first import
        device, dtype, heads, cases = "cpu", torch.float32, SMOKE, SMOKE_CASES
        timing = TimingConfig(warmup=0, repeats=1, flush_bytes=0)
    elif args.device != "cuda" or not torch.cuda.is_available():
        print(
            "error: grouped_spans times a Triton kernel and needs a CUDA device, which torch does not see; "
            "on a CPU run `python -m kernels_bench.grouped_spans --interpret-smoke` for a functional check",
            file=sys.stderr,
        )
        return NO_DEVICE
    else:
        device, dtype, heads, cases = "cuda", DTYPES[args.dtype], LLAMA3_8B, gpu_cases(seed=args.seed)
        timing = TimingConfig(warmup=args.warmup, repeats=args.repeats, flush_bytes=args.flush_mb << 20)
    block_ms = [None if b == "auto" else int(b) for b in args.block_ms.split(",")]
    if args.interpret_smoke:
        block_ms = [None]
    rows, checks = [], []
    for index, spec in enumerate(cases):
        case_rows, case_checks = run_case(spec, heads, dtype, device, timing, block_ms, args.seed + index)
        rows += case_rows
        checks += case_checks
        for check in case_checks:
            if not check["ok"]:
                print(f"FAILED {check['case']} {check['way']}: max abs err {check['max_abs_err']:.3g}")
    print(format_table(rows))
    meta = {
        "command": shlex.join(["python", "-m", "kernels_bench.grouped_spans", *(argv or sys.argv[1:])]),
        "mode": "interpret-smoke" if args.interpret_smoke else "gpu",
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "heads": asdict(heads),
        "timing": asdict(timing),
        "cases": [asdict(spec) for spec in cases],
    }
    out = args.out or Path("results") / "grouped_spans.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "checks": checks, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0 if all(check["ok"] for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
