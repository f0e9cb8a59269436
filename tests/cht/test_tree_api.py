"""Both trees hold one API: the same public methods and signatures, the same results and errors on the same
operation streams (every public method, the cache tier included), and the same CHT error for each bad input."""

import ast
import gc
import inspect
import math
import random
import sys
from array import array
from dataclasses import FrozenInstanceError

import numpy as np
import pytest

from sglang_feather.cht import (
    DuplicateRequest,
    EmptyPrompt,
    HashChainError,
    InvalidArrival,
    InvalidTokens,
    InvalidTransition,
    PythonTree,
    RequestState,
    TakenPicks,
    UnknownRequest,
    chunk_hashes,
)
from sglang_feather.cht.errors import InvalidDepth, InvalidNamespace

# ------------------------------------------------------------------------------------------ the method set


def public_names(cls):
    return {name for name in dir(cls) if not name.startswith("_")}


def parameters(function):
    """(name, kind, default) of each parameter: from `inspect` for Python methods, from the signature text
    nanobind records for the compiled tree's own methods."""
    try:
        return [(p.name, p.kind.name, p.default) for p in inspect.signature(function).parameters.values()]
    except ValueError:
        text, _, defaults = function.__nb_signature__[0]
    for index in range(len(defaults or ())):
        text = text.replace(f"\\{index}", f"_default_{index}")
    node = ast.parse(text + ": pass").body[0].args
    positional = [(a.arg, "POSITIONAL_OR_KEYWORD") for a in node.args]
    keyword = [(a.arg, "KEYWORD_ONLY") for a in node.kwonlyargs]
    given = [None] * (len(node.args) - len(node.defaults)) + node.defaults + node.kw_defaults
    found = []
    for (name, kind), default in zip(positional + keyword, given, strict=True):
        value = inspect.Parameter.empty if default is None else defaults[int(default.id.rsplit("_", 1)[1])]
        found.append((name, kind, value))
    return found


def test_both_trees_have_the_same_public_methods_and_signatures(native_cls):
    names = public_names(PythonTree)
    assert names == public_names(native_cls)
    for name in sorted(names):
        ours, theirs = getattr(PythonTree, name), getattr(native_cls, name)
        assert isinstance(ours, property) == isinstance(theirs, property), name
        if callable(ours) and not isinstance(ours, property):
            assert parameters(ours) == parameters(theirs), name
    assert PythonTree(4).chunk_size == native_cls(4).chunk_size == 4


# ------------------------------------------------------------------------------------------ operation streams

QUERIES = ("num_active", "num_waiting", "num_suspended", "num_nodes", "num_cached", "shared_depth")
"""Properties compared after every step (`num_index_entries` is each tree's own diagnostic: only its type)."""

IDS = [None, 0, 1, 2, 3, 4, "a", "b", ("t", 1), 2.5, "c", "d", "e", "f", "g", "h"]


class Stream:
    """One seeded stream of calls, with arguments valid and not, drawn from a few prompt families."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        bases = [[self.rng.randrange(50) for _ in range(24)] for _ in range(3)]
        self.prompts = [
            base[: self.rng.randrange(1, 24)] + [self.rng.randrange(50) for _ in range(self.rng.randrange(4))]
            for base in bases
            for _ in range(4)
        ]
        self.chains = [chunk_hashes(p, 4) for p in self.prompts]

    def rid(self):
        return self.rng.choice(IDS)

    def depth(self):
        return self.rng.choice([-1, 0, 1, 2, 3, 5, 8, 40, 1.5, "2", None])

    def tokens(self):
        prompt = self.rng.choice(self.prompts)
        form = self.rng.randrange(6)
        if form == 0:
            return np.array(prompt, dtype=self.rng.choice([np.int32, np.uint16, np.int64]))
        if form == 1:
            return array("I", prompt)
        if form == 2:
            return self.rng.choice([[], None, [-1], [2**32], ["x"], 7, prompt + [1.5]])
        return list(prompt)

    def chain(self):
        chain = self.rng.choice(self.chains)
        start = self.rng.randrange(len(chain))
        end = self.rng.randrange(start, len(chain)) + 1
        return chain[start:end], chain[start - 1] if start else None

    def call(self):
        """(method name, args, kwargs) of one call."""
        rng, rid = self.rng, self.rid()
        choice = rng.randrange(30)
        if choice < 6:
            kwargs = {}
            if rng.random() < 0.2:
                kwargs["namespace"] = rng.choice(["lora", 5, b"x"])
            if rng.random() < 0.3:
                kwargs["arrival"] = rng.choice([1.0, 3.5, -2.0, math.inf, math.nan, 10**400, "soon"])
            return "insert", (rid, self.tokens()), kwargs
        if choice < 8:
            hashes = rng.choice(self.chains)[: rng.randrange(0, 8)]
            return "insert_hashes", (rid, rng.choice([hashes, hashes, None, [-3]])), {}
        if choice < 15:
            name = rng.choice(["activate", "deactivate", "finish", "remove", "discard", "suspend", "resume"])
            return name, (rid,), {}
        if choice < 19:
            name = rng.choice(
                ["state", "is_suspended", "num_chunks", "path_hashes", "num_missing", "candidate"]
            )
            return name, (rid,), {}
        if choice == 19:
            return rng.choice(["prefix_hash", "num_holding", "num_waiting_holding"]), (rid, self.depth()), {}
        if choice == 20:
            return "shares_prefix", (rid, self.rid(), self.depth()), {}
        if choice == 21:
            if rng.random() < 0.5:
                return "cached_frontier", (rng.sample(IDS, rng.randrange(8)), rng.randrange(8)), {}
            return "prefix_order", (rng.sample(IDS, rng.randrange(4)),), {}
        if choice < 25:
            hashes, parent = self.chain()
            if rng.random() < 0.1:
                parent = rng.choice([12345, -1, "p"])
            return "cache_store", (hashes, parent), {}
        if choice < 27:
            hashes, _ = self.chain()
            return "cache_remove", (rng.choice([hashes, hashes[:1], [7, "x"], None]),), {}
        if choice == 27:
            hashes, _ = self.chain()
            return "is_cached", (rng.choice([*hashes, -1, "x", None]),), {}
        return rng.choice(["best", "oldest", "oldest_stranger", "resume_all", "cache_clear"]), (), {}


def outcome(tree, name, args, kwargs):
    try:
        result = getattr(tree, name)(*args, **kwargs)
    except Exception as err:  # compared by class: each tree must raise the same one
        return ("error", type(err))
    if inspect.isgenerator(result) or name in ("waiting_ids", "active_ids"):
        return ("ok", list(result))
    return ("ok", result)


def observe(tree):
    assert isinstance(tree.num_index_entries, int)
    return (
        len(tree),
        [getattr(tree, name) for name in QUERIES],
        sorted(map(repr, tree.waiting_ids())),
        sorted(map(repr, tree.active_ids())),
        tree.best(),
        tree.oldest(),
        tree.oldest_stranger(),
        [rid in tree for rid in IDS],
    )


@pytest.mark.parametrize("seed", range(12))
def test_both_trees_agree_on_every_call_of_a_stream(native_cls, seed):
    stream = Stream(seed)
    python, native = PythonTree(4), native_cls(4)
    counts = {}
    for step in range(400):
        name, args, kwargs = stream.call()
        got = outcome(python, name, args, kwargs)
        assert outcome(native, name, args, kwargs) == got, (step, name, args, kwargs)
        counts[got[0]] = counts.get(got[0], 0) + 1
        assert observe(native) == observe(python), (step, name, args, kwargs)
        if step % 50 == 49:
            python.check_invariants()
            native.check_invariants()
    assert counts.get("ok", 0) > 100 and counts.get("error", 0) > 20


def test_a_none_request_id_is_an_id_like_any_other(tree_cls):
    tree = tree_cls(4)
    assert tree.insert(None, list(range(10))) == 3
    assert tree.insert("x", list(range(8)) + [99]) == 3
    assert None in tree and tree.state(None) is not None
    assert tree.best().request_id is None and tree.candidate(None).num_chunks == 3
    assert tree.shares_prefix(None, "x", 2) and not tree.shares_prefix(None, "x", 3)
    assert tree.prefix_order(["x", None]) == [None, "x"] and tree.oldest() is None
    tree.suspend(None)
    tree.resume(None)
    tree.activate(None)
    assert tree.num_holding("x", 2) == 1 and list(tree.active_ids()) == [None]
    tree.deactivate(None)
    assert tree.discard(None) and None not in tree
    tree.check_invariants()


# ------------------------------------------------------------------------------------------ bad input


def snapshot(tree):
    return (len(tree), sorted(map(repr, tree.waiting_ids())), tree.num_cached, tree.num_nodes, tree.best())


CHAIN = chunk_hashes([1, 2, 3, 4, 5], 2)

BAD_INPUT = {
    "num_holding above the request's chunks": (lambda t: t.num_holding("w", 4), InvalidDepth),
    "num_holding far above": (lambda t: t.num_holding("w", 10**6), InvalidDepth),
    "num_holding negative": (lambda t: t.num_holding("w", -1), InvalidDepth),
    "num_holding not an int": (lambda t: t.num_holding("w", 1.0), InvalidDepth),
    "num_holding a str": (lambda t: t.num_holding("w", "1"), InvalidDepth),
    "num_waiting_holding above": (lambda t: t.num_waiting_holding("w", 4), InvalidDepth),
    "num_waiting_holding negative": (lambda t: t.num_waiting_holding("w", -1), InvalidDepth),
    "shares_prefix negative": (lambda t: t.shares_prefix("w", "a", -1), InvalidDepth),
    "shares_prefix not an int": (lambda t: t.shares_prefix("w", "a", 1.5), InvalidDepth),
    "shares_prefix None": (lambda t: t.shares_prefix("w", "a", None), InvalidDepth),
    "shares_prefix unknown other": (lambda t: t.shares_prefix("w", "nope", 1), UnknownRequest),
    "prefix_hash 0": (lambda t: t.prefix_hash("w", 0), InvalidDepth),
    "prefix_hash above": (lambda t: t.prefix_hash("w", 4), InvalidDepth),
    "prefix_hash a float": (lambda t: t.prefix_hash("w", 1.0), InvalidDepth),
    "arrival 10**400 (insert)": (lambda t: t.insert("e", [9], arrival=10**400), InvalidArrival),
    "arrival 10**400 (insert_hashes)": (
        lambda t: t.insert_hashes("e", [77], arrival=-(10**400)),
        InvalidArrival,
    ),
    "arrival NaN": (lambda t: t.insert("e", [9], arrival=math.nan), InvalidArrival),
    "arrival a str": (lambda t: t.insert("e", [9], arrival="soon"), InvalidArrival),
    "namespace an int": (lambda t: t.insert("e", [9], namespace=5), InvalidNamespace),
    "namespace bytes": (lambda t: t.insert("e", [9], namespace=b"lora"), InvalidNamespace),
    "tokens None": (lambda t: t.insert("e", None), InvalidTokens),
    "tokens an int": (lambda t: t.insert("e", 7), InvalidTokens),
    "tokens a generator": (lambda t: t.insert("e", (i for i in range(3))), InvalidTokens),
    "tokens negative": (lambda t: t.insert("e", [-1]), InvalidTokens),
    "tokens above 2**32": (lambda t: t.insert("e", np.array([2**32])), InvalidTokens),
    "tokens of floats": (lambda t: t.insert("e", [1.5]), InvalidTokens),
    "tokens empty": (lambda t: t.insert("e", np.array([], dtype=np.int32)), EmptyPrompt),
    "hashes None": (lambda t: t.insert_hashes("e", None), HashChainError),
    "hashes empty": (lambda t: t.insert_hashes("e", []), EmptyPrompt),
    "duplicate before a bad namespace": (lambda t: t.insert("w", None, namespace=5), DuplicateRequest),
    "namespace before arrival": (lambda t: t.insert("e", [9], namespace=5, arrival="x"), InvalidNamespace),
    "arrival before tokens": (lambda t: t.insert("e", None, arrival=math.nan), InvalidArrival),
    "arrival before an empty buffer": (lambda t: t.insert("e", np.array([]), arrival="x"), InvalidArrival),
    "arrival before hashes": (lambda t: t.insert_hashes("e", None, arrival="x"), InvalidArrival),
    "unknown request": (lambda t: t.num_missing("nope"), UnknownRequest),
    "unknown request in prefix_order": (lambda t: t.prefix_order(["w", "nope"]), UnknownRequest),
    "wrong state": (lambda t: t.finish("w"), InvalidTransition),
    "resume of a request not suspended": (lambda t: t.resume("w"), InvalidTransition),
    "cache_store None": (lambda t: t.cache_store(None), HashChainError),
    "cache_store negative hash": (lambda t: t.cache_store([-1]), HashChainError),
    "cache_store a str parent": (lambda t: t.cache_store(CHAIN[1:], "p"), HashChainError),
    "cache_store a repeat": (lambda t: t.cache_store([5, 6, 5]), HashChainError),
    "cache_store under another parent": (lambda t: t.cache_store(CHAIN[1:2], None), HashChainError),
    "cache_remove None": (lambda t: t.cache_remove(None), HashChainError),
    "cache_remove an int": (lambda t: t.cache_remove(5), HashChainError),
    "cache_remove an unhashable item": (lambda t: t.cache_remove([[1]]), TypeError),
    "unhashable request id": (lambda t: t.insert(["w"], [1]), TypeError),
    "prefix_order of None": (lambda t: t.prefix_order(None), TypeError),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_raises_the_same_error_on_both_trees_and_changes_nothing(tree_cls, case):
    call, error = BAD_INPUT[case]
    tree = tree_cls(chunk_size=2)
    tree.insert("w", [1, 2, 3, 4, 5])
    tree.insert("a", [1, 2, 7])
    tree.activate("a")
    tree.cache_store(CHAIN[:1])
    before = snapshot(tree)
    with pytest.raises(error) as raised:
        call(tree)
    assert type(raised.value) is error or error is TypeError
    tree.check_invariants()
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "chunk_size, error",
    [
        (0, ValueError),
        (-1, ValueError),
        (2**31, ValueError),
        (2**70, ValueError),
        ("4", TypeError),
        (4.0, TypeError),
        (None, TypeError),
    ],
)
def test_bad_chunk_sizes_are_refused_alike(tree_cls, chunk_size, error):
    with pytest.raises(error):
        tree_cls(chunk_size)


def test_depths_at_the_edges_are_answered_alike(tree_cls):
    tree = tree_cls(chunk_size=2)
    tree.insert("w", [1, 2, 3, 4, 5])
    tree.insert("a", [1, 2, 7])
    tree.activate("a")
    assert [tree.num_holding("w", d) for d in range(4)] == [1, 1, 0, 0]
    tree.insert("v", [1, 2, 3, 9])
    assert [tree.num_waiting_holding("w", d) for d in range(4)] == [2, 2, 1, 1]
    tree.remove("v")
    assert [tree.shares_prefix("w", "a", d) for d in (0, 1, 2, 3, 10**30)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert tree.candidate("w").depth_running == 1


def test_take_picks_activates_all_but_the_last_and_skips_prefixes_that_run_uncached(tree_cls):
    tree = tree_cls(chunk_size=2)
    tree.insert("run", [1, 1, 2, 2, 9, 9])
    tree.activate("run")  # chunks (1 1)(2 2) run, none cached: a waiting sharer would compute them twice
    tree.insert("sharer", [1, 1, 2, 2, 3, 3])
    tree.insert("a", [5, 5, 6])
    tree.insert("b", [7, 7, 8])
    taken = tree.take_picks(2, skip_running_uncached=True)
    assert [c.request_id for c in taken.candidates] == ["a", "b"]
    assert taken.skipped == ["sharer"] and taken.skip_ends == [1, 1] and not taken.is_exhausted
    assert tree.state("a") is RequestState.ACTIVE and tree.state("b") is RequestState.WAITING
    assert tree.is_suspended("sharer")
    tree.resume_all()
    tree.cache_store(tree.path_hashes("run")[:2])  # now cached: the sharer is no longer in flight
    taken = tree.take_picks(5, skip_running_uncached=True)
    assert [c.request_id for c in taken.candidates] == ["sharer", "b"] and taken.is_exhausted
    assert tree.num_waiting == 0, "exhausted: the last pick was activated too"
    assert tree.take_picks(3, skip_running_uncached=False) == TakenPicks([], [], [], True)


def test_compiled_candidates_hold_their_request_ids_and_values_once(native_cls):
    """The compiled tree writes a `Candidate`'s fields straight into its slots: each holds one reference to
    its request id and values, so building and dropping candidates leaves every reference count as it was."""
    rid = "request-" + str(object())  # a fresh string: no other code holds it
    tree, twin = native_cls(chunk_size=2), PythonTree(chunk_size=2)
    for each in (tree, twin):
        each.insert(rid, [1, 1, 2, 2, 3])
        each.insert("other", [1, 1, 4, 4])
        each.activate("other")
    refs = sys.getrefcount(rid)
    candidates = [tree.candidate(rid) for _ in range(1000)]
    assert sys.getrefcount(rid) == refs + 1000
    assert candidates[0] == twin.candidate(rid) and hash(candidates[0]) == hash(candidates[-1])
    assert type(candidates[0]) is type(twin.candidate(rid))
    with pytest.raises(FrozenInstanceError):
        candidates[0].num_missing = 0
    del candidates
    gc.collect()
    assert sys.getrefcount(rid) == refs


def test_take_picks_ends_at_the_pick_that_reaches_max_missing(tree_cls):
    tree = tree_cls(chunk_size=2)
    for rid, prompt in (("a", [1, 1, 2]), ("b", [3, 3, 4, 4, 5]), ("c", [6, 6, 7])):
        tree.insert(rid, prompt)  # missing chunks: a 2, b 3, c 2 (nothing runs or is cached)
    taken = tree.take_picks(3, skip_running_uncached=False, max_missing=4)
    assert [c.request_id for c in taken.candidates] == ["a", "b"] and not taken.is_exhausted
    assert [c.num_missing for c in taken.candidates] == [2, 3], "2 + 3 reaches 4: b is the last pick"
    assert tree.state("a") is RequestState.ACTIVE and tree.state("b") is RequestState.WAITING
    assert [c.request_id for c in tree.take_picks(3, False, max_missing=1).candidates] == ["b"]


def test_take_picks_takes_a_given_first_request_or_suspends_it_alone(tree_cls):
    tree = tree_cls(chunk_size=2)
    tree.insert("run", [1, 1, 2, 2, 9, 9])
    tree.activate("run")
    tree.insert("sharer", [1, 1, 2, 2, 3, 3])  # its prefix runs uncached: in flight
    tree.insert("a", [5, 5, 6])
    tree.insert("b", [7, 7, 8])
    taken = tree.take_picks(3, skip_running_uncached=True, first="sharer")
    assert taken.candidates == [] and taken.skipped == ["sharer"] and not taken.is_exhausted
    assert tree.is_suspended("sharer") and tree.num_active == 1
    expected = tree.candidate("b")
    taken = tree.take_picks(3, skip_running_uncached=True, first="b")
    assert taken.candidates[0] == expected and [c.request_id for c in taken.candidates] == ["b", "a"]
    assert taken.skip_ends == [0, 0] and taken.is_exhausted
    for rid, error in (("sharer", "already suspended"), ("run", "active")):
        with pytest.raises(InvalidTransition, match=error):
            tree.take_picks(1, skip_running_uncached=False, first=rid)


@pytest.mark.parametrize(
    ("max_picks", "max_missing", "error", "name"),
    [
        (-1, None, ValueError, "max_picks"),
        (1.5, None, TypeError, "max_picks"),
        ("2", None, TypeError, "max_picks"),
        (2, 0, ValueError, "max_missing"),
        (2, 1.5, TypeError, "max_missing"),
    ],
)
def test_take_picks_refuses_a_bad_count_and_changes_nothing(tree_cls, max_picks, max_missing, error, name):
    tree = tree_cls(chunk_size=2)
    tree.insert("a", [1, 2, 3])
    with pytest.raises(error, match=name):
        tree.take_picks(max_picks, skip_running_uncached=False, max_missing=max_missing)
    assert tree.state("a") is RequestState.WAITING and tree.best().request_id == "a"
