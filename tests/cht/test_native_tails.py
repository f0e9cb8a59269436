"""The compiled tree stores a prompt's private chunks as one tail node; every result must stay the Python tree's."""

from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_feather.cht import HashChainError, PythonTree, chunk_hashes

CHUNK = 4


def observe(tree, rids):
    """Everything a caller can read of the tree, for comparing the two trees."""
    live = [rid for rid in rids if rid in tree]
    waiting = [rid for rid in live if tree.state(rid).name == "WAITING" and not tree.is_suspended(rid)]
    return {
        "best": tree.best(),
        "oldest": tree.oldest(),
        "num_nodes": tree.num_nodes,
        "shared_depth": tree.shared_depth,
        "states": {rid: (tree.state(rid), tree.is_suspended(rid)) for rid in live},
        "paths": {rid: tree.path_hashes(rid) for rid in live},
        "prefix_hashes": {
            rid: [tree.prefix_hash(rid, d) for d in range(1, tree.num_chunks(rid) + 1)] for rid in live
        },
        "missing": {rid: tree.num_missing(rid) for rid in live},
        "candidates": {rid: tree.candidate(rid) for rid in waiting},
        "holding": {rid: [tree.num_holding(rid, d) for d in range(tree.num_chunks(rid) + 1)] for rid in live},
        "order": tree.prefix_order(live),
        "num_cached": tree.num_cached,
        "cached": {rid: [tree.is_cached(h) for h in tree.path_hashes(rid)] for rid in live},
    }


def test_a_long_private_suffix_is_one_tail_until_shared(native_cls):
    tree = native_cls(CHUNK)
    prefix = list(range(64 * CHUNK))
    tree.insert("resident", array("q", prefix))
    tree.activate("resident")
    assert tree._num_tails == 1
    first = array("q", prefix + [10_000 + t for t in range(96 * CHUNK)])
    tree.insert("first", first)
    # The resident's own 63 chunks below depth 1 were its tail; the first prompt split all of them off.
    assert tree._num_tails == 1 and tree.num_nodes == 64 + 96
    second = array("q", list(first[: 100 * CHUNK]) + [20_000 + t for t in range(60 * CHUNK)])
    tree.insert("second", second)
    assert tree._num_tails == 2 and tree.num_nodes == 64 + 96 + 60
    tree.check_invariants()
    reference = PythonTree(CHUNK)
    for rid, tokens in (("resident", prefix), ("first", first), ("second", second)):
        reference.insert(rid, array("q", tokens))
    reference.activate("resident")
    rids = ["resident", "first", "second"]
    assert observe(tree, rids) == observe(reference, rids)
    for rid in ("second", "first", "resident"):
        (tree.remove if tree.state(rid).name == "WAITING" else tree.finish)(rid)
        tree.check_invariants()
    assert tree.num_nodes == 0 and tree._num_tails == 0


def test_a_refused_chain_through_a_tail_changes_nothing(native_cls):
    tree = native_cls(CHUNK)
    tree.insert("a", array("q", range(40 * CHUNK)))
    hashes = chunk_hashes(list(range(40 * CHUNK)), CHUNK)
    before = (tree.num_nodes, tree._num_tails, tree.num_index_entries, tree.best())
    # Matches 10 chunks of a's tail, then repeats one of a's later hashes: refused before the tail is split.
    with pytest.raises(HashChainError):
        tree.insert_hashes("b", hashes[:10] + [123, hashes[20]])
    with pytest.raises(HashChainError):
        tree.insert_hashes("c", [hashes[0], hashes[5]])
    assert (tree.num_nodes, tree._num_tails, tree.num_index_entries, tree.best()) == before
    tree.check_invariants()


@pytest.mark.parametrize("backend", ["python", "native"])
def test_engine_hashes_after_token_prompts_are_checked_against_every_chunk(native_cls, backend):
    """Token prompts leave their tails' later chunks out of the compiled tree's index; the first engine-hash
    insert indexes them, so a misplaced hash from one of them is refused by both trees alike."""
    tree = (PythonTree if backend == "python" else native_cls)(CHUNK)
    tokens = list(range(40 * CHUNK))
    tree.insert("a", array("q", tokens))
    tree.insert("b", array("q", tokens[: 20 * CHUNK] + [7] * CHUNK))
    hashes = chunk_hashes(tokens, CHUNK)
    if backend == "native":
        assert not tree._tails_indexed
    with pytest.raises(HashChainError):
        tree.insert_hashes("c", [hashes[0], hashes[30]])  # a tail's 30th chunk at depth 2
    with pytest.raises(HashChainError):
        tree.insert_hashes("d", [123, hashes[25]])
    tree.insert_hashes("e", hashes[:35] + [99])  # splits a's tail, now with every chunk indexed
    if backend == "native":
        assert tree._tails_indexed
    tree.check_invariants()
    assert tree.path_hashes("e")[:35] == tuple(hashes[:35])


def _digests(*values):
    return array("Q", values)


def test_a_digest_collision_is_refused_where_the_chunk_is_first_indexed(native_cls):
    """What not indexing tails' later chunks gives up, reached through the tests-only `_insert_digests` (no
    real pair of prompts collides): a digest equal to a tail's later chunk is accepted (the Python tree
    refuses it), then refused, with nothing changed, by the insert that would split the tail there and by the
    switch to indexing every chunk; both go through once the colliding request is gone."""
    tree = native_cls(CHUNK)
    a = [1000 + k for k in range(10)]
    tree._insert_digests("a", _digests(*a))
    tree._insert_digests("b", _digests(1, a[5]))  # a[5] is a's 6th chunk, inside its tail
    reference = PythonTree(CHUNK)
    reference.insert_hashes("a", a)
    with pytest.raises(HashChainError):
        reference.insert_hashes("b", [1, a[5]])
    tree.check_invariants()
    snapshot = (tree.num_nodes, tree._num_tails, sorted(tree.waiting_ids()), tree.best())
    with pytest.raises(HashChainError):
        tree._insert_digests("c", _digests(*a[:7], 2))  # the split would index a[5]
    with pytest.raises(HashChainError):
        tree.insert_hashes("d", [3])  # the switch would index a[5]
    assert not tree._tails_indexed
    assert (tree.num_nodes, tree._num_tails, sorted(tree.waiting_ids()), tree.best()) == snapshot
    tree.check_invariants()
    tree.remove("b")
    tree._insert_digests("c", _digests(*a[:7], 2))
    tree.insert_hashes("d", [3])
    assert tree._tails_indexed
    tree.check_invariants()
    assert tree.path_hashes("c") == (*a[:7], 2)


def test_a_store_into_a_tail_splits_it_where_the_cached_run_ends(native_cls):
    """The engine reports a prefix after the request holding it was enqueued: the cached chunks leave the
    tail as ordinary nodes (and come back to coverage on both trees alike); an eviction changes no node."""
    tree, reference = native_cls(CHUNK), PythonTree(CHUNK)
    tokens = list(range(40 * CHUNK))
    hashes = chunk_hashes(tokens, CHUNK)
    for t in (tree, reference):
        t.insert("a", array("q", tokens))
        t.insert("stranger", [7] * CHUNK, arrival=-1.0)
    assert tree._num_tails == 1 and not tree._tails_indexed
    assert tree.cache_store(hashes[:1]) == reference.cache_store(hashes[:1]) == 1
    assert tree._tails_indexed, "the first store indexes every tail chunk"
    assert tree.cache_store(hashes[1:15], hashes[0]) == reference.cache_store(hashes[1:15], hashes[0]) == 14
    assert tree._num_tails == 1 and tree.num_nodes == reference.num_nodes == 41
    assert tree.best() == reference.best() and tree.best().depth_cached == 15
    tree.check_invariants()
    # An eviction inside the cached run, then a shorter store below what is left of it.
    for t in (tree, reference):
        t.cache_remove([hashes[10]])
        t.cache_store(hashes[10:12], hashes[9])
    assert tree.best() == reference.best() and tree.best().depth_cached == 12
    tree.check_invariants()
    # The whole rest of the tail: no tail is left.
    for t in (tree, reference):
        t.cache_store(hashes[12:], hashes[11])
    assert tree._num_tails == 0 and tree.best() == reference.best() and tree.best().num_missing == 0
    tree.check_invariants()
    rids = ["a", "stranger"]
    assert observe(tree, rids) == observe(reference, rids)
    for t in (tree, reference):
        t.cache_clear()
    assert observe(tree, rids) == observe(reference, rids)
    tree.check_invariants()


def test_an_insert_below_a_cached_prefix_starts_its_tail_below_it(native_cls):
    tree, reference = native_cls(CHUNK), PythonTree(CHUNK)
    tokens = list(range(30 * CHUNK))
    hashes = chunk_hashes(tokens, CHUNK)
    for t in (tree, reference):
        t.cache_store(hashes[:12])
        t.insert("a", array("q", tokens))
    assert tree._num_tails == 1 and tree.num_nodes == 30
    assert tree.best() == reference.best() and tree.best().depth_cached == 12
    tree.check_invariants()
    for t in (tree, reference):
        t.cache_remove([hashes[0]])
    assert tree.best() == reference.best() and tree.best().depth_cached == 0
    tree.check_invariants()


# Prompts that share, extend and cut each other at every chunk: a few stems of up to 24 chunks, each prompt a
# prefix of one (or a stem with a private suffix), so tails are split at any offset, by prefixes, equal
# prompts and extensions, while their owners wait, run or are suspended; the cache tier stores, evicts and
# clears chains of the same prompts (from their start or below a cached prefix), so stores split tails at any
# offset too, and inserts start their tails below a cached prefix.
stems = [[s * 1000 + t for t in range(24 * CHUNK)] for s in range(3)]
prompt = st.tuples(
    st.integers(0, 2), st.integers(1, 24 * CHUNK), st.integers(0, 12 * CHUNK), st.integers(0, 9)
)
op = st.one_of(
    st.tuples(st.just("insert"), prompt),
    st.tuples(
        st.sampled_from(["best", "activate", "finish", "deactivate", "remove", "suspend", "resume"]),
        st.integers(0, 50),
    ),
    st.tuples(st.just("cache_store"), st.tuples(prompt, st.just(0) | st.integers(0, 40), st.integers(1, 40))),
    st.tuples(
        st.just("cache_store_held"),
        st.tuples(st.integers(0, 50), st.just(0) | st.integers(0, 40), st.integers(1, 40)),
    ),
    st.tuples(st.just("cache_remove"), st.tuples(prompt, st.integers(0, 40))),
    st.tuples(st.just("cache_clear"), st.none()),
)


def prompt_tokens(stem, cut, num_private, salt):
    return stems[stem][:cut] + [100_000 + salt * 1000 + t for t in range(num_private)]


def same_outcome(trees, method, *args):
    """`tree.method(*args)` on each tree: equal results, or refused by both."""
    outcomes = []
    for tree in trees:
        try:
            outcomes.append(("ok", getattr(tree, method)(*args)))
        except HashChainError:
            outcomes.append(("refused", None))
    assert outcomes[0] == outcomes[1], outcomes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=40))
def test_native_matches_python_on_long_shared_prompts(native_cls, ops):
    trees = [PythonTree(CHUNK), native_cls(CHUNK)]
    rids: list[int] = []
    for name, arg in ops:
        if name == "insert":
            tokens = prompt_tokens(*arg)
            for tree in trees:
                tree.insert(len(rids), array("q", tokens))
            rids.append(len(rids))
        elif name in ("cache_store", "cache_store_held"):
            spec, start, length = arg
            if name == "cache_store":
                hashes = chunk_hashes(prompt_tokens(*spec), CHUNK)
            else:  # a tracked request's prompt (a tail's chunks, most of the time)
                live = [rid for rid in rids if rid in trees[0]]
                if not live:
                    continue
                hashes = list(trees[0].path_hashes(live[spec % len(live)]))
            start %= len(hashes)
            chain, parent = hashes[start : start + length], hashes[start - 1] if start else None
            same_outcome(trees, "cache_store", chain, parent)
        elif name == "cache_remove":
            spec, at = arg
            hashes = chunk_hashes(prompt_tokens(*spec), CHUNK)
            same_outcome(trees, "cache_remove", [hashes[at % len(hashes)], 12345])
        elif name == "cache_clear":
            for tree in trees:
                tree.cache_clear()
        elif name == "best":
            candidate = trees[0].best()
            if candidate is not None:
                for tree in trees:
                    tree.activate(candidate.request_id)
        elif rids:
            rid = rids[arg % len(rids)]
            state = trees[0].state(rid)
            allowed = {
                "activate": state is not None and state.name == "WAITING",
                "remove": state is not None and state.name == "WAITING",
                "finish": state is not None and state.name == "ACTIVE",
                "deactivate": state is not None and state.name == "ACTIVE",
                "suspend": state is not None and state.name == "WAITING" and not trees[0].is_suspended(rid),
                "resume": state is not None and trees[0].is_suspended(rid),
            }[name]
            if allowed:
                for tree in trees:
                    getattr(tree, name)(rid)
        trees[1].check_invariants()
        assert observe(trees[1], rids) == observe(trees[0], rids)
