"""The compiled core stores a prompt's private chunks as one tail node; every result must stay the Python core's."""

from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_feather.cht import HashChainError, PythonTree, chunk_hashes

CHUNK = 4


def observe(tree, rids):
    """Everything a caller can read of the tree, for comparing the two cores."""
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


@pytest.mark.parametrize("core", ["python", "native"])
def test_engine_hashes_after_token_prompts_are_checked_against_every_chunk(native_cls, core):
    """Token prompts leave their tails' later chunks out of the compiled core's index; the first engine-hash
    insert indexes them, so a misplaced hash from one of them is refused by both cores alike."""
    tree = (PythonTree if core == "python" else native_cls)(CHUNK)
    tokens = list(range(40 * CHUNK))
    tree.insert("a", array("q", tokens))
    tree.insert("b", array("q", tokens[: 20 * CHUNK] + [7] * CHUNK))
    hashes = chunk_hashes(tokens, CHUNK)
    if core == "native":
        assert not tree._tails_indexed
    with pytest.raises(HashChainError):
        tree.insert_hashes("c", [hashes[0], hashes[30]])  # a tail's 30th chunk at depth 2
    with pytest.raises(HashChainError):
        tree.insert_hashes("d", [123, hashes[25]])
    tree.insert_hashes("e", hashes[:35] + [99])  # splits a's tail, now with every chunk indexed
    if core == "native":
        assert tree._tails_indexed
    tree.check_invariants()
    assert tree.path_hashes("e")[:35] == tuple(hashes[:35])


def _digests(*values):
    return array("Q", values)


def test_a_digest_collision_is_refused_where_the_chunk_is_first_indexed(native_cls):
    """What not indexing tails' later chunks gives up, reached through the tests-only `_insert_digests` (no
    real pair of prompts collides): a digest equal to a tail's later chunk is accepted (the Python core
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


# Prompts that share, extend and cut each other at every chunk: a few stems of up to 24 chunks, each prompt a
# prefix of one (or a stem with a private suffix), so tails are split at any offset, by prefixes, equal
# prompts and extensions, while their owners wait, run or are suspended.
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
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=40))
def test_native_matches_python_on_long_shared_prompts(native_cls, ops):
    trees = [PythonTree(CHUNK), native_cls(CHUNK)]
    rids: list[int] = []
    for name, arg in ops:
        if name == "insert":
            stem, cut, num_private, salt = arg
            tokens = stems[stem][:cut] + [100_000 + salt * 1000 + t for t in range(num_private)]
            for tree in trees:
                tree.insert(len(rids), array("q", tokens))
            rids.append(len(rids))
            continue
        if name == "best":
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
