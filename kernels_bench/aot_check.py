"""Compile the Triton decode kernels ahead of time for a GPU architecture, on a machine without a GPU.

How it works: Triton's compiler runs without a device when given an explicit target, down to PTX and, with
the `ptxas` that ships in the Triton wheel, a cubin. This catches what the CPU interpreter cannot: type and
layout errors of the compiled path, `tl.dot` shape rules, shared-memory use. The signatures mirror the launch
in `triton_decode.TritonDecode` (pointers typed by the K/V dtype, int32 sizes and strides, fp32 scale).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from kernels_bench.workload import LLAMA3_8B, HeadShape

SPLIT_INTS = (
    "split_len",
    "num_splits",
    "stride_qb",
    "stride_qh",
    "stride_kslot",
    "stride_kh",
    "stride_pt",
    "stride_ob",
    "stride_oh",
    "stride_os",
    "stride_lb",
    "stride_lh",
)
MERGE_INTS = (
    "num_splits",
    "stride_ob",
    "stride_oh",
    "stride_os",
    "stride_lb",
    "stride_lh",
    "stride_fb",
    "stride_fh",
)
TRITON_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class Compiled:
    kernel: str
    arch: int
    shared_bytes: int
    has_cubin: bool


def _compile(fn, signature: dict, constexprs: dict, arch: int, num_warps: int, num_stages: int) -> Compiled:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature = signature | {name: "constexpr" for name in constexprs}
    source = ASTSource(
        fn=fn,
        signature={name: signature[name] for name in names},
        constexprs={(names.index(name),): value for name, value in constexprs.items()},
    )
    kernel = triton.compile(
        source,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": True},
    )
    return Compiled(fn.__name__, arch, int(kernel.metadata.shared), "cubin" in kernel.asm)


def compile_kernels(
    arch: int,
    *,
    dtype: str = "bfloat16",
    page_size: int = 16,
    block_n: int = 64,
    shape: HeadShape = LLAMA3_8B,
) -> list[Compiled]:
    """Both kernels as `TritonDecode` launches them, for `sm_<arch>`."""
    from kernels_bench.triton_decode import _merge_kernel, _split_kernel

    element = "*" + TRITON_DTYPES[dtype]
    split_signature = {
        "Q": element,
        "K": element,
        "V": element,
        "PageTable": "*i32",
        "SeqLens": "*i32",
        "PartOut": "*fp32",
        "PartLse": "*fp32",
        "scale": "fp32",
    } | dict.fromkeys(SPLIT_INTS, "i32")
    split_constexprs = {
        "NUM_KV_HEADS": shape.num_kv_heads,
        "GROUP": shape.group_size,
        "BLOCK_H": max(16, 1 << (shape.group_size - 1).bit_length()),
        "HEAD_DIM": shape.head_dim,
        "PAGE_SIZE": page_size,
        "BLOCK_N": block_n,
    }
    merge_signature = {"PartOut": "*fp32", "PartLse": "*fp32", "Out": element} | dict.fromkeys(
        MERGE_INTS, "i32"
    )
    return [
        _compile(_split_kernel, split_signature, split_constexprs, arch, num_warps=4, num_stages=2),
        _compile(_merge_kernel, merge_signature, {"HEAD_DIM": shape.head_dim, "BLOCK_S": 16}, arch, 4, 1),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernels_bench.aot_check",
        description="Compile the Triton decode kernels for GPU architectures without a GPU (sm_80 A100, "
        "sm_89 RTX 6000 Ada, sm_90 H100/H200).",
    )
    parser.add_argument("--archs", default="80,89,90", help="compute capabilities, comma separated")
    parser.add_argument("--dtype", choices=sorted(TRITON_DTYPES), default="bfloat16")
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args(argv)
    for arch in (int(a) for a in args.archs.split(",")):
        for compiled in compile_kernels(arch, dtype=args.dtype, page_size=args.page_size):
            print(
                f"sm_{compiled.arch} {compiled.kernel}: shared memory {compiled.shared_bytes} B, "
                f"cubin {'yes' if compiled.has_cubin else 'no'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
