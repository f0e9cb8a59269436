"""Data parallelism (`--dp-size N`): each rank's scheduler runs its own Feather; what would be shared is split."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_feather.sglang.options import FeatherOptions

# SGLang 0.5.23's `DataParallelController` starts one scheduler process per DP rank; the plugin registers in
# each, `init_schedule_policy` builds each rank's policy, so the CHT, the stopper, the event tap and the
# metrics are per rank already (the metrics carry SGLang's `dp_rank` label: `SchedulerMetricsCollector`'s
# labels, which Feather's series reuse). The one thing the ranks would share is `--feather-state-path`: N
# processes rewriting one file every 30 s, each with what it learned from its own traffic. Each rank gets its
# own file (`name.dp<rank>.suffix`) and its rank in the state tag.


def dp_rank() -> int | None:
    """This scheduler's data-parallel rank (None without data parallelism), as SGLang publishes it."""
    from sglang.srt.runtime_context import get_parallel

    rank = get_parallel().dp_rank
    return None if rank is None else int(rank)


def rank_state_path(path: str, rank: int) -> str:
    """`feather-ucb.json` -> `feather-ucb.dp1.json`."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.dp{rank}{p.suffix}"))


def rank_options(options: FeatherOptions, dp_size: int, rank: int | None) -> FeatherOptions:
    """The options of one rank: its own state file when the server runs more than one rank."""
    path = options.admission.state_path
    if dp_size <= 1 or rank is None or path is None:
        return options
    return replace(options, admission=replace(options.admission, state_path=rank_state_path(path, rank)))


def rank_tag(tag: dict[str, str], dp_size: int, rank: int | None) -> dict[str, str]:
    """The state tag with the rank in it when the server runs more than one (a state learned on one rank's
    traffic is not loaded by another; a single-rank server keeps the tag it always had)."""
    return tag if dp_size <= 1 or rank is None else {**tag, "dp_rank": str(rank)}


def server_dp_size(server_args: Any) -> int:
    return int(getattr(server_args, "dp_size", 1) or 1)
