"""Which waiting requests' cached prefixes the engine refreshes, in what order: a brute-force reference, either tree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_feather.admission.refresh import REFRESH_WINDOW, prefixes_to_refresh
from sglang_feather.cht import PythonTree
from sglang_feather.cht.native import NativeTree

CHUNK = 4
TREES = {"python": PythonTree, "native": NativeTree}


def _prompt(shape: tuple[int, ...]) -> np.ndarray:
    """One chunk per entry: chunk i of value v is the same tokens in every prompt with the same first i+1."""
    return np.repeat(np.asarray(shape, dtype=np.int64), CHUNK)


def reference(prompts, running, cached, queue):
    """The definition, by brute force over chunk tuples."""
    chosen: dict[tuple, tuple] = {}
    for position, rid in enumerate(queue[:REFRESH_WINDOW]):
        if rid in running or rid not in prompts:
            continue
        chunks = prompts[rid]
        depth_running = max(
            (
                next(
                    (i for i in range(min(len(chunks), len(prompts[r]))) if chunks[i] != prompts[r][i]),
                    min(len(chunks), len(prompts[r])),
                )
                for r in running
            ),
            default=0,
        )
        depth_cached = 0
        while depth_cached < len(chunks) and chunks[: depth_cached + 1] in cached:
            depth_cached += 1
        if depth_cached > depth_running:
            prefix = chunks[:depth_cached]
            num_through = sum(p[:depth_cached] == prefix for r, p in prompts.items() if r not in running)
            chosen.setdefault(prefix, (-depth_cached, -num_through, position, rid))
    # the ranking's order (deepest, the most requests through it, queue order), refreshed in reverse
    return [key[-1] for key in sorted(chosen.values(), reverse=True)]


shapes = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple)


@pytest.mark.parametrize("backend", list(TREES))
@settings(max_examples=80, deadline=None)
@given(
    prompts=st.lists(shapes, min_size=1, max_size=10),
    data=st.data(),
)
def test_matches_the_reference(backend, prompts, data):
    tree = TREES[backend](CHUNK)
    ids = {f"r{i}": p for i, p in enumerate(prompts)}
    for rid, shape in ids.items():
        tree.insert(rid, _prompt(shape))
    running = set(data.draw(st.sets(st.sampled_from(sorted(ids)))))
    for rid in running:
        tree.activate(rid)
    cached: set[tuple] = set()
    for rid, depth in data.draw(
        st.lists(st.tuples(st.sampled_from(sorted(ids)), st.integers(1, 4)), max_size=4)
    ):
        depth = min(depth, len(ids[rid]))
        tree.cache_store(tree.path_hashes(rid)[:depth])
        cached.update(ids[rid][:d] for d in range(1, depth + 1))
    queue = data.draw(st.permutations(sorted(ids))) + ["untracked"]
    assert prefixes_to_refresh(tree, queue) == reference(ids, running, cached, queue)


def test_one_per_cached_prefix_head_last_running_and_uncached_left_out():
    tree = PythonTree(CHUNK)
    for rid, shape in {
        "a1": (1, 5),
        "a2": (1, 6),
        "b": (2, 5),
        "c": (3, 5),
        "d": (4, 5),
        "d2": (4, 6),
    }.items():
        tree.insert(rid, _prompt(shape))
    for rid in ("a1", "b", "d"):
        tree.cache_store(tree.path_hashes(rid)[:1])
    tree.activate("d")  # its group runs: the prefix is locked, nothing to refresh
    # a1 and a2 share the cached chunk (one touch), b has its own, c nothing cached, d2's prefix runs; the
    # heavier a1 goes first in the ranking, so it is refreshed last
    assert prefixes_to_refresh(tree, ["b", "c", "a2", "a1", "d2"]) == ["b", "a2"]
    tree.cache_store(tree.path_hashes("c"))  # c cached whole: deepest, so the ranking's first
    assert prefixes_to_refresh(tree, ["b", "c", "a2", "a1", "d2"]) == ["b", "a2", "c"]


def test_the_window_bounds_the_walk():
    tree = PythonTree(CHUNK)
    for i in range(REFRESH_WINDOW + 1):
        tree.insert(f"r{i}", _prompt((i,)))
        tree.cache_store(tree.path_hashes(f"r{i}"))
    queue = [f"r{i}" for i in range(REFRESH_WINDOW + 1)]
    refreshed = prefixes_to_refresh(tree, queue)
    assert refreshed == queue[:REFRESH_WINDOW][::-1]


class _IdRead(Exception):
    pass


class _Unread:
    """An id iterable that raises `_IdRead` if the query reads an id from it."""

    def __iter__(self):
        return self

    def __next__(self):
        raise _IdRead


@pytest.mark.parametrize("backend", list(TREES))
def test_no_id_is_read_while_no_cached_prefix_waits_unheld(backend):
    """The frontier query answers at once while no cached node that no running request holds has a waiting
    request (each tree counts those nodes, which its invariant check recounts), and reads ids as soon as one
    has: through every event that changes the count."""
    tree = TREES[backend](CHUNK)

    def frontier():
        """None when the query read no id, else its answer over the queue a, b, c, d."""
        tree.check_invariants()
        try:
            assert tree.cached_frontier(_Unread(), REFRESH_WINDOW) == []
        except _IdRead:
            return tree.cached_frontier(["a", "b", "c", "d"], REFRESH_WINDOW)
        return None

    tree.insert("a", _prompt((1, 5)))
    tree.insert("b", _prompt((1, 6)))
    assert frontier() is None  # nothing cached
    tree.activate("a")
    tree.cache_store(tree.path_hashes("a"))
    assert frontier() is None  # cached, and held by the running request
    tree.finish("a")
    assert frontier() == ["b"]  # the shared chunk is cached, idle and waited on
    tree.activate("b")
    assert frontier() is None
    tree.deactivate("b")
    assert frontier() == ["b"]
    tree.remove("b")
    assert frontier() is None  # cached and idle, but no one waits
    tree.insert("c", _prompt((1, 7)))
    assert frontier() == ["c"]
    tree.cache_remove(tree.path_hashes("c")[:1])
    assert frontier() is None
    tree.cache_store(tree.path_hashes("c")[:1])
    tree.insert("d", _prompt((1, 7, 2)))  # a new path through the cached chunk: its new nodes uncached
    assert frontier() == ["c"]
    tree.cache_clear()
    assert frontier() is None
    assert tree.cached_frontier(_Unread(), 0) == []
    with pytest.raises(TypeError):
        tree.cached_frontier(None, REFRESH_WINDOW)  # not iterable: refused as before
