"""The Chunked Hash Tree doing calc_priority's job on the same queues: per-operation, per-pass, per-sequence."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from sglang_feather.cht import ChunkedHashTree, PythonTree, chunk_hashes, new_tree
from sglang_feather.measure.sequence import SequencePlan
from sglang_feather.measure.timing import Samples, TimingConfig, gc_disabled, median_run, sample_named
from sglang_feather.measure.workloads import Workload
from sglang_feather.types import ChunkHash

# How it works. SGLang's cache holds `workload.cached` before the first pass; the CHT sees the same
# sequences as running requests (ids ("cached", g)), so their chunks form the working set the waiting
# prompts are scored against. Queue request i has id i and arrival i. One CHT pass does what one
# calc_priority call plus the head of SGLang's admission loop does: pick `num_per_pass` requests, each by
# best() then activate(); every call is timed on its own and the pass cost is their sum. Samples restore the
# tree untimed (the admitted requests finish, timed separately as the finish cost, and are re-inserted from
# their hashes with their original arrival), so every sample starts from the same queue.

PERF = time.perf_counter


def backends() -> dict[str, Callable[[int], ChunkedHashTree]]:
    """The CHT backends to measure side by side (a new tree of a chunk size on each): the Python tree, and the
    compiled one when it is built."""
    found: dict[str, Callable[[int], ChunkedHashTree]] = {"python": PythonTree}
    try:
        from sglang_feather.cht.native import NativeTree
    except ImportError:
        return found
    found["native"] = NativeTree
    return found


@dataclass(frozen=True)
class ChtCell:
    """Median seconds: `pass_s` per pass of the first k; the others per single operation (mean in a sample)."""

    pass_s: Samples
    passes: dict[int, Samples]
    """Per-pass cost for every k measured (k -> samples)."""
    best_s: Samples
    activate_s: Samples
    finish_s: Samples
    insert_s: Samples
    """`insert(rid, token_ids)` of a fresh arrival's `array('q')` prompt, hashing included."""
    hash_s: Samples
    """`chunk_hashes` alone for the same prompts."""
    num_admitted: int
    picks: tuple[int, ...]
    num_nodes: int


@dataclass(frozen=True)
class ChtSequence:
    """Summed seconds of every CHT call over a whole sequence, by operation, with the call counts."""

    total_s: float
    insert_s: float
    best_s: float
    activate_s: float
    finish_s: float
    num_passes: int
    num_inserts: int
    num_best: int
    num_activate: int
    num_finish: int


def resident_id(index: int) -> tuple[str, int]:
    return ("cached", index)


def build_tree(
    workload: Workload, chunk_size: int, tree_cls: Callable[[int], ChunkedHashTree] = new_tree
) -> tuple[ChunkedHashTree, list[list[ChunkHash]]]:
    """The tree with the cached sequences running and the whole queue waiting; also each prompt's hashes."""
    tree = tree_cls(chunk_size)
    _add_residents(tree, workload)
    hashes = [chunk_hashes(prompt, chunk_size) for prompt in workload.prompts]
    for i, prompt_hashes in enumerate(hashes):
        tree.insert_hashes(i, prompt_hashes, arrival=float(i))
    return tree, hashes


def _add_residents(tree: ChunkedHashTree, workload: Workload) -> None:
    for g, tokens in enumerate(workload.cached):
        tree.insert(resident_id(g), tokens, arrival=float(-1 - g))
        tree.activate(resident_id(g))


@dataclass(frozen=True)
class PassResult:
    picked: list[int]
    best_s: float
    activate_s: float
    num_best: int


def run_pass(tree: ChunkedHashTree, num_per_pass: int) -> PassResult:
    """One admission pass: up to `num_per_pass` times best() then activate(), each call timed."""
    picked: list[int] = []
    best_s = activate_s = 0.0
    num_best = 0
    while len(picked) < num_per_pass:
        start = PERF()
        candidate = tree.best()
        mid = PERF()
        best_s += mid - start
        num_best += 1
        if candidate is None:
            break
        tree.activate(candidate.request_id)
        activate_s += PERF() - mid
        rid = candidate.request_id
        assert isinstance(rid, int), "the bench's requests are its workload indices"
        picked.append(rid)
    return PassResult(picked, best_s, activate_s, num_best)


def picks(
    workload: Workload,
    chunk_size: int,
    num_per_pass: int,
    tree_cls: Callable[[int], ChunkedHashTree] = new_tree,
) -> list[int]:
    """The request indices one pass admits, in pick order."""
    tree, _ = build_tree(workload, chunk_size, tree_cls)
    return run_pass(tree, num_per_pass).picked


def _sample_pass(
    tree: ChunkedHashTree, hashes: list[list[ChunkHash]], num_per_pass: int, cfg: TimingConfig
) -> tuple[dict[str, Samples], tuple[int, ...]]:
    last: list[int] = []

    def one_pass() -> dict[str, float]:
        nonlocal last
        result = run_pass(tree, num_per_pass)
        last = result.picked
        num = max(len(last), 1)
        return {
            "pass": result.best_s + result.activate_s,
            "best": result.best_s / result.num_best,
            "activate": result.activate_s / num,
            "finish": _finish_all(tree, last) / num,
        }

    def restore() -> None:
        for rid in last:
            tree.insert_hashes(rid, hashes[rid], arrival=float(rid))

    return sample_named(one_pass, cfg, restore), tuple(last)


def _sample_inserts(tree: ChunkedHashTree, workload: Workload, cfg: TimingConfig) -> dict[str, Samples]:
    arrivals = workload.arrivals

    def insert_arrivals() -> dict[str, float]:
        insert_s = hash_s = 0.0
        for j, prompt in enumerate(arrivals):
            start = PERF()
            tree.insert(("arrival", j), prompt)
            mid = PERF()
            chunk_hashes(prompt, tree.chunk_size)
            hash_s += PERF() - mid
            insert_s += mid - start
        return {"insert": insert_s / len(arrivals), "hash": hash_s / len(arrivals)}

    def remove_arrivals() -> None:
        for j in range(len(arrivals)):
            tree.remove(("arrival", j))

    return sample_named(insert_arrivals, cfg, remove_arrivals)


def measure_cell(
    workload: Workload,
    chunk_size: int,
    pass_sizes: tuple[int, ...],
    cfg: TimingConfig,
    tree_cls: Callable[[int], ChunkedHashTree] = new_tree,
) -> ChtCell:
    """Per-pass cost for each k in `pass_sizes`; per-operation costs and picks from the first k."""
    tree, hashes = build_tree(workload, chunk_size, tree_cls)
    timings, pass_picks = _sample_pass(tree, hashes, pass_sizes[0], cfg)
    passes = {pass_sizes[0]: timings["pass"]}
    for k in pass_sizes[1:]:
        passes.setdefault(k, _sample_pass(tree, hashes, k, cfg)[0]["pass"])
    inserts = _sample_inserts(tree, workload, cfg)
    return ChtCell(
        pass_s=timings["pass"],
        passes=passes,
        best_s=timings["best"],
        activate_s=timings["activate"],
        finish_s=timings["finish"],
        insert_s=inserts["insert"],
        hash_s=inserts["hash"],
        num_admitted=len(pass_picks),
        picks=pass_picks,
        num_nodes=tree.num_nodes,
    )


def run_sequence(
    workload: Workload,
    chunk_size: int,
    plan: SequencePlan,
    tree_cls: Callable[[int], ChunkedHashTree] = new_tree,
) -> ChtSequence:
    """All CHT work while `plan` drains the queue: inserts, each pass's best()/activate(), every finish."""
    tree = tree_cls(chunk_size)
    _add_residents(tree, workload)
    insert_s = best_s = activate_s = finish_s = 0.0
    num_best = num_finish = 0
    admitted_by_pass: list[list[int]] = []
    with gc_disabled():
        gc.collect()
        for i, prompt in enumerate(workload.prompts):
            start = PERF()
            tree.insert(i, prompt, arrival=float(i))
            insert_s += PERF() - start
        while tree.num_waiting and (plan.max_passes is None or len(admitted_by_pass) < plan.max_passes):
            gc.collect()
            due = len(admitted_by_pass) - plan.finish_after_passes
            if due >= 0:
                finish_s += _finish_all(tree, admitted_by_pass[due])
                num_finish += len(admitted_by_pass[due])
            result = run_pass(tree, plan.num_per_pass)
            best_s += result.best_s
            activate_s += result.activate_s
            num_best += result.num_best
            admitted_by_pass.append(result.picked)
        for picked in admitted_by_pass[max(len(admitted_by_pass) - plan.finish_after_passes, 0) :]:
            finish_s += _finish_all(tree, picked)
            num_finish += len(picked)
    num_activate = sum(map(len, admitted_by_pass))
    return ChtSequence(
        total_s=insert_s + best_s + activate_s + finish_s,
        insert_s=insert_s,
        best_s=best_s,
        activate_s=activate_s,
        finish_s=finish_s,
        num_passes=len(admitted_by_pass),
        num_inserts=len(workload.prompts),
        num_best=num_best,
        num_activate=num_activate,
        num_finish=num_finish,
    )


def prompt_read_s(workload: Workload, cfg: TimingConfig) -> float | None:
    """Median seconds to read every queued prompt once without hashing it (the compiled tree's `read_words`,
    prefetched like its hash loop), in arrival order and under the cache state the whole runs leave: the
    memory traffic either tree's inserts of this queue pay at least. None when the compiled tree is not built."""
    try:
        from sglang_feather.cht._native._tree import read_words
    except ImportError:
        return None

    def read_all() -> float:
        start = PERF()
        for prompt in workload.prompts:
            read_words(prompt)
        return PERF() - start

    return median_run(read_all, float, cfg)[0]


def _finish_all(tree: ChunkedHashTree, request_ids: list[int]) -> float:
    total = 0.0
    for rid in request_ids:
        start = PERF()
        tree.finish(rid)
        total += PERF() - start
    return total
