"""Scheduling-policy interface of the simulator and the registry of policies (SGLang's imported on first use)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sglang_feather.admission import AdmissionConfig, KvHeadroom
from sglang_feather.sim.prefix_cache import PrefixCache


class PassContext(Protocol):
    """One scheduling pass as the engine offers it to a policy."""

    @property
    def num_running(self) -> int: ...

    def try_admit(self, rid: str) -> bool:
        """Admit `rid` under SGLang's budgets; False (admitting nothing) means the pass must stop."""
        ...

    def num_cached_tokens(self, rid: str) -> int:
        """Leading prompt tokens of a waiting request that the prefix cache holds now."""
        ...

    def kv_headroom(self) -> KvHeadroom:
        """The KV room this pass can still give out (SGLang's `rem_total_tokens`) over the pool's size."""
        ...

    def refresh_prefixes(self, rids: Sequence[str]) -> None:
        """Refresh the cached prompt prefixes of these waiting requests in the cache's LRU, the last one most
        recently (SGLang's `match_prefix` / `touch_prefix` on each, in this order)."""
        ...

    def waiting_ids(self) -> Iterator[str]:
        """The waiting requests in SGLang's queue order (arrival; a retracted request rejoins at the end),
        lazily: read before the pass admits anything."""
        ...


class SimPolicy(Protocol):
    name: str

    def prepare(self, rid: str, tokens: np.ndarray, max_new_tokens: int) -> None:
        """Engine-side translation of a new request (untimed: every policy pays it in a real engine)."""
        ...

    def on_arrival(self, rid: str) -> None: ...

    def schedule(self, ctx: PassContext) -> None: ...

    def on_admitted(self, rids: Sequence[str]) -> None: ...

    def on_finish(self, rid: str) -> None: ...

    def on_retract(self, rid: str, num_out: int) -> None: ...

    def on_step(self, num_tokens: int, elapsed_s: float) -> None: ...


@dataclass(frozen=True)
class PolicySetup:
    """What a policy factory receives; `clock` is simulated time, `cache` the engine's prefix cache,
    `admission` Feather's options (production's defaults unless given)."""

    cache: PrefixCache
    clock: Callable[[], float]
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)


PolicyFactory = Callable[[str, PolicySetup], SimPolicy]


class PolicyError(RuntimeError):
    """A policy is unknown or its engine cannot be imported."""


def _sglang_policy(name: str, setup: PolicySetup) -> SimPolicy:
    try:
        from sglang_feather.sim.sglang_baselines import SGLangBaseline
    except ImportError as e:
        raise PolicyError(
            f"policy {name!r} needs SGLang's own objects (sglang_feather.offline), which failed to import ({e}); the "
            "SGLang baselines need sglang==0.5.23 installed (see README: make setup)"
        ) from e
    return SGLangBaseline(name, setup)


def _feather_policy(name: str, setup: PolicySetup) -> SimPolicy:
    from sglang_feather.sim.feather import FeatherPolicy

    return FeatherPolicy(name, setup)


POLICIES: dict[str, PolicyFactory] = {
    "fcfs": _sglang_policy,
    "lpm": _sglang_policy,
    "dfs-weight": _sglang_policy,
    "feather": _feather_policy,
}
"""Policy name -> factory; the SGLang baselines (`sglang_baselines.py`) import sglang when built."""


def make_policy(name: str, setup: PolicySetup) -> SimPolicy:
    factory = POLICIES.get(name)
    if factory is None:
        raise PolicyError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    return factory(name, setup)
