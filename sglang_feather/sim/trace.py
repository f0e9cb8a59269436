"""Simulator requests and their JSONL trace format (explicit token ids or named, seeded segments)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sglang_feather.workload import VOCAB_SIZE, Segment, segment_tokens


class TraceError(ValueError):
    """A trace file or record is malformed."""


@dataclass(frozen=True)
class SimRequest:
    """One request of a trace. `follows` makes it arrive `delay_s` after that request finishes (chat turns).

    The prompt is either explicit `prompt_ids` or a tuple of `segments`; `arrival_s` is ignored for followers.
    """

    rid: str
    arrival_s: float
    output_len: int
    segments: tuple[Segment, ...] = ()
    prompt_ids: tuple[int, ...] | None = None
    group: str | None = None
    follows: str | None = None
    delay_s: float = 0.0
    output_key: str | None = None
    """Segment key of the generated tokens, so a later chat turn can hold them in its prompt."""
    max_new_tokens: int | None = None
    """The output cap the client sends when the output ends at EOS before it; None = `output_len` (fixed-length
    outputs, bench_serving's `ignore_eos`)."""

    @property
    def max_new(self) -> int:
        """What the engine reserves for (SGLang's `max_new_tokens`); the request stops after `output_len`."""
        return self.output_len if self.max_new_tokens is None else self.max_new_tokens

    @property
    def prompt_len(self) -> int:
        if self.prompt_ids is not None:
            return len(self.prompt_ids)
        return sum(s.num_tokens for s in self.segments)


@dataclass
class TokenSource:
    """Materialises prompts as int32 arrays; segment tokens are a pure function of the segment key."""

    vocab_size: int = VOCAB_SIZE
    _segments: dict[str, np.ndarray] = field(default_factory=dict)

    def segment(self, seg: Segment) -> np.ndarray:
        arr = self._segments.get(seg.key)
        if arr is None or len(arr) < seg.num_tokens:
            arr = segment_tokens(seg.key, seg.num_tokens, high=self.vocab_size)
            self._segments[seg.key] = arr
        return arr[: seg.num_tokens]

    def prompt(self, req: SimRequest) -> np.ndarray:
        if req.prompt_ids is not None:
            return np.asarray(req.prompt_ids, dtype=np.int32)
        parts = [self.segment(s) for s in req.segments]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def validate(requests: Sequence[SimRequest]) -> None:
    seen: set[str] = set()
    for r in requests:
        if r.rid in seen:
            raise TraceError(f"duplicate request id {r.rid!r}")
        seen.add(r.rid)
        if r.prompt_len <= 0:
            raise TraceError(f"request {r.rid!r} has an empty prompt")
        if r.output_len <= 0:
            raise TraceError(f"request {r.rid!r} needs output_len >= 1, got {r.output_len}")
        if r.max_new < r.output_len:
            raise TraceError(
                f"request {r.rid!r} has max_new_tokens {r.max_new} below its output_len {r.output_len}"
            )
        if r.arrival_s < 0 or r.delay_s < 0:
            raise TraceError(f"request {r.rid!r} has a negative arrival or delay")
        if r.follows is not None and r.follows not in seen:
            raise TraceError(f"request {r.rid!r} follows {r.follows!r}, which is not an earlier request")


def to_record(r: SimRequest) -> dict:
    rec: dict = {"rid": r.rid, "arrival_s": r.arrival_s, "output_len": r.output_len}
    if r.prompt_ids is not None:
        rec["prompt_ids"] = list(r.prompt_ids)
    else:
        rec["segments"] = [[s.key, s.num_tokens] for s in r.segments]
    for key in ("group", "follows", "output_key", "max_new_tokens"):
        if getattr(r, key) is not None:
            rec[key] = getattr(r, key)
    if r.delay_s:
        rec["delay_s"] = r.delay_s
    return rec


def from_record(rec: dict, where: str) -> SimRequest:
    try:
        segments = tuple(Segment(str(k), int(n)) for k, n in rec.get("segments", ()))
        ids = rec.get("prompt_ids")
        if (ids is None) == (not segments):
            raise TraceError(f"{where}: give exactly one of 'prompt_ids' or 'segments'")
        return SimRequest(
            rid=str(rec["rid"]),
            arrival_s=float(rec.get("arrival_s", 0.0)),
            output_len=int(rec["output_len"]),
            segments=segments,
            prompt_ids=tuple(int(t) for t in ids) if ids is not None else None,
            group=rec.get("group"),
            follows=rec.get("follows"),
            delay_s=float(rec.get("delay_s", 0.0)),
            output_key=rec.get("output_key"),
            max_new_tokens=int(rec["max_new_tokens"]) if "max_new_tokens" in rec else None,
        )
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"{where}: bad record ({e!r})") from e


def write_jsonl(requests: Iterable[SimRequest], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(to_record(r), separators=(",", ":")) + "\n")


def read_jsonl(path: str | Path) -> list[SimRequest]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}:{n}: not JSON ({e})") from e
            if not isinstance(rec, dict):
                raise TraceError(f"{path}:{n}: a record must be a JSON object")
            out.append(from_record(rec, f"{path}:{n}"))
    validate(out)
    return out
