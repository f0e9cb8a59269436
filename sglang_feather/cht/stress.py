"""Seeded stress run: millions of random operations on the tree, checked against the reference model."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang_feather.cht.hashing import chunk_hashes
from sglang_feather.cht.nodes import RequestState
from sglang_feather.cht.reference import ReferenceTree
from sglang_feather.cht.tree import PythonTree
from sglang_feather.types import RequestId

if TYPE_CHECKING:
    from sglang_feather.cht.backend import ChunkedHashTree


@dataclass(frozen=True)
class StressResult:
    num_ops: int
    num_checks: int
    seconds: float


def run_stress(
    num_ops: int,
    seed: int = 0,
    check_every: int = 1000,
    max_requests: int = 300,
    tree_cls: Callable[[int], ChunkedHashTree] = PythonTree,
) -> StressResult:
    """Random insert/activate/best/deactivate/finish/remove/suspend/resume over shared-prefix groups, and the
    engine's cache events (stores of a tracked or new prompt's chain, from its start or below a cached prefix;
    evictions; clears); the tree's best(), oldest(), prefix_order(), shared depth, counts and cached chunks
    are compared with the brute-force reference and all invariants are checked every `check_every`
    operations (and at the end). Raises AssertionError on the first disagreement."""
    rng = random.Random(seed)
    chunk = 4
    tree, ref = tree_cls(chunk), ReferenceTree()
    groups = [[rng.randrange(50) for _ in range(rng.randrange(4, 40))] for _ in range(6)]
    waiting: list[RequestId] = []
    active: list[RequestId] = []
    next_id = num_checks = 0
    start = time.perf_counter()

    def take(pool: list[RequestId]) -> RequestId:
        i = rng.randrange(len(pool))
        pool[i], pool[-1] = pool[-1], pool[i]
        return pool.pop()

    def new_prompt() -> list[int]:
        group = rng.choice(groups)
        return group[: rng.randrange(1, len(group) + 1)] + [rng.randrange(9) for _ in range(rng.randrange(6))]

    for op in range(num_ops):
        roll = rng.random()
        if roll < 0.30 and len(waiting) + len(active) < max_requests:
            tokens = new_prompt()
            hashes = chunk_hashes(tokens, chunk)
            # Token ids first, then an engine's hashes (the compiled tree then indexes every chunk).
            if op < num_ops // 2:
                tree.insert(next_id, tokens)
            else:
                tree.insert_hashes(next_id, hashes)
            ref.insert_hashes(next_id, hashes)
            waiting.append(next_id)
            next_id += 1
        elif roll < 0.50 and waiting:
            best = tree.best()
            if best is None:  # every waiting request is suspended
                tree.resume_all()
                ref.resume_all()
            else:
                waiting.remove(best.request_id)
                tree.activate(best.request_id)
                ref.activate(best.request_id)
                active.append(best.request_id)
        elif roll < 0.55 and waiting:
            rid = take(waiting)
            tree.activate(rid)
            ref.activate(rid)
            active.append(rid)
        elif roll < 0.75 and active:
            rid = take(active)
            tree.finish(rid)
            ref.finish(rid)
        elif roll < 0.85 and active:
            rid = take(active)
            tree.deactivate(rid)
            ref.deactivate(rid)
            waiting.append(rid)
        elif roll < 0.90 and waiting:
            rid = take(waiting)
            tree.remove(rid)
            ref.remove(rid)
        elif roll < 0.94 and waiting:
            rid = rng.choice(waiting)
            if tree.is_suspended(rid):
                tree.resume(rid)
                ref.resume(rid)
            else:
                tree.suspend(rid)
                ref.suspend(rid)
        elif roll < 0.97:
            # The engine caches part of a tracked prompt (splitting the compiled tree's tails) or a new one.
            tracked = waiting + active
            if tracked and rng.random() < 0.7:
                hashes = ref.hashes[rng.choice(tracked)]
            else:
                hashes = chunk_hashes(new_prompt(), chunk)
            first = 0 if rng.random() < 0.5 else rng.randrange(len(hashes))
            end = rng.randrange(first + 1, len(hashes) + 1)
            parent = hashes[first - 1] if first else None
            stored = tree.cache_store(hashes[first:end], parent)
            assert stored == ref.cache_store(hashes[first:end], parent), "cache_store count"
        elif roll < 0.99 and ref.cache:
            doomed = [rng.choice(list(ref.cache)) for _ in range(rng.randrange(1, 3))]
            assert tree.cache_remove(doomed) == ref.cache_remove(doomed), "cache_remove count"
        elif roll < 0.992 or len(ref.cache) > 4 * max_requests:
            tree.cache_clear()
            ref.cache_clear()
        else:
            tree.best()
        if (op + 1) % check_every == 0:
            _compare(tree, ref)
            num_checks += 1
    _compare(tree, ref)
    return StressResult(num_ops, num_checks + 1, time.perf_counter() - start)


def _compare(tree: ChunkedHashTree, ref: ReferenceTree) -> None:
    tree.check_invariants()
    assert tree.best() == ref.best(), (tree.best(), ref.best())
    assert tree.oldest() == ref.oldest()
    tracked = list(ref.states)
    assert tree.prefix_order(tracked) == ref.prefix_order(tracked)
    assert tree.shared_depth == ref.shared_depth()
    assert tree.num_waiting == len(ref.ids(RequestState.WAITING))
    assert tree.num_active == len(ref.ids(RequestState.ACTIVE))
    assert tree.num_running_groups == ref.num_running_groups()
    assert tree.num_cached == len(ref.cache)
    for rid in ref.ids(RequestState.WAITING):
        assert tree.candidate(rid) == ref.describe(rid), (tree.candidate(rid), ref.describe(rid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=1_000_000, help="number of random operations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-every", type=int, default=1000, help="compare with the reference this often")
    parser.add_argument(
        "--backend",
        choices=("both", "python", "native"),
        default="both",
        help="which tree(s) to run: both, the Python tree or the compiled one (default both)",
    )
    args = parser.parse_args()
    trees: dict[str, Callable[[int], ChunkedHashTree]] = {"python": PythonTree}
    if args.backend != "python":
        from sglang_feather.cht.native import NativeTree  # fails loudly when the compiled tree is not built

        trees["native"] = NativeTree
    for name, tree_cls in trees.items():
        if args.backend not in ("both", name):
            continue
        result = run_stress(args.ops, args.seed, args.check_every, tree_cls=tree_cls)
        print(
            f"stress ok ({name} tree): {result.num_ops:,} ops, {result.num_checks:,} reference comparisons + "
            f"invariant checks, seed {args.seed}, {result.seconds:.1f} s"
        )


if __name__ == "__main__":
    main()
