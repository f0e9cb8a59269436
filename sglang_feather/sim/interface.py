"""What the simulator's engine offers a scheduling policy in each pass, and what a policy must answer."""

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
