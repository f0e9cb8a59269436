"""Stopping policies: decide whether a growing batch takes one more request, and learn from throughput."""

from sglang_feather.policy.aging import DEFAULT_MAX_WAIT_S, AgingGuard
from sglang_feather.policy.base import (
    Decision,
    DecisionRecord,
    Observation,
    PolicyBase,
    StoppingPolicy,
)
from sglang_feather.policy.persist import load_state, save_state
from sglang_feather.policy.registry import (
    POLICIES,
    learning_policy_names,
    make_policy,
    policy_names,
    step_policy_names,
)
from sglang_feather.policy.reward import RewardNormalizer
from sglang_feather.policy.steps import StepSample

__all__ = [
    "DEFAULT_MAX_WAIT_S",
    "POLICIES",
    "AgingGuard",
    "Decision",
    "DecisionRecord",
    "Observation",
    "PolicyBase",
    "RewardNormalizer",
    "StepSample",
    "StoppingPolicy",
    "learning_policy_names",
    "load_state",
    "make_policy",
    "policy_names",
    "save_state",
    "step_policy_names",
]
