"""`always`: never stop (plain greedy admission by CHT order), the baseline."""

from __future__ import annotations

from sglang_feather.policy.base import Decision, Observation, PolicyBase


class AlwaysPolicy(PolicyBase):
    name = "always"
    blind_decision = Decision.ADD

    def decide(self, obs: Observation) -> Decision:
        return Decision.ADD
