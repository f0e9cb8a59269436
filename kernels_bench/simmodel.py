"""Adapter to the simulator's decode cost model: the DRAM and L2 bytes it predicts for one measured layer.

How it works: the fit must calibrate the constants the simulator actually uses, in the simulator's own
model, so this module feeds a benchmark workload to `sglang_feather.sim.cost.PhysicsCostModel.shared_split`
instead of re-implementing it. Each request's shared prefix pages become one node keyed by its group (a group
of one request holds only private tokens, as the simulator's decomposition would say). The simulator assumes
one thread block per (request, KV head); a split-K kernel runs `num_splits` blocks per request, so its window
of concurrently resident requests is `num_splits` times smaller, which is modelled by dividing `ctas_per_sm`.
Private tokens and the query/output rows come from DRAM; everything else the kernel reads is L2's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kernels_bench.workload import HeadShape, PagedWorkload
from sglang_feather.sim.cost import PhysicsCostModel
from sglang_feather.sim.profile import Profile

CTAS_KEY = "gpu.decode_attention.ctas_per_sm"
L2_FRACTION_KEY = "gpu.decode_attention.l2_effective_fraction"
REUSE_KEY = "gpu.decode_attention.reuse_window_tokens"


@dataclass(frozen=True)
class CacheParams:
    """The simulator's L2-reuse constants that the fit searches over."""

    ctas_per_sm: float
    l2_effective_fraction: float
    reuse_window_tokens: float | None


@dataclass(frozen=True)
class Traffic:
    dram_bytes: float
    l2_bytes: float


def head_shape(profile: Profile) -> HeadShape:
    arch = "model.architecture."
    return HeadShape(
        num_q_heads=int(profile.value(arch + "num_heads")),
        num_kv_heads=int(profile.value(arch + "num_kv_heads")),
        head_dim=int(profile.value(arch + "head_dim")),
        dtype_bytes=int(profile.value(arch + "dtype_bytes")),
    )


def _constant(value: float, like: dict | None, unit: str) -> dict:
    return {
        "value": value,
        "unit": like["unit"] if like else unit,
        "source": "estimate",
        "ref": "kernels_bench.fit search candidate",
    }


def with_params(profile: Profile, params: CacheParams, num_splits: int = 1) -> Profile:
    """`profile` with the candidate constants; `num_splits` shrinks the window as a split-K grid does."""
    constants = dict(profile.constants)
    constants[CTAS_KEY] = _constant(params.ctas_per_sm / num_splits, constants.get(CTAS_KEY), "count")
    constants[L2_FRACTION_KEY] = _constant(
        params.l2_effective_fraction, constants.get(L2_FRACTION_KEY), "fraction"
    )
    if params.reuse_window_tokens is None:
        constants.pop(REUSE_KEY, None)
    else:
        constants[REUSE_KEY] = _constant(params.reuse_window_tokens, constants.get(REUSE_KEY), "tokens")
    return Profile(profile.gpu, profile.model, constants, profile.overrides)


def layer_traffic(profile: Profile, workload: PagedWorkload) -> Traffic:
    """Bytes of one decode-attention call for one layer, split into DRAM and L2 by the simulator's model."""
    shape = head_shape(profile)
    spec = workload.spec
    counts = workload.byte_counts(shape)
    shared_tokens = spec.num_shared_pages * spec.page_size
    members = Counter(workload.group_ids.tolist())
    batch = [
        [(("group", group), shared_tokens)] if shared_tokens and members[group] > 1 else []
        for group in workload.group_ids.tolist()
    ]
    split = PhysicsCostModel(profile).shared_split(batch)
    private_tokens = int(workload.seq_lens.sum()) - split.dram_tokens - split.l2_tokens
    per_token = shape.kv_bytes_per_token
    dram = (split.dram_tokens + private_tokens) * per_token + counts.io
    return Traffic(dram_bytes=float(dram), l2_bytes=float(split.l2_tokens * per_token))
