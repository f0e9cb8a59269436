"""Feather's server options: the `--feather-*` flags (generated from the declared options) and where they travel."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_feather.admission import AdmissionConfig
from sglang_feather.options import (
    ConfigError,
    add_flags,
    build,
    check_options,
    declared,
    flag,
    given_flags,
    option,
)
from sglang_feather.sglang.batch_order import ADMISSION, BATCH_ORDERS

FEATHER = "feather"
"""The `--schedule-policy` value this package adds."""

_ATTR = "_feather_options"
"""Bookkeeping attribute on SGLang's `ServerArgs`: not a config field, but pickled to the scheduler process."""


SELF_CHECK_INTERVAL_S = 5.0
"""How often, by default, the CHT is reconciled with SGLang's full queues to catch a missed event (O(W + R))."""


def _parse_seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None


def _non_negative_seconds(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return f"must be a finite number of seconds >= 0, got {value!r}"
    return None


class FeatherOptionsError(ValueError):
    """A `--feather-*` option is invalid; raised while the server starts, before any model is loaded."""


@dataclass(frozen=True)
class FeatherOptions:
    """What `--schedule-policy feather` runs with: the shared admission options and SGLang's own."""

    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    batch_order: str = option(
        ADMISSION,
        metavar="ORDER",
        help="Order of the running (decode) batch: 'prefix' permutes it after each merge so that requests "
        "sharing a prefix are contiguous, in Chunked-Hash-Tree order; 'admission' keeps SGLang's order",
        parse=str,
        choices=lambda: tuple(BATCH_ORDERS),
    )
    self_check_interval_s: float = option(
        SELF_CHECK_INTERVAL_S,
        metavar="SECONDS",
        help="How often the Chunked Hash Tree is reconciled with SGLang's full queues; each correction counts "
        "in sglang:feather_drift_total (a missed scheduler event). 0 checks at every scheduler step (tests)",
        parse=_parse_seconds,
        check=_non_negative_seconds,
    )

    def __post_init__(self) -> None:
        check_options(self)


FLAGS = declared(AdmissionConfig) + declared(FeatherOptions)
"""Every `--feather-*` flag: the admission options, then SGLang's own."""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the `--feather-*` flags to SGLang's server parser; a flag not given leaves no attribute behind.

    Idempotent: SGLang may apply plugin hooks more than once in one process (launcher and engine)."""
    if FLAGS[0].flag() in parser._option_string_actions:
        return
    add_flags(parser.add_argument_group("Feather scheduling (--schedule-policy feather)"), FLAGS)


def options_from_namespace(args: argparse.Namespace) -> FeatherOptions | None:
    """The options given on the command line, validated; None when the policy is not `feather`.

    Raises FeatherOptionsError, naming the flag, for invalid values and for `--feather-*` flags given with
    another policy."""
    given = given_flags(args, FLAGS)
    if getattr(args, "schedule_policy", None) != FEATHER:
        if given:
            names = ", ".join(opt.flag() for opt in FLAGS if opt.name in given)
            raise FeatherOptionsError(f"{names} only apply with --schedule-policy {FEATHER}")
        return None
    _check_scheduler_mode(args)
    own = {opt.name for opt in declared(FeatherOptions)}
    try:
        admission = build(AdmissionConfig, {k: v for k, v in given.items() if k not in own}, flag)
        return build(FeatherOptions, {k: v for k, v in given.items() if k in own}, flag, admission=admission)
    except ConfigError as err:
        raise FeatherOptionsError(str(err)) from None


_UNSUPPORTED = (
    (
        "disaggregation_mode",
        lambda value: value not in (None, "null"),
        "--disaggregation-mode prefill/decode",
    ),
    ("pp_size", lambda value: value is not None and value > 1, "--pp-size > 1"),
    ("dllm_algorithm", lambda value: value is not None, "--dllm-algorithm"),
)
"""Scheduler modes with their own queues or event loops that Feather does not mirror."""


def _check_scheduler_mode(args: argparse.Namespace) -> None:
    found = [shown for name, bad, shown in _UNSUPPORTED if bad(getattr(args, name, None))]
    if found:
        raise FeatherOptionsError(
            f"--schedule-policy {FEATHER} runs in SGLang's unified scheduler only; not with {', '.join(found)}"
        )


def options_to_config(
    options: FeatherOptions,
    *,
    page_size: int = 1,
    defer_uncached_prefix: bool | None = None,
    state_tag: Mapping[str, str] | None = None,
    cache_events: bool = False,
) -> AdmissionConfig:
    """The shared admission component's config with what the scheduler sets: `page_size` and a forced
    deferral setting from its cache, whether its KV events feed the cache tier, and the state tag."""
    admission = options.admission
    return replace(
        admission,
        page_size=page_size,
        cache_events=cache_events,
        defer_uncached_prefix=(
            admission.defer_uncached_prefix if defer_uncached_prefix is None else defer_uncached_prefix
        ),
        state_tag=state_tag or {"engine": "sglang"},
    )


def state_tag(server_args: Any, gpu_id: int = 0) -> dict[str, str]:
    """Where a learned stopper state comes from: a state file saved under another tag is not loaded."""
    return {
        "engine": "sglang",
        "model": str(server_args.model_path),
        "device": _device_name(str(server_args.device or "unknown"), gpu_id),
    }


def _device_name(device: str, gpu_id: int) -> str:
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(gpu_id)
    return device


def attach(server_args: Any, options: FeatherOptions | None) -> None:
    """Carry validated options on SGLang's `ServerArgs` (as bookkeeping, so they reach every scheduler)."""
    if options is not None:
        setattr(server_args, _ATTR, options)


def options_of(server_args: Any) -> FeatherOptions:
    """The options a scheduler process received; the defaults when the server was built without the CLI."""
    return getattr(server_args, _ATTR, None) or FeatherOptions()
