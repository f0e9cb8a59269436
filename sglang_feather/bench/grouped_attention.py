"""`bench grouped-attention`: CPU decode attention per layer and step: torch_native, grouped, grouping off."""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from sglang_feather.bench.cli_types import add_json_flag, int_list, publish
from sglang_feather.bench.markdown import header, ratio, row
from sglang_feather.bench.report import machine_line, run_meta
from sglang_feather.measure.timing import Spread, frozen_heap, gc_disabled

if TYPE_CHECKING:
    import torch

    from sglang_feather.sglang.grouped_attention.segments import BatchSegments

PAGE_SIZE = 16
"""Slots are handed out in pages of this many (the radix cache shares whole pages); segments found at it."""
METHODS = ("torch_native", "grouped", "control")
DISTINCT = "distinct"
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
"""Largest max-abs difference from torch_native's output that grouped and control may show, by dtype."""


@dataclass(frozen=True)
class HeadShape:
    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    dtype: str
    num_layers_timed: int
    """Layers a timed step runs, each on K/V buffers of its own; the step figure scales to `num_layers`."""
    baseline_once: bool = False
    """torch_native runs once per cell (its checked run, timed: the one sample) instead of `repeat` times."""

    @property
    def k_bytes_per_token(self) -> int:
        """One layer's K bytes per token (`DecodePlan.build` sizes its gathers by it, as the backend does)."""
        return self.num_kv_heads * self.head_dim * (2 if self.dtype == "bfloat16" else 4)

    @property
    def kv_bytes_per_token(self) -> int:
        """One layer's K and V bytes per token."""
        return 2 * self.k_bytes_per_token

    def describe(self) -> str:
        timed = (
            f"all {self.num_layers} timed"
            if self.num_layers_timed == self.num_layers
            else f"{self.num_layers_timed} timed, ×{self.num_layers / self.num_layers_timed:g}"
        )
        heads = f"{self.num_q_heads} q / {self.num_kv_heads} KV heads × {self.head_dim}"
        text = f"{self.name}: {heads}, {self.dtype}, {self.num_layers} layers ({timed})"
        if self.baseline_once:
            text += "; torch_native too slow to repeat: timed once per cell (its checked run, one sample)"
        return text


HEAD_SHAPES = {
    "tiny": HeadShape("tiny", 2, 1, 64, 2, "float32", num_layers_timed=2),
    "llama3-8b": HeadShape("llama3-8b", 32, 8, 128, 32, "bfloat16", num_layers_timed=1, baseline_once=True),
}
"""The project's tiny Llama as the CPU server runs it (scripts/make_tiny_model.py, --dtype float32), and
Llama-3-8B's attention."""


@dataclass(frozen=True)
class Grid:
    """One head shape's cells: every (batch, prefix, tail) point at every group count."""

    points: tuple[tuple[int, int, int], ...]
    groups: tuple[int | str, ...]


ALL_GROUPS = (1, 2, 4, 8, 16, DISTINCT)
DEFAULT_GRIDS = {
    "tiny": Grid(
        ((64, 1024, 64), (64, 2048, 64), (64, 4096, 64), (64, 2048, 512), (256, 1024, 64), (256, 4096, 64)),
        ALL_GROUPS,
    ),
    "llama3-8b": Grid(((64, 2048, 64),), (1, 8, DISTINCT)),
}
QUICK_GRIDS = {
    "tiny": Grid(((8, 64, 20),), (1, 3, DISTINCT)),
    "llama3-8b": Grid(((4, 32, 16),), (1, DISTINCT)),
}


@dataclass(frozen=True)
class Config:
    grids: dict[str, Grid]
    repeat: int = 5
    threads: int = 1
    seed: int = 0


@dataclass(frozen=True)
class Workload:
    """One decode batch over a paged KV pool, laid out as SGLang's radix cache leaves it."""

    req_to_token: torch.Tensor
    """[num_requests, prefix + tail] int32: a request's KV slots, its group's prefix's then its tail's."""
    req_pool_indices: torch.Tensor
    """[num_requests] int64: each batch row's `req_to_token` row (shuffled, as a pool hands rows out)."""
    seq_lens: tuple[int, ...]
    group_of: tuple[int, ...]
    num_slots: int
    """Pool size; page 0 (slot 0, SGLang's padding slot, with the rest of its page) is never handed out."""


def build_workload(batch: int, num_groups: int, prefix: int, tail: int, seed: int) -> Workload:
    """Batch row i in group i % num_groups; each group's prefix stored once, each tail on fresh slots, all
    from one shuffled list of pages."""
    import torch

    if prefix % PAGE_SIZE:
        raise ValueError(f"prefix must be a whole number of {PAGE_SIZE}-token pages, got {prefix}")
    if not 1 <= num_groups <= batch:
        raise ValueError(f"num_groups must be in [1, {batch}], got {num_groups}")
    rng = random.Random(seed)
    tail_pages = -(-tail // PAGE_SIZE)
    num_pages = num_groups * prefix // PAGE_SIZE + batch * tail_pages
    pages = torch.tensor(rng.sample(range(1, num_pages + 1), num_pages), dtype=torch.int32)
    slots = (pages[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE, dtype=torch.int32)).view(-1)
    prefixes = slots[: num_groups * prefix].view(num_groups, prefix)
    tails = slots[num_groups * prefix :].view(batch, tail_pages * PAGE_SIZE)[:, :tail]
    pool_rows = rng.sample(range(batch), batch)
    group_of = tuple(i % num_groups for i in range(batch))
    req_to_token = torch.zeros((batch, prefix + tail), dtype=torch.int32)
    req_to_token[pool_rows] = torch.cat([prefixes[list(group_of)], tails], dim=1)
    return Workload(
        req_to_token,
        torch.tensor(pool_rows, dtype=torch.int64),
        (prefix + tail,) * batch,
        group_of,
        (num_pages + 1) * PAGE_SIZE,
    )


def bytes_per_step(shape: HeadShape, segments: BatchSegments) -> dict[str, int]:
    """K and V bytes each method gathers in a step: every request's whole KV, or (grouped) each span once."""
    per_token = shape.kv_bytes_per_token * shape.num_layers
    logical = segments.num_tokens_logical * per_token
    return {"torch_native": logical, "grouped": segments.num_tokens_read * per_token, "control": logical}


class MismatchError(RuntimeError):
    """A method's output differs from torch_native's beyond the dtype's tolerance."""


def check_outputs(
    dtype: str, reference: list[torch.Tensor], outputs: dict[str, list[torch.Tensor]], where: str
) -> dict[str, float]:
    """Max abs difference of each method's per-layer outputs from torch_native's; raises `MismatchError`."""
    diffs = {
        name: max(
            float((out.float() - ref.float()).abs().max()) for out, ref in zip(outs, reference, strict=True)
        )
        for name, outs in outputs.items()
    }
    bad = {name: diff for name, diff in diffs.items() if not diff <= TOLERANCE[dtype]}
    if bad:
        raise MismatchError(
            f"{where}: output differs from torch_native's beyond {TOLERANCE[dtype]:g} ({dtype}): "
            + ", ".join(f"{name} max abs diff {diff:.3g}" for name, diff in bad.items())
        )
    return diffs


def spread_ms(spread: Spread) -> str:
    """`median [min–max]` in milliseconds (the median alone for one sample)."""
    if spread.min == spread.max:
        return _ms(spread.median)
    return f"{_ms(spread.median)} [{_ms(spread.min)}–{_ms(spread.max)}]"


def _ms(seconds: float) -> str:
    return _figure(seconds * 1e3)


def _figure(value: float) -> str:
    """Three significant digits, whole numbers from 100 up."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


@dataclass(frozen=True)
class MethodResult:
    detection_s: Spread | None
    """Once per step: finding the segments (grouped) or listing the requests (control), and the plan."""
    layer_s: Spread
    step_s: Spread
    """Detection + `num_layers` × the step's mean per-layer time."""
    bytes_per_step: int
    max_abs_diff: float
    """From torch_native's output (0 for torch_native)."""
    num_samples: int


@dataclass(frozen=True)
class CellResult:
    shape: str
    batch: int
    prefix: int
    tail: int
    groups: int | str
    num_groups: int
    num_shared_segments: int
    methods: dict[str, MethodResult]

    def speedup(self, over: str) -> float:
        return self.methods[over].step_s.median / self.methods["grouped"].step_s.median

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "speedup_vs_torch_native": self.speedup("torch_native"),
            "speedup_vs_control": self.speedup("control"),
        }


@dataclass(frozen=True)
class Method:
    """How a method runs a step: `prepare()` once per forward, then `attend(prepared, layer)` per layer."""

    prepare: Callable[[], Any]
    attend: Callable[[Any, int], torch.Tensor]


def methods_for(shape: HeadShape, work: Workload, q, k, v) -> tuple[dict[str, Method], dict[str, Any]]:
    """The three methods over one pool and batch (q, k, v: [layer, ...]), and the segments each plan was
    built from (by method name, refreshed every step)."""
    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_feather.sglang.grouped_attention.kernel import DecodePlan, GatherThenAttend, grouped_decode
    from sglang_feather.sglang.grouped_attention.observe import SegmentObserver
    from sglang_feather.sglang.grouped_attention.segments import private_segments

    scaling = shape.head_dim**-0.5
    seq_lens_cpu = torch.tensor(work.seq_lens, dtype=torch.int64)
    sdpa = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    found: dict[str, Any] = {}

    def native(_: None, layer: int) -> torch.Tensor:
        out = torch.empty_like(q[layer])
        sdpa._run_sdpa_forward_decode(
            q[layer],
            out,
            k[layer],
            v[layer],
            work.req_to_token,
            work.req_pool_indices,
            seq_lens_cpu,
            scaling=scaling,
            enable_gqa=shape.num_q_heads != shape.num_kv_heads,
        )
        return out

    observer = SegmentObserver("bench", PAGE_SIZE)  # what the backend runs in init_forward_metadata

    def plan(name: str, grouping: bool) -> Callable[[], DecodePlan]:
        def prepare() -> DecodePlan:
            seq_lens = seq_lens_cpu.tolist()
            if grouping:
                segments, rows = observer.observe(work.req_to_token, work.req_pool_indices, seq_lens)
            else:
                rows = work.req_to_token.index_select(0, work.req_pool_indices)[:, : max(seq_lens)]
                segments = private_segments(seq_lens)
            found[name] = segments
            return DecodePlan.build(segments, rows, shape.k_bytes_per_token, PAGE_SIZE)

        return prepare

    attend_spans = GatherThenAttend()  # its scratch lives as long as the backend's does in a server

    def attend(prepared: DecodePlan, layer: int) -> torch.Tensor:
        return grouped_decode(q[layer], k[layer], v[layer], prepared, scaling, attend_spans)

    methods = {
        "torch_native": Method(lambda: None, native),
        "grouped": Method(plan("grouped", grouping=True), attend),
        "control": Method(plan("control", grouping=False), attend),
    }
    return methods, found


def run_step(method: Method, num_layers: int) -> tuple[float, float, list[torch.Tensor]]:
    """One step, the collector off: (prepare seconds, seconds of all `num_layers` layers, their outputs)."""
    with gc_disabled():
        start = time.perf_counter()
        prepared = method.prepare()
        planned = time.perf_counter()
        outs = [method.attend(prepared, layer) for layer in range(num_layers)]
        done = time.perf_counter()
    return planned - start, done - planned, outs


def measure_cell(
    shape: HeadShape, batch: int, prefix: int, tail: int, groups: int | str, cfg: Config
) -> CellResult:
    """Build the cell's pool, check grouped and control against torch_native (the untimed warm-up, except
    for a `baseline_once` torch_native), then time `cfg.repeat` steps, the methods interleaved."""
    import torch

    num_groups = batch if groups == DISTINCT else int(groups)
    work = build_workload(batch, num_groups, prefix, tail, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = getattr(torch, shape.dtype)
    timed = shape.num_layers_timed
    kv_shape = (timed, work.num_slots, shape.num_kv_heads, shape.head_dim)
    k = torch.randn(kv_shape, generator=gen, dtype=dtype)
    v = torch.randn(kv_shape, generator=gen, dtype=dtype)
    q = torch.randn((timed, batch, shape.num_q_heads, shape.head_dim), generator=gen, dtype=dtype)
    methods, found = methods_for(shape, work, q, k, v)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in METHODS}
    with frozen_heap():
        first = {name: run_step(method, timed) for name, method in methods.items()}
        where = f"{shape.name} batch {batch} prefix {prefix} tail {tail} groups {groups}"
        diffs = check_outputs(
            shape.dtype, first["torch_native"][2], {n: first[n][2] for n in ("grouped", "control")}, where
        )
        if shape.baseline_once:
            samples["torch_native"].append(first["torch_native"][:2])
        del first
        for _ in range(cfg.repeat):
            for name, method in methods.items():
                if name == "torch_native" and shape.baseline_once:
                    continue
                gc.collect()
                samples[name].append(run_step(method, timed)[:2])
    segments = found["grouped"]
    gathered = bytes_per_step(shape, segments)
    results = {}
    for name, pairs in samples.items():
        layer = [seconds / timed for _, seconds in pairs]
        results[name] = MethodResult(
            detection_s=None if name == "torch_native" else Spread.of([d for d, _ in pairs]),
            layer_s=Spread.of(layer),
            step_s=Spread.of([d + per * shape.num_layers for (d, _), per in zip(pairs, layer, strict=True)]),
            bytes_per_step=gathered[name],
            max_abs_diff=diffs.get(name, 0.0),
            num_samples=len(pairs),
        )
    return CellResult(
        shape.name, batch, prefix, tail, groups, num_groups, segments.num_shared_segments, results
    )


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def run(cfg: Config) -> dict:
    import os

    import torch

    started = time.time()
    load_before = os.getloadavg()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    rows = []
    try:
        for name, grid in cfg.grids.items():
            shape = HEAD_SHAPES[name]
            for (batch, prefix, tail), groups in itertools.product(grid.points, grid.groups):
                if isinstance(groups, int) and groups > batch:
                    print(f"[grouped-attention] skipped: {groups} groups > batch {batch}", file=sys.stderr)
                    continue
                print(f"[grouped-attention] {name} B={batch} P={prefix} T={tail} G={groups}", file=sys.stderr)
                rows.append(measure_cell(shape, batch, prefix, tail, groups, cfg).to_json())
    finally:
        torch.set_num_threads(threads_before)
    meta = {
        **run_meta(started, load_before),
        "threads": cfg.threads,
        "cpu_model": cpu_model(),
        "repeat": cfg.repeat,
        "seed": cfg.seed,
        "page_size": PAGE_SIZE,
        "shapes": {name: asdict(HEAD_SHAPES[name]) for name in cfg.grids},
    }
    return {"meta": meta, "header": header_line(meta), "rows": rows}


def header_line(meta: dict) -> str:
    load = ", ".join(f"{x:.2f}" for x in meta["loadavg_after"])
    threads = f"{meta['threads']} torch thread(s)"
    return f"{machine_line(meta)} (1/5/15 min after: {load}), {threads}, {meta['cpu_model']}"


COLUMNS = [
    "shape",
    "B",
    "prefix",
    "tail",
    "groups",
    "shared segments",
    "detect ms",
    "layer ms torch_native",
    "layer ms grouped",
    "layer ms control",
    "step ms torch_native",
    "step ms grouped",
    "step ms control",
    "× torch_native",
    "× control",
    "MB/step torch_native, control",
    "MB/step grouped",
]


def _spread(value: dict) -> str:
    return spread_ms(Spread(**value))


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        result["header"] + ".",
        "",
        f"Median [min–max] over {meta['repeat']} repeats, each a full step, the methods interleaved. Per "
        "step = detection + layers × per layer; detection runs once per forward (grouped: `find_segments` + "
        "`DecodePlan.build`; control: `private_segments` + `DecodePlan.build`; torch_native: none). × = "
        "grouped's step speed-up. MB/step = K and V gathered (torch_native, control: every request's whole "
        f"KV; grouped: each span once). Pages of {PAGE_SIZE} slots, shuffled. grouped and control match "
        "torch_native's output in every cell (max abs diff in the JSON).",
        *(f"- {HeadShape(**s).describe()}" for s in meta["shapes"].values()),
        "",
        *header(COLUMNS, num_left=1),
    ]
    for r in result["rows"]:
        m = r["methods"]
        values = [r["shape"], r["batch"], r["prefix"], r["tail"], r["groups"], r["num_shared_segments"]]
        values.append(_spread(m["grouped"]["detection_s"]))
        values += [_spread(m[name]["layer_s"]) for name in METHODS]
        values += [_spread(m[name]["step_s"]) for name in METHODS]
        values += [ratio(r["speedup_vs_torch_native"]), ratio(r["speedup_vs_control"])]
        values += [_figure(m[name]["bytes_per_step"] / 1e6) for name in ("torch_native", "grouped")]
        lines.append(row([str(v) for v in values]))
    return "\n".join(lines)


def group_list(text: str) -> tuple[int | str, ...]:
    values: list[int | str] = []
    for part in text.split(","):
        if part == DISTINCT:
            values.append(DISTINCT)
        elif part.isdigit() and int(part) >= 1:
            values.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"groups are integers >= 1 or {DISTINCT!r}, got {part!r}")
    return tuple(values)


def shape_list(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    unknown = [n for n in names if n not in HEAD_SHAPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {unknown}; choose from {','.join(HEAD_SHAPES)}")
    return names


def prefix_list(text: str) -> tuple[int, ...]:
    values = int_list(text)
    if any(v % PAGE_SIZE for v in values):
        raise argparse.ArgumentTypeError(f"prefixes must be whole {PAGE_SIZE}-token pages, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a few tiny cells of both shapes (seconds)")
    parser.add_argument("--shapes", type=shape_list, help=f"comma list (default {','.join(HEAD_SHAPES)})")
    grid = "with any of --batch/--prefix/--tail the cells are their product (the others: the grid's values)"
    parser.add_argument("--batch", type=int_list, help=f"comma list of batch sizes; {grid}")
    parser.add_argument(
        "--prefix", type=prefix_list, help=f"comma list of shared prefix tokens (x{PAGE_SIZE})"
    )
    parser.add_argument("--tail", type=int_list, help="comma list of private tail tokens per request")
    parser.add_argument(
        "--groups", type=group_list, help=f"comma list of group counts or {DISTINCT} (= batch)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (torch.set_num_threads; default 1)"
    )
    parser.add_argument("--repeat", type=int, help="timed steps per method and cell (default 5, --quick 2)")
    parser.add_argument("--seed", type=int, default=0)
    add_json_flag(parser)


def grid_from_args(grid: Grid, args: argparse.Namespace) -> Grid:
    if args.batch or args.prefix or args.tail:
        batches, prefixes, tails = (dict.fromkeys(values) for values in zip(*grid.points, strict=True))
        points = itertools.product(args.batch or batches, args.prefix or prefixes, args.tail or tails)
        grid = replace(grid, points=tuple(points))
    return replace(grid, groups=args.groups or grid.groups)


def config_from_args(args: argparse.Namespace) -> Config:
    grids = QUICK_GRIDS if args.quick else DEFAULT_GRIDS
    shapes = args.shapes or tuple(grids)
    return Config(
        grids={name: grid_from_args(grids[name], args) for name in shapes},
        repeat=args.repeat or (2 if args.quick else 5),
        threads=args.threads,
        seed=args.seed,
    )


def main(args: argparse.Namespace) -> int:
    try:
        result = run(config_from_args(args))
    except MismatchError as error:
        print(f"grouped-attention: FAILED: {error}", file=sys.stderr)
        return 1
    return publish(markdown(result), result, args.json)
