"""Prompt tokens an SGLang server actually prefilled, read from its own `Prefill batch` log lines."""

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

PREFILL_LINE = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<new>\d+), "
    r"#cached-token: (?P<cached>\d+),"
)
"""SGLang 0.5.23's `MetricsReporter.report_prefill_stats` (scheduler_components/metrics_reporter.py): one line
per prefill batch (each chunk of a chunked prefill is its own batch); #new-token is the tokens computed,
#cached-token the tokens matched in the prefix cache."""
REPLAY_TOKENS = re.compile(r"#replay-token: (\d+),")
"""Tokens recomputed on top of #new-token (encoder sliding-window replay); absent from the line when 0."""
RETRACT_LINE = re.compile(
    r"(?:KV cache pool is full\. Retract requests|Testing retraction)\. #retracted_reqs: (\d+),"
)
"""`Scheduler.update_running_batch`: decode ran out of KV (or `SGLANG_TEST_RETRACT=1` forced it) and sent
requests back to the waiting queue; a retracted request is prefilled again (its prompt, if evicted meanwhile,
and the tokens it had generated)."""
FLUSH_LINE = "Cache flushed successfully!"
"""`Scheduler.flush_cache`, e.g. bench_serving's `--flush-cache` after its warmup requests."""


@dataclass(frozen=True)
class PrefillTotals:
    """Sums over a stretch of a server log."""

    batches: int = 0
    new_seqs: int = 0
    new_tokens: int = 0
    """Prompt tokens computed (sum of #new-token and #replay-token): what prefill actually cost."""
    cached_tokens: int = 0
    retracted_reqs: int = 0

    @property
    def hit_rate(self) -> float | None:
        """Cached over cached + computed, as the server saw it (retracted requests' second prefills included)."""
        total = self.new_tokens + self.cached_tokens
        return self.cached_tokens / total if total else None


def parse_prefill_lines(lines: Iterable[str]) -> PrefillTotals:
    """Sum every prefill and retraction line; a `Cache flushed` line starts the count again."""
    totals = PrefillTotals()
    for line in lines:
        if FLUSH_LINE in line:
            totals = PrefillTotals()
        elif match := PREFILL_LINE.search(line):
            replay = REPLAY_TOKENS.search(line)
            totals = replace(
                totals,
                batches=totals.batches + 1,
                new_seqs=totals.new_seqs + int(match["seqs"]),
                new_tokens=totals.new_tokens + int(match["new"]) + (int(replay[1]) if replay else 0),
                cached_tokens=totals.cached_tokens + int(match["cached"]),
            )
        elif match := RETRACT_LINE.search(line):
            totals = replace(totals, retracted_reqs=totals.retracted_reqs + int(match[1]))
    return totals


def log_size(path: Path) -> int:
    """Bytes in the log now (0 when it does not exist yet): where the next stretch starts."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_prefill_totals(path: Path, offset: int = 0) -> PrefillTotals:
    """Totals of the log from byte `offset` on, counted after the last cache flush in that stretch."""
    with open(path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", errors="replace")
    return parse_prefill_lines(text.splitlines())
