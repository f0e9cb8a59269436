"""The simulator's registry of scheduling policies by name (SGLang's baselines imported on first use)."""

from __future__ import annotations

from collections.abc import Callable

from sglang_feather.sim.interface import PolicySetup, SimPolicy

PolicyFactory = Callable[[str, PolicySetup], SimPolicy]


class PolicyError(RuntimeError):
    """A policy is unknown or its engine cannot be imported."""


def _sglang_policy(name: str, setup: PolicySetup) -> SimPolicy:
    try:
        from sglang_feather.sim.sglang_baselines import SGLangBaseline
    except ImportError as e:
        raise PolicyError(
            f"policy {name!r} needs SGLang's own objects (sglang_feather.offline), which failed to import ({e}); the "
            "SGLang baselines need sglang==0.5.23 installed (see docs/development.md: make setup)"
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
