"""FeatherScheduler's options (from vLLM's `additional_config`) and the vLLM features it refuses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sglang_feather.admission import AdmissionConfig
from sglang_feather.options import Option, build, declared

OPTIONS_KEY = "feather"
"""`--additional-config '{"feather": {"stopper": "ucb", "max_wait_s": 60}}'`."""


SUPPORTED_VLLM_MINORS = ("0.32", "0.33", "0.34")
"""vLLM minor versions whose scheduler internals FeatherScheduler is tested against (tests/vllm runs on each)."""


class UnsupportedVllmConfig(ValueError):
    """The vLLM configuration asks for something FeatherScheduler cannot do correctly; names every reason."""


class UnsupportedVllmVersion(RuntimeError):
    """The installed vLLM is not one whose (non-public) scheduler internals FeatherScheduler was tested on."""


def check_vllm_version(version: str) -> None:
    """Raise UnsupportedVllmVersion unless `version` (vllm.__version__) is a supported minor release."""
    minor = ".".join(version.split("+", 1)[0].split(".")[:2])
    if minor not in SUPPORTED_VLLM_MINORS:
        *others, last = (m + ".x" for m in SUPPORTED_VLLM_MINORS)
        raise UnsupportedVllmVersion(
            f"FeatherScheduler supports vLLM {', '.join(others)} and {last}, but vLLM "
            f"{version} is installed: vLLM's scheduler interface is not public and changes between minor "
            f'releases. Install a supported one (pip install "vllm>={SUPPORTED_VLLM_MINORS[0]},'
            f'<{_next_minor(SUPPORTED_VLLM_MINORS[-1])}") or run vLLM without --scheduler-cls.'
        )


def _next_minor(minor: str) -> str:
    major, number = minor.split(".")
    return f"{major}.{int(number) + 1}"


ENGINE_SET = {
    "chunk_size": "always vLLM's block size: the CHT reuses vLLM's block hashes, one chunk per block"
}
"""Declared options vLLM sets itself, with why; every other one is a key of `additional_config["feather"]`."""


def options() -> tuple[Option, ...]:
    """The options accepted under `additional_config["feather"]`, keyed by their field names."""
    return tuple(opt for opt in declared(AdmissionConfig) if opt.name not in ENGINE_SET)


def key_name(name: str) -> str:
    """How an error names an option: the key the user wrote."""
    return f'additional_config["{OPTIONS_KEY}"]["{name}"]'


def state_tag(vllm_config: Any) -> dict[str, str]:
    """Where a learned stopper state comes from: a state file saved under another tag is not loaded."""
    from vllm.platforms import current_platform

    return {
        "engine": "vllm",
        "model": str(vllm_config.model_config.model),
        "device": current_platform.get_device_name(),
    }


def admission_config(
    additional_config: Any,
    *,
    chunk_size: int,
    page_size: int,
    state_tag: Mapping[str, str],
    can_probe_cache: bool = True,
    cache_events: bool = False,
) -> AdmissionConfig:
    """Build the admission config; ConfigError (a ValueError) naming the key, and the valid keys for an
    unknown one. `cache_events`: the adapter feeds the cache tier (`cache_tier.py`).

    Without a probe of vLLM's cache (hash blocks smaller than KV blocks) deferral stays off: vLLM already
    computes a prefix shared within one step once (see `capacity.py`)."""
    section: Any = additional_config.get(OPTIONS_KEY, {}) if isinstance(additional_config, Mapping) else {}
    if not isinstance(section, Mapping):
        raise ValueError(
            f'additional_config["{OPTIONS_KEY}"] must be a JSON object, got {type(section).__name__}: {section!r}'
        )
    names = [opt.name for opt in options()]
    unknown = sorted(set(section) - set(names))
    if unknown:
        why = "; ".join(f"{name} is {reason}" for name, reason in ENGINE_SET.items())
        raise ValueError(
            f'unknown key(s) {", ".join(map(repr, unknown))} in additional_config["{OPTIONS_KEY}"]; valid keys: '
            f"{', '.join(names)} ({why})"
        )
    values = dict(section)
    config = build(
        AdmissionConfig,
        values,
        key_name,
        chunk_size=chunk_size,
        page_size=page_size,
        state_tag=state_tag,
        cache_events=cache_events,
    )
    return config if can_probe_cache else replace(config, defer_uncached_prefix=False)


@dataclass(frozen=True)
class Refusal:
    applies: Callable[[Any], bool]
    reason: str


REFUSALS: dict[str, Refusal] = {
    "async_scheduling": Refusal(
        lambda cfg: bool(cfg.scheduler_config.async_scheduling),
        "async scheduling is on (vLLM's default on GPU). FeatherScheduler subclasses the synchronous Scheduler; "
        "with async scheduling vLLM would overlap two batches and sample into placeholders this class does not "
        "keep. Start vLLM with --no-async-scheduling.",
    ),
    "priority_policy": Refusal(
        lambda cfg: cfg.scheduler_config.policy != "fcfs",
        "--scheduling-policy priority: Feather orders the waiting queue itself (prefix sharing, then arrival) and "
        "preempts like fcfs; it would silently ignore request priorities. Use --scheduling-policy fcfs.",
    ),
    "prefix_caching_off": Refusal(
        lambda cfg: not cfg.cache_config.enable_prefix_caching,
        "prefix caching is off: vLLM then computes no block hashes, so Feather has nothing to group by and no "
        "cache to reuse. Pass --enable-prefix-caching.",
    ),
    "kv_connector": Refusal(
        lambda cfg: cfg.kv_transfer_config is not None,
        "a KV connector (--kv-transfer-config: P/D disaggregation, KV offloading) is set: its requests load KV "
        "asynchronously from vLLM's kv_holding_waiting queue (and, in vLLM 0.34, its async_kv_waiting queue "
        "with parked block reservations), which Feather does not order or track.",
    ),
    "inflight_kv_loads": Refusal(
        lambda cfg: getattr(cfg.scheduler_config, "max_num_inflight_kv_loads", None) is not None,
        "--max-num-inflight-kv-loads (vLLM 0.34+) is set: it starts async KV loads from vLLM's async_kv_waiting "
        "queue while the batch is full and reserves blocks for the parked requests, which Feather neither orders "
        "nor counts in its capacity estimate. Leave it unset.",
    ),
    "cache_aware_admission": Refusal(
        lambda cfg: getattr(cfg.scheduler_config, "cache_aware_admission_window", 0) > 0,
        "--cache-aware-admission-window (vLLM 0.34+) is set: vLLM would re-sort the requests Feather admits by "
        "their cached prefix inside schedule() (Scheduler._reorder_waiting_by_cached_prefix), overriding "
        "Feather's order, the aging bound's included. Feather already ranks by cached prefix; leave it at 0.",
    ),
    "pipeline_parallel": Refusal(
        lambda cfg: cfg.parallel_config.pipeline_parallel_size > 1,
        "pipeline parallelism keeps several batches in flight: Feather's reward, the decode throughput between "
        "two schedule() calls, assumes one. Use --pipeline-parallel-size 1.",
    ),
}


def check_supported(vllm_config: Any) -> None:
    """Raise UnsupportedVllmConfig listing every refused feature the configuration turns on."""
    reasons = [f"[{name}] {r.reason}" for name, r in REFUSALS.items() if r.applies(vllm_config)]
    if reasons:
        raise UnsupportedVllmConfig(
            "FeatherScheduler cannot run with this vLLM configuration:\n" + "\n".join(reasons)
        )
