"""Feather's server options: the `--feather-*` command-line flags, their validation and where they travel."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_feather.admission import DEFAULT_STOPPER, Admission, AdmissionConfig
from sglang_feather.cht import DEFAULT_CHUNK_SIZE
from sglang_feather.policy.aging import DEFAULT_MAX_WAIT_S

FEATHER = "feather"
"""The `--schedule-policy` value this package adds."""

_ATTR = "_feather_options"
"""Bookkeeping attribute on SGLang's `ServerArgs`: not a config field, but pickled to the scheduler process."""


class FeatherOptionsError(ValueError):
    """A `--feather-*` option is invalid; raised while the server starts, before any model is loaded."""


@dataclass(frozen=True)
class FeatherOptions:
    chunk_size: int = DEFAULT_CHUNK_SIZE
    """Tokens per CHT chunk (the unit of prefix sharing Feather counts)."""
    stopper: str = DEFAULT_STOPPER
    """Stopping policy name (see `sglang_feather.policy`)."""
    stopper_options: dict[str, Any] = field(default_factory=dict)
    state_path: str | None = None
    """Where a learning stopper keeps its state: loaded at startup, saved every 30 s while serving."""
    max_wait_s: float | None = DEFAULT_MAX_WAIT_S
    """A request waiting this long is admitted whatever the stopper says; None disables the guard."""
    seed: int = 0
    defer_uncached_prefix: bool = True
    """Skip, for one pass, a request whose prefix shared with running requests is not cached yet."""

    def __post_init__(self) -> None:
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise FeatherOptionsError(
                f"--feather-chunk-size must be a positive integer, got {self.chunk_size!r}"
            )
        if not isinstance(self.stopper, str) or not self.stopper:
            raise FeatherOptionsError(f"--feather-stopper must be a policy name, got {self.stopper!r}")
        if not isinstance(self.stopper_options, dict):
            raise FeatherOptionsError(
                f"--feather-stopper-options must be a JSON object, got {type(self.stopper_options).__name__}"
            )
        if self.max_wait_s is not None and not (
            isinstance(self.max_wait_s, int | float)
            and math.isfinite(self.max_wait_s)
            and self.max_wait_s > 0
        ):
            raise FeatherOptionsError(
                f"--feather-max-wait-s must be a finite number of seconds > 0 (or 'none'), got {self.max_wait_s!r}"
            )
        if self.state_path is not None:
            object.__setattr__(self, "state_path", str(Path(self.state_path).expanduser()))
            parent = Path(self.state_path).resolve().parent
            if not parent.is_dir():
                raise FeatherOptionsError(
                    f"--feather-state-path {self.state_path!r}: directory {str(parent)!r} does not exist"
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise FeatherOptionsError(f"--feather-seed must be an integer, got {self.seed!r}")


def _on_off(text: str) -> bool:
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return value


@dataclass(frozen=True)
class _Flag:
    dest: str
    type: Any
    metavar: str
    help: str


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"threshold\": 2}'")
    return value


def _seconds_or_none(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


_FLAGS = (
    _Flag("chunk_size", int, "TOKENS", f"Tokens per Chunked-Hash-Tree chunk (default {DEFAULT_CHUNK_SIZE})."),
    _Flag(
        "stopper",
        str,
        "NAME",
        f"Stopping policy that decides add-one-more vs stop (default {DEFAULT_STOPPER}).",
    ),
    _Flag(
        "stopper_options", _json_object, "JSON", "Keyword options of the stopping policy, as a JSON object."
    ),
    _Flag(
        "state_path",
        str,
        "FILE",
        "File for the learned stopper state: loaded at startup, saved while serving.",
    ),
    _Flag(
        "max_wait_s",
        _seconds_or_none,
        "SECONDS",
        f"Admit a request that waited this long regardless of the stopper; 'none' disables (default "
        f"{DEFAULT_MAX_WAIT_S:g}).",
    ),
    _Flag("seed", int, "INT", "Seed of a randomised stopping policy (default 0)."),
    _Flag(
        "defer_uncached_prefix",
        _on_off,
        "on|off",
        "Skip, for one prefill pass, a request whose prefix shared with running requests the radix cache does "
        "not hold yet (an in-flight prefill is computing it), so the prefix is computed once (default on).",
    ),
)


def flag_name(dest: str) -> str:
    return "--feather-" + dest.replace("_", "-")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the `--feather-*` flags to SGLang's server parser; a flag not given leaves no attribute behind.

    Idempotent: SGLang may apply plugin hooks more than once in one process (launcher and engine)."""
    if flag_name(_FLAGS[0].dest) in parser._option_string_actions:
        return
    group = parser.add_argument_group("Feather scheduling (--schedule-policy feather)")
    for flag in _FLAGS:
        group.add_argument(
            flag_name(flag.dest),
            dest=_dest(flag),
            type=flag.type,
            metavar=flag.metavar,
            help=flag.help,
            default=argparse.SUPPRESS,
        )


def _dest(flag: _Flag) -> str:
    return "feather_" + flag.dest


def options_from_namespace(args: argparse.Namespace) -> FeatherOptions | None:
    """The options given on the command line, validated; None when the policy is not `feather`.

    Raises FeatherOptionsError for invalid values and for `--feather-*` flags given with another policy.
    """
    given = {flag.dest: getattr(args, _dest(flag)) for flag in _FLAGS if hasattr(args, _dest(flag))}
    if getattr(args, "schedule_policy", None) != FEATHER:
        if given:
            names = ", ".join(flag_name(dest) for dest in given)
            raise FeatherOptionsError(f"{names} only apply with --schedule-policy {FEATHER}")
        return None
    _check_scheduler_mode(args)
    options = FeatherOptions(**given)
    validate(options)
    return options


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
    found = [flag for name, bad, flag in _UNSUPPORTED if bad(getattr(args, name, None))]
    if found:
        raise FeatherOptionsError(
            f"--schedule-policy {FEATHER} runs in SGLang's unified scheduler only; not with {', '.join(found)}"
        )


def validate(options: FeatherOptions) -> None:
    """Build the admission component once, so that an unknown stopper or a bad option fails at startup."""
    try:
        Admission.from_config(options_to_config(options))
    except (ValueError, TypeError, KeyError) as err:
        raise FeatherOptionsError(f"invalid Feather options: {err}") from err


def options_to_config(
    options: FeatherOptions, *, page_size: int = 1, defer_uncached_prefix: bool | None = None
) -> AdmissionConfig:
    """The shared admission component's config (raises its ConfigError, a ValueError, for bad values);
    `page_size` and a forced deferral setting come from the scheduler's cache."""
    return AdmissionConfig(
        chunk_size=options.chunk_size,
        stopper=options.stopper,
        stopper_options=dict(options.stopper_options),
        max_wait_s=options.max_wait_s,
        state_path=options.state_path,
        seed=options.seed,
        defer_uncached_prefix=(
            options.defer_uncached_prefix if defer_uncached_prefix is None else defer_uncached_prefix
        ),
        page_size=page_size,
        state_tag={"engine": "sglang"},
    )


def attach(server_args: Any, options: FeatherOptions | None) -> None:
    """Carry validated options on SGLang's `ServerArgs` (as bookkeeping, so they reach every scheduler)."""
    if options is not None:
        setattr(server_args, _ATTR, options)


def options_of(server_args: Any) -> FeatherOptions:
    """The options a scheduler process received; the defaults when the server was built without the CLI."""
    return getattr(server_args, _ATTR, None) or FeatherOptions()
