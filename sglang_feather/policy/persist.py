"""Versioned, atomic JSON persistence of a policy's learned state; loading never raises."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_feather.policy.base import StoppingPolicy

FORMAT = "sglang-feather/stopping-policy"
VERSION = 1

logger = logging.getLogger(__name__)


def save_state(policy: StoppingPolicy, path: str | Path, tag: Mapping[str, str] | None = None) -> None:
    """Write {format, version, policy, tag, state, others} to `path` atomically (temp file in the same folder,
    fsync, os.replace): readers and concurrent writers only ever see a complete file. `tag` names where the
    state was learned (engine, model, GPU); states the file holds under other tags or policies move to
    `others`, so a file shared by two deployments keeps both. OSError if it cannot be written; the previous
    file is then left as is."""
    path = Path(path)
    tag = dict(tag or {})
    others = [e for e in _entries(path) if (e["policy"], e["tag"]) != (policy.name, tag)]
    document = {
        "format": FORMAT,
        "version": VERSION,
        "policy": policy.name,
        "tag": tag,
        "state": policy.state_dict(),
        "others": others,
    }
    text = json.dumps(document, sort_keys=True, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _entries(path: Path) -> list[dict[str, Any]]:
    """The well-formed {policy, tag, state} entries of an existing state file; none if it is unreadable."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    if not isinstance(document, dict) or (document.get("format"), document.get("version")) != (
        FORMAT,
        VERSION,
    ):
        return []
    others = document.get("others")
    candidates = [document, *(others if isinstance(others, list) else [])]
    return [
        {"policy": e["policy"], "tag": e.get("tag") or {}, "state": e["state"]}
        for e in candidates
        if isinstance(e, dict)
        and isinstance(e.get("policy"), str)
        and isinstance(e.get("tag") or {}, dict)
        and isinstance(e.get("state"), dict)
    ]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_state(policy: StoppingPolicy, path: str | Path, tag: Mapping[str, str] | None = None) -> bool:
    """Install the state saved at `path` for this policy and `tag`; True on success. A missing file returns
    False quietly; an unreadable, corrupt, wrong-format or wrong-version file, or one without a state of this
    policy under a matching tag (learned on another engine, model or GPU: a tag key both sides give with
    different values) logs a warning and returns False, leaving `policy` as it was (fresh)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError) as exc:
        return _fresh(path, f"cannot be read ({exc})")
    try:
        document: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        return _fresh(path, f"is not valid JSON ({exc})")
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return _fresh(path, f"is not a {FORMAT} file")
    if document.get("version") != VERSION:
        return _fresh(path, f"has version {document.get('version')!r}, this build reads version {VERSION}")
    tag = dict(tag or {})
    entry = _matching(document, policy.name, tag)
    if entry is None:
        if document.get("policy") != policy.name:
            return _fresh(path, f"holds state of policy {document.get('policy')!r}, not {policy.name!r}")
        saved = document.get("tag")
        saved_tag = saved if isinstance(saved, dict) else {}
        clash = sorted(k for k, v in tag.items() if k in saved_tag and saved_tag[k] != v)
        if not clash:
            return _fresh(path, f"has a malformed tag {document.get('tag')!r}")
        return _fresh(
            path,
            "was learned under "
            + ", ".join(f"{k}={saved_tag[k]!r}" for k in clash)
            + ", not "
            + ", ".join(f"{k}={tag[k]!r}" for k in clash)
            + " (saving keeps that state in the file, under its own tag)",
        )
    state = entry.get("state")
    if not isinstance(state, dict):
        return _fresh(path, "has no state object")
    try:
        policy.load_state_dict(state)
    except (KeyError, TypeError, ValueError) as exc:
        return _fresh(path, f"holds a malformed {policy.name} state ({type(exc).__name__}: {exc})")
    return True


def _matching(document: dict[str, Any], name: str, tag: Mapping[str, str]) -> dict[str, Any] | None:
    """The entry learned by policy `name` under `tag`: the same tag first, else one whose tag agrees on every
    key both give (a file saved with fewer tag keys still loads)."""
    others = document.get("others")
    entries = [document, *(e for e in (others if isinstance(others, list) else []) if isinstance(e, dict))]
    mine = [e for e in entries if e.get("policy") == name and isinstance(e.get("tag") or {}, dict)]
    for entry in mine:
        if (entry.get("tag") or {}) == tag:
            return entry
    for entry in mine:
        saved = entry.get("tag") or {}
        if all(saved[k] == v for k, v in tag.items() if k in saved):
            return entry
    return None


def _fresh(path: Path, why: str) -> bool:
    logger.warning("stopping-policy state %s %s; ignoring it and starting fresh", path, why)
    return False
