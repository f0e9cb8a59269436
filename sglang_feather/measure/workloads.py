"""Synthetic waiting queues shared by both sides of the overhead benchmark."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sglang_feather.workload import SharedPrefixSpec, zipf_weights

NUM_GROUPS = 8
MAX_SHARED_PREFIX = 4096
NUM_ARRIVALS = 16


@dataclass(frozen=True)
class Workload:
    """Prompts in arrival order plus the sequences already cached before the first pass.

    Prompts are `array('q')`, the type SGLang keeps in `Req.origin_input_ids`, so both sides hash or
    match exactly the object a live scheduler would hold. `groups[i]` is the prefix group of prompt i
    (None when it shares nothing). `cached` is what SGLang's RadixCache holds; the CHT sees the same
    sequences as running requests (its working set).
    """

    name: str
    prompts: tuple[array, ...]
    groups: tuple[int | None, ...]
    cached: tuple[array, ...]
    arrivals: tuple[array, ...]
    """Further prompts of the same shape that are not in the queue: fresh arrivals for timing inserts."""
    num_cached_tokens: int = 0
    """Tokens of every queued prompt that are already cached before the first pass."""

    @property
    def num_new_tokens(self) -> int:
        """Prefill tokens of the longest queued prompt beyond what is cached."""
        return max(map(len, self.prompts)) - self.num_cached_tokens

    @property
    def num_requests(self) -> int:
        return len(self.prompts)


def token_array(tokens: np.ndarray) -> array:
    """Token ids as `array('q')`."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
    return out


def shared_prefix_len(prompt_len: int) -> int:
    return min(MAX_SHARED_PREFIX, prompt_len * 3 // 4)


def _prompts(spec: SharedPrefixSpec) -> tuple[array, ...]:
    return tuple(token_array(tokens) for tokens in spec.prompts())


def _grouped(name: str, seed: int, num_requests: int, prompt_len: int) -> Workload:
    prefix_len = shared_prefix_len(prompt_len)
    spec = SharedPrefixSpec(
        num_groups=NUM_GROUPS,
        num_requests=num_requests + NUM_ARRIVALS,
        prefix_len=prefix_len,
        question_len=prompt_len - prefix_len,
        order="interleaved",
        seed=seed,
    )
    prompts = _prompts(spec)
    groups = spec.arrival_groups().tolist()
    cached = tuple(token_array(spec.prefix_tokens(g)) for g in range(NUM_GROUPS)) if name == "shared" else ()
    return Workload(
        name,
        prompts[:num_requests],
        tuple(groups[:num_requests]),
        cached,
        prompts[num_requests:],
        prefix_len if cached else 0,
    )


def shared(seed: int, num_requests: int, prompt_len: int) -> Workload:
    return _grouped("shared", seed, num_requests, prompt_len)


def shared_cold(seed: int, num_requests: int, prompt_len: int) -> Workload:
    return _grouped("shared-cold", seed, num_requests, prompt_len)


def unique(seed: int, num_requests: int, prompt_len: int) -> Workload:
    """Groups of one prompt each; the cache holds NUM_GROUPS more unrelated prompts of the same length."""
    total = num_requests + NUM_ARRIVALS + NUM_GROUPS
    spec = SharedPrefixSpec(
        num_groups=total,
        num_requests=total,
        prefix_len=prompt_len,
        question_len=0,
        order="contiguous",
        seed=seed,
    )
    prompts = _prompts(spec)
    queued, arrivals, cached = (
        prompts[:num_requests],
        prompts[num_requests:-NUM_GROUPS],
        prompts[-NUM_GROUPS:],
    )
    return Workload("unique", queued, (None,) * num_requests, cached, arrivals)


WORKLOADS: dict[str, Callable[[int, int, int], Workload]] = {
    "shared": shared,
    "unique": unique,
    "shared-cold": shared_cold,
}
"""8 groups sharing a cached prefix of min(4096, 3L/4) tokens; nothing shared (8 unrelated cached
sequences); the grouped prompts with nothing cached."""


def build_workload(name: str, num_requests: int, prompt_len: int, seed: int = 0) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    if num_requests < 1 or prompt_len < 4:
        raise ValueError(f"need num_requests >= 1 and prompt_len >= 4, got {num_requests}, {prompt_len}")
    return WORKLOADS[name](seed, num_requests, prompt_len)


@dataclass(frozen=True)
class ZipfGroups:
    """Prompts drawn from prefix groups with Zipf popularity (the SGLang adapter benchmarks and soak).

    Group g (the g-th most popular) shares the tokens `prefixes[g]`; every prompt then has a private suffix.
    """

    prefixes: tuple[array, ...]
    weights: np.ndarray

    @classmethod
    def build(cls, rng: np.random.Generator, prefix_lens: Sequence[int], alpha: float = 1.0) -> ZipfGroups:
        """One group per entry of `prefix_lens` (its prefix length), most popular first."""
        return cls(tuple(random_tokens(rng, n) for n in prefix_lens), zipf_weights(len(prefix_lens), alpha))

    def groups(self, rng: np.random.Generator, num_prompts: int) -> np.ndarray:
        return rng.choice(len(self.prefixes), size=num_prompts, p=self.weights)

    def prompt(self, rng: np.random.Generator, group: int, prompt_len: int) -> array:
        """`prompt_len` tokens: the group prefix (cut to 5/8 of the prompt when longer), then private ones."""
        prefix = self.prefixes[group][: prompt_len * 5 // 8]
        return prefix + random_tokens(rng, prompt_len - len(prefix))

    def extend(self, rng: np.random.Generator, group: int, suffix_len: int) -> array:
        """The whole group prefix, then `suffix_len` private tokens."""
        return self.prefixes[group] + random_tokens(rng, suffix_len)


def random_tokens(rng: np.random.Generator, num_tokens: int) -> array:
    """Private tokens (never shared by chance: drawn from a 2**31 range), as SGLang's `array('q')`."""
    return array("q", rng.integers(1, 2**31, size=num_tokens).tolist())
