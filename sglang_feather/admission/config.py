"""Feather's options, declared once: the admission component's configuration."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sglang_feather.cht import DEFAULT_CHUNK_SIZE
from sglang_feather.options import (
    ConfigError,
    boolean,
    check_options,
    file_in_existing_dir,
    integer,
    object_of_names,
    option,
    parse_int,
    parse_json_object,
    parse_on_off,
    parse_path_or_none,
    parse_seconds_or_none,
    positive_int,
    seconds_or_none,
)
from sglang_feather.policy import DEFAULT_MAX_WAIT_S, make_policy, policy_names

DEFAULT_STOPPER = "always"
"""Never stop, under every attention backend. A STOP pays where attention over the running groups' prefixes
bounds a decode step and the kernel reads each prefix once (`ucb` +28 % live on the CPU server's decode-heavy
shape with `feather_grouped`), but its KV-pressure results are split and the simulator gives it at most
1-6 % for Llama-3-8B on a GPU under any kernel (docs/results/grouped-attention.md): the learning stoppers
(`ucb`, `qlearn`, `ucb-adaptive`) are opt-in."""


class StopScope(enum.Enum):
    """What a stopper's STOP holds back (docs/policy.md, "When the stopper is consulted")."""

    PASS = "pass"
    """The rest of the scheduling pass: nothing more is admitted until the next pass."""
    NEW_GROUPS = "new-groups"
    """Candidates that add a prefix group, for the rest of the pass; requests of running groups still join."""


@dataclass(frozen=True)
class AdmissionConfig:
    """Feather's options, declared once: SGLang's and the simulator's `--feather-*` flags and vLLM's
    `additional_config["feather"]` keys are generated from these fields (`sglang_feather.options`). The last
    two fields are not options: the engine adapter sets them."""

    chunk_size: int = option(
        DEFAULT_CHUNK_SIZE,
        metavar="TOKENS",
        help="Tokens per Chunked-Hash-Tree chunk, the unit in which shared prefix is counted",
        parse=parse_int,
        check=positive_int,
    )
    stopper: str = option(
        DEFAULT_STOPPER,
        metavar="NAME",
        help="Stopping policy that decides add-one-more vs stop",
        parse=str,
        choices=policy_names,
    )
    stopper_options: Mapping[str, Any] = option(
        default_factory=dict,
        metavar="JSON",
        help="Keyword options of the stopping policy, a JSON object, e.g. '{\"max_chunk_loss\": 3}' for static",
        parse=parse_json_object,
        check=object_of_names,
    )
    stop_scope: str = option(
        StopScope.NEW_GROUPS.value,
        metavar="SCOPE",
        help="What the stopper's STOP holds back: the rest of the pass, or only candidates that add a prefix "
        "group (requests of running groups still join)",
        parse=str,
        choices=lambda: [scope.value for scope in StopScope],
    )
    concentrate: bool = option(
        True,
        metavar="on|off",
        help="While the KV pool binds (the room left cannot hold the waiting requests of running prefix groups "
        "and the candidate), hold back for the pass a request that would lock a new prefix, so requests of "
        'running groups take the room and fewer prefixes are locked (docs/policy.md, "Concentration")',
        parse=parse_on_off,
        check=boolean,
    )
    max_wait_s: float | None = option(
        DEFAULT_MAX_WAIT_S,
        metavar="SECONDS",
        help="Aging bound: a request that waited this long is admitted whatever the stopper says; none "
        "disables the guard",
        parse=parse_seconds_or_none,
        check=seconds_or_none,
    )
    due_when_overtaken: bool = option(
        True,
        metavar="on|off",
        help="Also make a request with nothing covered (neither running nor cached) due (the aging guard serves it "
        "first) once it has waited longer than the median of the last 16 admitted requests: the ranking is "
        "overtaking it (at most one admission in 12 this way)",
        parse=parse_on_off,
        check=boolean,
    )
    state_path: str | None = option(
        None,
        metavar="FILE",
        help="JSON file keeping a learning stopper's state across restarts: loaded at start, saved while "
        "serving (tagged with engine, model and device; another tag's state is not loaded)",
        parse=parse_path_or_none,
        check=file_in_existing_dir,
    )
    seed: int = option(
        0, metavar="INT", help="Seed of a randomised stopping policy", parse=parse_int, check=integer
    )
    defer_uncached_prefix: bool = option(
        True,
        metavar="on|off",
        help="Skip, for one scheduling pass, a request whose prefix shared with running requests the engine's "
        "cache does not hold yet (an in-flight prefill is computing it), so the prefix is computed once",
        parse=parse_on_off,
        check=boolean,
    )
    page_size: int = 1
    """Tokens per KV page of the engine's cache (SGLang `page_size`, vLLM block size): the cache only holds
    whole pages, so shared and cached prefixes are compared rounded down to pages."""
    state_tag: Mapping[str, str] = field(default_factory=dict)
    """Where a learned state comes from (engine, model, device); a state file saved under another tag is not
    loaded (warning, fresh start)."""
    cache_events: bool = False
    """The adapter feeds the engine's KV-cache events (`Admission.cache_stored` / `cache_removed` /
    `cache_cleared`): the cache tier then answers what the cache holds, with no per-candidate cache match."""

    def __post_init__(self) -> None:
        check_options(self)
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {self.page_size!r}")
        if self.cache_events and self.chunk_size % self.page_size:
            raise ConfigError(
                "chunk_size",
                f"{self.chunk_size} tokens is not a whole number of the engine's {self.page_size}-token pages: "
                "cache events name pages, and a chunk is cached only when all its pages are",
            )
        try:
            make_policy(self.stopper, seed=self.seed, **self.stopper_options)
        except (TypeError, ValueError) as err:
            raise ConfigError("stopper_options", f"do not fit stopper {self.stopper!r}: {err}") from None
        if self.state_path is not None:
            object.__setattr__(self, "state_path", str(Path(self.state_path).expanduser()))
        object.__setattr__(self, "stopper_options", MappingProxyType(dict(self.stopper_options)))
        object.__setattr__(
            self, "state_tag", MappingProxyType({str(k): str(v) for k, v in self.state_tag.items()})
        )

    def __reduce__(self):
        """Pickle as plain values (SGLang sends the options to its scheduler processes); loading checks again."""
        values = (getattr(self, f.name) for f in fields(self))
        return type(self), tuple(dict(v) if isinstance(v, Mapping) else v for v in values)
