"""Fit the simulator's decode-attention constants to kernel measurements and write a profile override.

How it works: for each candidate of the L2-reuse constants (`ctas_per_sm`, `l2_effective_fraction`,
`reuse_window_tokens`) on a small grid, the simulator's own model (`simmodel.py`) splits every measured
point's bytes into DRAM bytes and L2 bytes. Time is then linear in the unknowns,

    t = dram_bytes / BW_dram + l2_bytes / BW_l2 + overhead,

solved by non-negative least squares on relative residuals (each row divided by its measured time, so a
20 us point weighs as much as a 20 ms one). The candidate with the smallest relative RMS error wins. The
override file sets `hbm_efficiency = BW_dram / hbm_bandwidth`, `l2_bandwidth`, the three reuse constants and
the L2 size the device reported, each `source: measured` with GPU, driver, date and fit quality in `ref`.
The per-call overhead has no slot in the profile; it is reported in the fit summary.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from kernels_bench.simmodel import CacheParams, head_shape, layer_traffic, with_params
from kernels_bench.workload import WorkloadSpec, build_workload
from sglang_feather.sim.profile import Profile, ProfileError, load_profile

SPEC_FIELDS = ("batch_size", "num_groups", "prefix_len", "suffix_len", "page_size", "order", "seed")


class FitError(ValueError):
    """The measurements cannot be fitted (too few points, wrong model shape, nothing identifiable)."""


@dataclass(frozen=True)
class Point:
    spec: WorkloadSpec
    num_splits: int
    seconds: float


@dataclass(frozen=True)
class FitGrid:
    ctas_per_sm: tuple[float, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    l2_effective_fraction: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    reuse_window_tokens: tuple[float | None, ...] = (None, 256, 1024, 4096)

    def candidates(self) -> list[CacheParams]:
        return [
            CacheParams(c, f, r)
            for c, f, r in itertools.product(
                self.ctas_per_sm, self.l2_effective_fraction, self.reuse_window_tokens
            )
        ]


DEFAULT_GRID = FitGrid()


@dataclass(frozen=True)
class FitResult:
    params: CacheParams
    dram_bandwidth: float | None
    """Bytes/s; None when the DRAM term came out zero (not identifiable from these points)."""
    l2_bandwidth: float | None
    overhead_s: float
    rel_rmse: float
    num_points: int
    num_equivalent: int = 1
    """Candidates within 1% of the best error: more than 1 means these points do not pin the reuse constants."""


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, exactly, by trying every support set (for a few columns)."""
    num_cols = a.shape[1]
    best, best_residual = np.zeros(num_cols), float(np.sum(b * b))
    for size in range(1, num_cols + 1):
        for support in itertools.combinations(range(num_cols), size):
            cols = list(support)
            x_s, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_s < 0):
                continue
            x = np.zeros(num_cols)
            x[cols] = x_s
            residual = float(np.sum((a @ x - b) ** 2))
            if residual < best_residual:
                best, best_residual = x, residual
    return best


_workload = functools.lru_cache(maxsize=4096)(build_workload)


def design_matrix(points: list[Point], profile: Profile, params: CacheParams) -> np.ndarray:
    """Rows (DRAM bytes, L2 bytes, 1) per point under the candidate constants."""
    rows = []
    for point in points:
        model = with_params(profile, params, point.num_splits)
        traffic = layer_traffic(model, _workload(point.spec))
        rows.append((traffic.dram_bytes, traffic.l2_bytes, 1.0))
    return np.array(rows, dtype=np.float64)


def fit_points(points: list[Point], profile: Profile, grid: FitGrid) -> FitResult:
    if len(points) < 4:
        raise FitError(f"need at least 4 timed points to fit 3 terms, got {len(points)}")
    seconds = np.array([p.seconds for p in points])
    results = []
    for params in grid.candidates():
        weighted = design_matrix(points, profile, params) / seconds[:, None]
        x = nnls(weighted, np.ones(len(points)))
        rel = weighted @ x - 1.0
        results.append(
            FitResult(
                params=params,
                dram_bandwidth=1.0 / x[0] if x[0] > 0 else None,
                l2_bandwidth=1.0 / x[1] if x[1] > 0 else None,
                overhead_s=float(x[2]),
                rel_rmse=float(np.sqrt(np.mean(rel * rel))),
                num_points=len(points),
            )
        )
    best = min(results, key=lambda r: r.rel_rmse)
    num_equivalent = sum(r.rel_rmse <= 1.01 * best.rel_rmse + 1e-9 for r in results)
    return replace(best, num_equivalent=num_equivalent)


def predict_seconds(
    points: list[Point], profile: Profile, params: CacheParams, result: FitResult
) -> np.ndarray:
    coef = np.array(
        [
            1.0 / result.dram_bandwidth if result.dram_bandwidth else 0.0,
            1.0 / result.l2_bandwidth if result.l2_bandwidth else 0.0,
            result.overhead_s,
        ]
    )
    return design_matrix(points, profile, params) @ coef


def load_points(document: dict, kernel: str) -> list[Point]:
    points = []
    for row in document["measurements"]:
        if row.get("kernel") != kernel or row.get("status") != "ok":
            continue
        spec = WorkloadSpec(**{key: row[key] for key in SPEC_FIELDS})
        points.append(
            Point(spec=spec, num_splits=int(row.get("num_splits") or 1), seconds=row["median_ms"] / 1e3)
        )
    return points


def device_profile(document: dict, gpu: str, model: str, *, allow_cpu: bool = False) -> Profile:
    """The base profile with the L2 size and SM count the measuring device reported."""
    profile = load_profile(gpu, model)
    meta = document["meta"]
    if meta.get("device") != "cuda" and not allow_cpu:
        raise FitError(
            f"measurements were taken on {meta.get('device')}, not a GPU (--allow-cpu tests the plumbing)"
        )
    measured_shape = meta.get("head_shape")
    if measured_shape and measured_shape != asdict(head_shape(profile)):
        raise FitError(
            f"measurements used heads {measured_shape}, model {model} has {asdict(head_shape(profile))}"
        )
    constants = dict(profile.constants)
    for key, field in (("gpu.decode_attention.l2_bytes", "l2_bytes"), ("gpu.compute.num_sms", "num_sms")):
        if meta.get(field):
            constants[key] = constants[key] | {
                "value": meta[field],
                "source": "measured",
                "ref": _provenance(meta),
            }
    return Profile(profile.gpu, profile.model, constants, profile.overrides)


def _provenance(meta: dict) -> str:
    return (
        f"{meta.get('gpu')}, driver {meta.get('driver')}, CUDA {meta.get('cuda')}, torch {meta.get('torch')}, "
        f"triton {meta.get('triton')}, {str(meta.get('date', ''))[:10]}"
    )


def _measured(value: float, unit: str, ref: str) -> dict:
    return {"value": value, "unit": unit, "source": "measured", "ref": ref}


def override_document(result: FitResult, profile: Profile, meta: dict, kernel: str) -> dict:
    """An override file in the simulator's schema (`sglang_feather/sim/profile.py`)."""
    ref = (
        f"kernels_bench.fit of {kernel} decode attention on {_provenance(meta)}; "
        f"{result.num_points} points, relative RMS error {result.rel_rmse:.3f}, "
        f"{result.num_equivalent} reuse-constant candidates within 1%"
    )
    attention: dict[str, dict] = {
        "ctas_per_sm": _measured(result.params.ctas_per_sm, "count", ref),
        "l2_effective_fraction": _measured(result.params.l2_effective_fraction, "fraction", ref),
    }
    if result.params.reuse_window_tokens is not None:
        attention["reuse_window_tokens"] = _measured(result.params.reuse_window_tokens, "tokens", ref)
    if result.l2_bandwidth is not None:
        attention["l2_bandwidth"] = _measured(result.l2_bandwidth, "B/s", ref)
    l2_bytes = profile.constants["gpu.decode_attention.l2_bytes"]
    if l2_bytes["source"] == "measured":
        attention["l2_bytes"] = l2_bytes
    gpu: dict[str, dict] = {"decode_attention": attention}
    if result.dram_bandwidth is not None:
        efficiency = result.dram_bandwidth / profile.value("gpu.memory.hbm_bandwidth")
        gpu["memory"] = {
            "hbm_efficiency": _measured(efficiency, "fraction", ref + " (DRAM bandwidth of the kernel)")
        }
    return {
        "description": f"decode-attention constants measured with kernels_bench on {_provenance(meta)}",
        "applies_to": {"gpu": profile.gpu, "model": profile.model},
        "gpu": gpu,
    }


def summary(result: FitResult, points: list[Point], measured: Profile, base: Profile) -> dict:
    """Fit quality and, per point, measured time vs the fitted model vs the datasheet/estimate profile."""
    fitted = predict_seconds(points, measured, result.params, result)
    base_params = CacheParams(
        ctas_per_sm=base.value("gpu.decode_attention.ctas_per_sm"),
        l2_effective_fraction=base.value("gpu.decode_attention.l2_effective_fraction"),
        reuse_window_tokens=base.get("gpu.decode_attention.reuse_window_tokens"),
    )
    base_result = FitResult(
        params=base_params,
        dram_bandwidth=base.value("gpu.memory.hbm_bandwidth") * base.value("gpu.memory.hbm_efficiency"),
        l2_bandwidth=base.value("gpu.decode_attention.l2_bandwidth"),
        overhead_s=0.0,
        rel_rmse=float("nan"),
        num_points=len(points),
    )
    predicted = predict_seconds(points, base, base_params, base_result)
    return {
        "fit": asdict(result),
        "points": [
            asdict(p.spec)
            | {"num_splits": p.num_splits, "measured_s": p.seconds, "fitted_s": f, "datasheet_s": d}
            for p, f, d in zip(points, fitted.tolist(), predicted.tolist(), strict=True)
        ],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kernels_bench.fit",
        description="Fit decode-attention cost terms (DRAM bytes/BW + L2 bytes/BW + overhead) to a "
        "decode_locality JSON and write a simulator profile override (source: measured).",
    )
    parser.add_argument("measurements", type=Path, help="JSON written by kernels_bench.decode_locality")
    parser.add_argument(
        "--gpu", default="h200", help="simulator GPU profile name (sglang_feather/sim/profiles/gpus)"
    )
    parser.add_argument("--model", default="llama-3-8b", help="simulator model profile name")
    parser.add_argument("--kernel", default="triton", help="which measured kernel to fit (default triton)")
    parser.add_argument("--out", type=Path, required=True, help="override file to write")
    parser.add_argument("--summary", type=Path, help="fit summary JSON (default: <out>.fit.json)")
    parser.add_argument(
        "--allow-cpu", action="store_true", help="accept CPU measurements (plumbing tests only)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        document = json.loads(args.measurements.read_text())
        base = load_profile(args.gpu, args.model)
        measured = device_profile(document, args.gpu, args.model, allow_cpu=args.allow_cpu)
        points = load_points(document, args.kernel)
        result = fit_points(points, measured, DEFAULT_GRID)
    except (OSError, json.JSONDecodeError, KeyError, ProfileError, FitError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    override = override_document(result, measured, document["meta"], args.kernel)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(override, indent=2) + "\n")
    summary_path = args.summary or args.out.with_suffix(".fit.json")
    summary_path.write_text(json.dumps(summary(result, points, measured, base), indent=1) + "\n")
    bw = f"{result.dram_bandwidth / 1e12:.2f} TB/s" if result.dram_bandwidth else "not identifiable"
    l2 = f"{result.l2_bandwidth / 1e12:.2f} TB/s" if result.l2_bandwidth else "not identifiable"
    print(
        f"fit of {len(points)} {args.kernel} points: DRAM {bw}, L2 {l2}, overhead {result.overhead_s * 1e6:.1f} us, "
        f"{result.params}, relative RMS error {result.rel_rmse:.3f}"
    )
    if result.num_equivalent > 1:
        print(
            f"caution: {result.num_equivalent} reuse-constant candidates fit within 1%; add points that separate them"
        )
    print(f"wrote {args.out} and {summary_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
