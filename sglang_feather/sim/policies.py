"""Scheduling-policy interface of the simulator and the registry of policies (engine ones imported lazily)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sglang_feather.admission import AdmissionConfig
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

POLICIES: dict[str, str] = {
    "fcfs": "sglang_feather.offline.sim_baselines:make_sglang_policy",
    "lpm": "sglang_feather.offline.sim_baselines:make_sglang_policy",
    "dfs-weight": "sglang_feather.offline.sim_baselines:make_sglang_policy",
    "feather": "sglang_feather.sim.feather:FeatherPolicy",
}
"""Policy name -> "module:factory"; the SGLang baselines live in the offline package and import sglang."""


class PolicyError(RuntimeError):
    """A policy is unknown or its engine cannot be imported."""


def make_policy(name: str, setup: PolicySetup) -> SimPolicy:
    target = POLICIES.get(name)
    if target is None:
        raise PolicyError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PolicyError(
            f"policy {name!r} needs {module_name}, which failed to import ({e}); the SGLang baselines need "
            "sglang==0.5.23 installed (see README: make setup)"
        ) from e
    factory: PolicyFactory = getattr(module, attr)
    return factory(name, setup)
