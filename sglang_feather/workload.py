"""The shared-prefix workload every tool runs: prefix groups, their sizes and arrival order, and their tokens."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import xxhash

from sglang_feather.options import (
    ConfigError,
    Option,
    add_flags,
    check_options,
    declared,
    given_flags,
    integer,
    non_negative_int,
    non_negative_number,
    option,
    parse_float,
    parse_float_or_none,
    parse_int,
    parse_int_or_none,
    positive_int,
    positive_int_or_none,
    positive_number_or_none,
)

# How it works.
#
# A spec names `num_requests` conversations split over `num_groups` groups; every conversation of group g
# starts with the group's prefix (SGLang bench_serving's "system prompt") and asks `num_turns` questions,
# each answered with `output_len` tokens. Group sizes come from a popularity registry (near-equal, or Zipf
# by rank); the first turns arrive in an order from an order registry (groups contiguous, round-robin
# interleaved, or a seeded random permutation), optionally spread by Poisson arrivals at `rate`. Turn t of a
# conversation holds the prefix and every earlier question and answer, and follows turn t-1. Every run of
# tokens is a `Segment` named by a key (seed, group, conversation, turn): its tokens are a pure function of
# the key, so equal keys give equal tokens and prompts share exactly their common segments, whatever the
# consumer materialises (the simulator, the CHT benchmarks, a live server's client).

VOCAB_SIZE = 128_000
"""Token ids are drawn from [1, VOCAB_SIZE) unless a consumer narrows the range (a tiny model's vocabulary)."""


class WorkloadError(ConfigError):
    """A workload parameter is out of range; the message names it."""


@dataclass(frozen=True)
class Segment:
    """A run of pseudo-random tokens named by `key`: equal keys give equal tokens, so prompts share them."""

    key: str
    num_tokens: int


def segment_tokens(key: str, num_tokens: int, *, low: int = 1, high: int = VOCAB_SIZE) -> np.ndarray:
    """`num_tokens` int32 ids in [low, high) seeded by the key; a shorter length gives a prefix of a longer."""
    rng = np.random.default_rng(xxhash.xxh64_intdigest(key.encode()))
    return rng.integers(low, high, size=num_tokens, dtype=np.int32)


def concat_tokens(segments: tuple[Segment, ...], *, low: int = 1, high: int = VOCAB_SIZE) -> np.ndarray:
    parts = [segment_tokens(s.key, s.num_tokens, low=low, high=high) for s in segments]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def zipf_weights(num_ranks: int, alpha: float) -> np.ndarray:
    """Zipf popularity by rank (rank 1 first): probabilities proportional to rank**-alpha."""
    weights = 1.0 / np.arange(1, num_ranks + 1) ** alpha
    return weights / weights.sum()


def poisson_arrivals(rng: np.random.Generator, num_arrivals: int, rate: float) -> np.ndarray:
    """Arrival times (s) of a Poisson process at `rate` per second, starting after one gap."""
    return np.cumsum(rng.exponential(1.0 / rate, size=num_arrivals))


def _uniform_sizes(num_requests: int, num_groups: int, zipf_alpha: float) -> np.ndarray:
    sizes = np.full(num_groups, num_requests // num_groups, dtype=np.int64)
    sizes[: num_requests % num_groups] += 1
    return sizes


def _zipf_sizes(num_requests: int, num_groups: int, zipf_alpha: float) -> np.ndarray:
    sizes = np.maximum(1, np.floor(zipf_weights(num_groups, zipf_alpha) * num_requests)).astype(np.int64)
    sizes[0] += num_requests - sizes.sum()
    return sizes


POPULARITY: dict[str, Callable[[int, int, float], np.ndarray]] = {
    "uniform": _uniform_sizes,
    "zipf": _zipf_sizes,
}
"""Popularity name -> function(num_requests, num_groups, zipf_alpha) -> requests per group.

uniform: near-equal (the first num_requests % num_groups groups get one more); zipf: group of rank r gets
floor(num_requests * r**-alpha / sum) (at least one), the rounding remainder going to the most popular group.
bench_serving's zipf draws each request's group at random with the same probabilities instead."""


def _contiguous(groups: np.ndarray, members: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.arange(len(groups))


def _interleaved(groups: np.ndarray, members: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.lexsort((groups, members))


def _random(groups: np.ndarray, members: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(len(groups))


ORDERS: dict[str, Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]] = {
    "contiguous": _contiguous,
    "interleaved": _interleaved,
    "random": _random,
}
"""Order name -> function(group of each conversation, its index in the group, rng) -> arrival permutation
of the conversations (listed group by group): groups one after another; round-robin over the groups (what
FCFS admission of mixed arrivals sees); a seeded random permutation (bench_serving's default shuffle)."""


@dataclass(frozen=True)
class WorkloadRequest:
    """One turn of one conversation; `follows` is the previous turn's rid (it arrives after that finishes)."""

    rid: str
    group: int
    member: int
    """Index of the conversation within its group."""
    turn: int
    segments: tuple[Segment, ...]
    output_len: int
    arrival_s: float = 0.0
    follows: str | None = None
    answer_key: str | None = None
    """Segment key of this turn's generated tokens, which later turns hold in their prompts."""

    @property
    def prompt_len(self) -> int:
        return sum(s.num_tokens for s in self.segments)


def _integer(default: int, metavar: str, help: str, check: Callable[[Any], str | None] = positive_int) -> Any:
    return option(default, metavar=metavar, help=help, parse=parse_int, check=check)


def _longest(what: str) -> Any:
    """A length's maximum: with it, each one is drawn uniformly from `<what>_len` up to it."""
    return option(
        None,
        metavar="TOKENS",
        help=f"draw each {what}'s length uniformly from {what}_len..this; none = {what}_len each",
        parse=parse_int_or_none,
        check=positive_int_or_none,
    )


def _name(default: str, help: str, registry: Mapping[str, Any]) -> Any:
    return option(default, metavar="NAME", help=help, parse=str, choices=lambda: tuple(registry))


@dataclass(frozen=True)
class SharedPrefixSpec:
    """`num_requests` conversations over `num_groups` groups sharing a `prefix_len`-token prefix each."""

    num_groups: int = _integer(8, "N", "prefix groups")
    num_requests: int = _integer(800, "N", "conversations (first turns)")
    prefix_len: int = _integer(4096, "TOKENS", "shared prefix (system prompt) per group", non_negative_int)
    question_len: int = _integer(20, "TOKENS", "unique question per turn", non_negative_int)
    output_len: int = _integer(50, "TOKENS", "output per turn (the shortest, with output_len_max)")
    question_len_max: int | None = _longest("question")
    output_len_max: int | None = _longest("output")
    popularity: str = _name("uniform", "group sizes", POPULARITY)
    zipf_alpha: float = option(
        1.0,
        metavar="ALPHA",
        help="Zipf exponent of group sizes",
        parse=parse_float,
        check=non_negative_number,
    )
    order: str = _name("random", "arrival order of first turns", ORDERS)
    num_turns: int = _integer(1, "N", "turns per conversation")
    rate: float | None = option(
        None,
        metavar="REQ/S",
        help="Poisson arrivals of first turns at this many requests/s; none = all at t=0 (offline)",
        parse=parse_float_or_none,
        check=positive_number_or_none,
    )
    seed: int = _integer(0, "N", "seed of tokens and order", integer)

    def __post_init__(self) -> None:
        check_options(self, WorkloadError)
        if self.num_groups > self.num_requests:
            raise WorkloadError(
                "num_groups", f"({self.num_groups}) exceeds num_requests ({self.num_requests})"
            )
        if self.prefix_len + self.question_len < 1:
            raise WorkloadError("prefix_len", "and question_len are both 0: a prompt must be non-empty")
        for name, low in (("question_len_max", self.question_len), ("output_len_max", self.output_len)):
            high = getattr(self, name)
            if high is not None and high < low:
                raise WorkloadError(name, f"({high}) is below its minimum ({low})")

    @classmethod
    def per_group(cls, num_groups: int, prompts_per_group: int, **knobs) -> SharedPrefixSpec:
        """`prompts_per_group` conversations in each of `num_groups` groups (bench_serving's knobs)."""
        return cls(num_groups=num_groups, num_requests=num_groups * prompts_per_group, **knobs)

    def group_sizes(self) -> np.ndarray:
        return POPULARITY[self.popularity](self.num_requests, self.num_groups, self.zipf_alpha)

    def prefix_key(self, group: int) -> str:
        return f"s{self.seed}/sys{group}"

    def prefix_tokens(self, group: int, *, low: int = 1, high: int = VOCAB_SIZE) -> np.ndarray:
        return segment_tokens(self.prefix_key(group), self.prefix_len, low=low, high=high)

    def arrival_groups(self) -> np.ndarray:
        """Group of each conversation in arrival order."""
        return np.array([r.group for r in self.requests() if r.turn == 0], dtype=np.int64)

    def requests(self) -> list[WorkloadRequest]:
        """Every turn: first turns in arrival order, then later turns conversation by conversation."""
        rng = np.random.default_rng(self.seed)
        lengths = _Lengths(self)
        sizes = self.group_sizes()
        groups = np.repeat(np.arange(self.num_groups), sizes)
        members = np.concatenate([np.arange(n) for n in sizes])
        firsts, rest = [], []
        for g, j in zip(groups.tolist(), members.tolist(), strict=True):
            turns = self._conversation(g, j, lengths)
            firsts.append(turns[0])
            rest.extend(turns[1:])
        firsts = [firsts[i] for i in ORDERS[self.order](groups, members, rng)]
        if self.rate is not None:
            times = poisson_arrivals(rng, len(firsts), self.rate)
            firsts = [replace(r, arrival_s=float(t)) for r, t in zip(firsts, times, strict=True)]
        return firsts + rest

    def _conversation(self, g: int, j: int, lengths: _Lengths) -> list[WorkloadRequest]:
        tag = f"s{self.seed}/"
        history = (Segment(self.prefix_key(g), self.prefix_len),) if self.prefix_len else ()
        out: list[WorkloadRequest] = []
        for t in range(self.num_turns):
            suffix = "" if t == 0 else f".t{t}"
            question_len, output_len = lengths.next()
            if question_len:
                history = (*history, Segment(f"{tag}q{g}.{j}{suffix}", question_len))
            rid = f"g{g}-{j}" if self.num_turns == 1 else f"g{g}-{j}-t{t}"
            answer = f"{tag}a{g}.{j}{suffix}" if t + 1 < self.num_turns else None
            out.append(
                WorkloadRequest(
                    rid,
                    g,
                    j,
                    t,
                    history,
                    output_len,
                    follows=out[-1].rid if out else None,
                    answer_key=answer,
                )
            )
            if answer is not None:
                history = (*history, Segment(answer, output_len))
        return out

    def prompts(self, *, low: int = 1, high: int = VOCAB_SIZE) -> list[np.ndarray]:
        """Token ids of the first turns in arrival order (the prompts of a one-turn workload)."""
        return [concat_tokens(r.segments, low=low, high=high) for r in self.requests() if r.turn == 0]


class _Lengths:
    """Each turn's question and output lengths: the spec's fixed ones, or uniform draws up to their maxima from
    a generator of their own (the arrival order and tokens are those of the fixed-length spec)."""

    def __init__(self, spec: SharedPrefixSpec) -> None:
        self._spec = spec
        self._rng = np.random.default_rng((spec.seed, 1))

    def next(self) -> tuple[int, int]:
        spec = self._spec
        return self._draw(spec.question_len, spec.question_len_max), self._draw(
            spec.output_len, spec.output_len_max
        )

    def _draw(self, low: int, high: int | None) -> int:
        return low if high is None else int(self._rng.integers(low, high + 1))


FLAGS = declared(SharedPrefixSpec, prefix="--")
"""The spec's fields as command-line flags, `num_groups` as `--num-groups`."""

SHAPE_FIELDS = ("num_groups", "prefix_len", "question_len", "output_len", "popularity", "zipf_alpha", "order")
"""The fields that shape a one-turn batch of groups, which every serving client's flags offer (with
`--prompts-per-group`); seed, rate and turns are each tool's own."""


@dataclass(frozen=True)
class WorkloadFlags:
    """A command line's workload flags, generated from the spec: the fields `names` defaulting to `base`'s
    values, and with `per_group` bench_serving's `--prompts-per-group`, which sets num_requests to num_groups
    times it. `scopes` says, per name, which of the command line's workloads read the flag."""

    base: SharedPrefixSpec = SharedPrefixSpec()
    names: tuple[str, ...] = tuple(opt.name for opt in FLAGS)
    per_group: bool = False
    scopes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.names) - {opt.name for opt in FLAGS}
        if unknown:
            raise ValueError(f"not fields of SharedPrefixSpec: {sorted(unknown)}")

    def options(self) -> tuple[Option, ...]:
        own = [replace(opt, default=getattr(self.base, opt.name)) for opt in FLAGS if opt.name in self.names]
        if self.per_group:
            own.append(
                Option(
                    "prompts_per_group",
                    self.base.num_requests // self.base.num_groups,
                    metavar="N",
                    help="conversations per group (num_requests = num_groups x N)",
                    parse=parse_int,
                    check=positive_int,
                    prefix="--",
                )
            )
        return tuple(
            replace(opt, help=f"{self.scopes[opt.name]}: {opt.help}") if opt.name in self.scopes else opt
            for opt in own
        )

    def add_to(
        self, parser: argparse.ArgumentParser | Any, aliases: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        add_flags(parser, self.options(), aliases)

    def spec(self, args: argparse.Namespace, *, per_group: bool = True) -> SharedPrefixSpec:
        """`base` with the flags given in `args`; unless `per_group` is False, `--prompts-per-group` (given or
        its default) sets num_requests. Raises WorkloadError naming the flag."""
        options = self.options()
        values = given_flags(args, options)
        num_per_group = values.pop("prompts_per_group", None)
        if self.per_group and per_group:
            opt = options[-1]
            num_per_group = opt.default if num_per_group is None else num_per_group
            problem = opt.problem(num_per_group)
            if problem is not None:
                raise WorkloadError(opt.name, problem, opt.flag())
            values["num_requests"] = values.get("num_groups", self.base.num_groups) * num_per_group
        spelt = {opt.name: opt.flag() for opt in options}
        try:
            return replace(self.base, **values)
        except ConfigError as err:
            raise err.shown_as(spelt.get(err.option, err.option)) from None
