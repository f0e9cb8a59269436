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
    """Write {format, version, policy, tag, state} to `path` atomically (temp file in the same folder, fsync,
    os.replace): readers and concurrent writers only ever see a complete file. `tag` names where the state
    was learned (engine, model, GPU). OSError if it cannot be written; the previous file is then left as is."""
    path = Path(path)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "policy": policy.name,
        "tag": dict(tag or {}),
        "state": policy.state_dict(),
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
    """Install the state saved at `path`; True on success. A missing file returns False quietly; an
    unreadable, corrupt, wrong-format, wrong-version, other-policy or other-tag file (learned on another
    engine, model or GPU: a tag key both sides give with different values) logs a warning and returns False,
    leaving `policy` as it was (fresh)."""
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
    if document.get("policy") != policy.name:
        return _fresh(path, f"holds state of policy {document.get('policy')!r}, not {policy.name!r}")
    saved_tag = document.get("tag") or {}
    clash = sorted(
        k
        for k, v in (tag or {}).items()
        if isinstance(saved_tag, dict) and k in saved_tag and saved_tag[k] != v
    )
    if clash:
        return _fresh(
            path,
            "was learned under "
            + ", ".join(f"{k}={saved_tag[k]!r}" for k in clash)
            + ", not "
            + ", ".join(f"{k}={tag[k]!r}" for k in clash),
        )
    state = document.get("state")
    if not isinstance(state, dict):
        return _fresh(path, "has no state object")
    try:
        policy.load_state_dict(state)
    except (KeyError, TypeError, ValueError) as exc:
        return _fresh(path, f"holds a malformed {policy.name} state ({type(exc).__name__}: {exc})")
    return True


def _fresh(path: Path, why: str) -> bool:
    logger.warning("stopping-policy state %s %s; ignoring it and starting fresh", path, why)
    return False
