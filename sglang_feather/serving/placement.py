"""Which worker served which prefix group, read from each worker's own request log (`--log-requests`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REQUEST_LOG_ARGS = ("--log-requests", "--log-requests-level", "2", "--log-requests-format", "json")
"""SGLang 0.5.23's `RequestLogger.log_received_request` (utils/request_logger.py): level 2 keeps each request's
text up to 2048 characters (its first and last 1024), JSON puts one `request.received` record on a line."""
RECEIVED = '"request.received"'
GROUP_KEY_CHARS = 200
"""Leading characters that name a prefix group: bench_serving's generated-shared-prefix prompt starts with its
group's system prompt (random text of hundreds of tokens, so 200 characters never collide between groups)."""


@dataclass(frozen=True)
class Placement:
    """Requests per worker and groups whose requests reached more than one worker."""

    requests: Mapping[str, int]
    num_groups: int
    split_groups: int

    @property
    def split_share(self) -> float:
        return self.split_groups / self.num_groups if self.num_groups else 0.0


def received_texts(lines: Iterable[str]) -> list[str]:
    """The prompt text of every request an SGLang server logged as received (token-id requests skipped)."""
    texts = []
    for line in lines:
        if RECEIVED not in line:
            continue
        record = json.loads(line[line.index("{") :])
        text = record.get("obj", {}).get("text")
        if isinstance(text, str):
            texts.append(text)
    return texts


def group_key(text: str) -> str | None:
    """The group a prompt belongs to; None for prompts too short to be a shared-prefix request (SGLang's own
    startup warmup, health probes)."""
    return text[:GROUP_KEY_CHARS] if len(text) > 2 * GROUP_KEY_CHARS else None


def placement(texts_by_worker: Mapping[str, Iterable[str]]) -> Placement:
    workers_of: dict[str, set[str]] = {}
    requests = {}
    for worker, texts in texts_by_worker.items():
        keys = [k for k in map(group_key, texts) if k is not None]
        requests[worker] = len(keys)
        for key in keys:
            workers_of.setdefault(key, set()).add(worker)
    split = sum(len(workers) > 1 for workers in workers_of.values())
    return Placement(requests, len(workers_of), split)


def read_placement(logs: Mapping[str, tuple[Path, int]]) -> Placement:
    """Worker -> (its log, the byte offset the run started at)."""
    texts = {}
    for worker, (path, offset) in logs.items():
        with open(path, "rb") as log:
            log.seek(offset)
            texts[worker] = received_texts(log.read().decode("utf-8", errors="replace").splitlines())
    return placement(texts)
