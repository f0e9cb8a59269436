"""Stopping policies by name: `make_policy("ucb", seed=0, exploration=0.5)`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from sglang_feather.policy.always import AlwaysPolicy
from sglang_feather.policy.base import PolicyBase, StoppingPolicy
from sglang_feather.policy.qlearn import QLearnConfig, QLearnPolicy
from sglang_feather.policy.static import StaticConfig, StaticPolicy
from sglang_feather.policy.step_model import StepModelConfig, StepModelPolicy
from sglang_feather.policy.ucb import UCBConfig, UCBPolicy
from sglang_feather.policy.ucb_adaptive import AdaptiveUCBConfig, AdaptiveUCBPolicy

PolicyFactory = Callable[..., StoppingPolicy]
"""factory(seed, **options) -> a fresh policy."""

POLICIES: dict[str, PolicyFactory] = {
    "always": lambda seed: AlwaysPolicy(),
    "static": lambda seed, **options: StaticPolicy(StaticConfig(**options)),
    "ucb": lambda seed, **options: UCBPolicy(UCBConfig(**options)),
    "ucb-adaptive": lambda seed, **options: AdaptiveUCBPolicy(AdaptiveUCBConfig(**options)),
    "qlearn": lambda seed, **options: QLearnPolicy(QLearnConfig(**options), seed=seed),
    "step-model": lambda seed, **options: StepModelPolicy(StepModelConfig(**options)),
}

OPTIONS: dict[str, tuple[str, ...]] = {
    "always": (),
    "static": tuple(f.name for f in fields(StaticConfig)),
    "ucb": tuple(f.name for f in fields(UCBConfig)),
    "ucb-adaptive": tuple(f.name for f in fields(AdaptiveUCBConfig)),
    "qlearn": tuple(f.name for f in fields(QLearnConfig)),
    "step-model": tuple(f.name for f in fields(StepModelConfig)),
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def learning_policy_names() -> list[str]:
    """The stoppers that learn from the throughput reward (their class overrides `learn`), in registry order."""
    return [name for name in POLICIES if _learns(make_policy(name))]


def _learns(policy: StoppingPolicy) -> bool:
    return isinstance(policy, PolicyBase) and type(policy).learn is not PolicyBase.learn


def step_policy_names() -> list[str]:
    """The stoppers that learn from every decode step (`observes_steps`), in registry order."""
    return [name for name in POLICIES if make_policy(name).observes_steps]


def make_policy(name: str, *, seed: int = 0, **options: Any) -> StoppingPolicy:
    """A fresh policy; ValueError naming the valid choices for an unknown name or option."""
    if name not in POLICIES:
        raise ValueError(f"unknown stopping policy {name!r}; valid names: {', '.join(policy_names())}")
    if type(seed) is not int:
        raise ValueError(f"seed must be an int, got {seed!r}")
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        valid = ", ".join(OPTIONS[name]) or "none"
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for policy {name!r}; valid options: {valid}"
        )
    return POLICIES[name](seed, **options)
