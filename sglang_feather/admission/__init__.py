"""Engine-agnostic admission: which waiting requests join the batch, and the stopper's reward bookkeeping."""

from sglang_feather.admission.component import Admission
from sglang_feather.admission.config import DEFAULT_STOPPER, AdmissionConfig
from sglang_feather.admission.costs import KvHeadroom
from sglang_feather.admission.results import AdmissionPlan, AdmissionStats, Pick, Proposal, StopReason
from sglang_feather.options import ConfigError

__all__ = [
    "DEFAULT_STOPPER",
    "Admission",
    "AdmissionConfig",
    "AdmissionPlan",
    "AdmissionStats",
    "ConfigError",
    "KvHeadroom",
    "Pick",
    "Proposal",
    "StopReason",
]
