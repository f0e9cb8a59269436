"""Check, apply and revert the SGLang source patch set (`patches/sglang-<version>/*.patch`) with GNU patch."""

from __future__ import annotations

import enum
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sglang_feather.sglang.version import SUPPORTED_SGLANG as SGLANG_VERSION

PATCH_SET = f"sglang-{SGLANG_VERSION}"

_PACKAGE_DIR = Path(__file__).resolve().parent
_SEARCH = (_PACKAGE_DIR / PATCH_SET, _PACKAGE_DIR.parents[1] / "patches" / PATCH_SET)
"""Shipped inside the package (wheel) or at the repository root (source checkout, editable install)."""


class PatchError(RuntimeError):
    """The patch set cannot be found, is not applicable, or GNU patch failed and what it had done was undone."""


class RollbackError(PatchError):
    """GNU patch failed, and so did undoing the patches already done: the tree IS left half-done."""


class PatchState(enum.Enum):
    APPLIED = "applied"
    APPLICABLE = "applicable"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class PatchStatus:
    patch: Path
    state: PatchState
    detail: str


def patch_dir() -> Path:
    for candidate in _SEARCH:
        if any(candidate.glob("*.patch")):
            return candidate
    raise PatchError(f"patch set {PATCH_SET} not found (looked in {', '.join(map(str, _SEARCH))})")


def patch_files(directory: Path | None = None) -> list[Path]:
    return sorted((directory or patch_dir()).glob("*.patch"))


def touched_files(patches: list[Path] | None = None) -> list[str]:
    """Paths (relative to the root, e.g. `sglang/srt/managers/scheduler.py`) that the patches change."""
    found: list[str] = []
    for patch in patches or patch_files():
        for line in patch.read_text().splitlines():
            if line.startswith("+++ "):
                path = line[4:].split("\t")[0].split("/", 1)[1]
                if path not in found:
                    found.append(path)
    return found


def installed_root() -> Path:
    """The directory holding the installed `sglang` package (site-packages): `patch -p1` runs there."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise PatchError("SGLang is not installed in this Python environment")
    return Path(spec.origin).resolve().parent.parent


def _patch(root: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch is not installed (apt-get install patch)")
    cmd = [
        exe,
        "-p1",
        "--batch",
        "--no-backup-if-mismatch",
        "--reject-file=-",
        "-d",
        str(root),
        "-i",
        str(patch),
    ]
    return subprocess.run([*cmd, *flags], capture_output=True, text=True, check=False)


def status(root: Path, patches: list[Path] | None = None) -> list[PatchStatus]:
    """Whether each patch is applied, applicable or in conflict with the files under `root` (nothing written)."""
    if not (root / "sglang").is_dir():
        raise PatchError(
            f"{root} has no sglang/ directory (use site-packages, or python/ in a source checkout)"
        )
    result = []
    for patch in patches or patch_files():
        forward = _patch(root, patch, "--dry-run", "--forward")
        if forward.returncode == 0:
            result.append(PatchStatus(patch, PatchState.APPLICABLE, ""))
            continue
        reverse = _patch(root, patch, "--dry-run", "--reverse", "--force")
        if reverse.returncode == 0:
            result.append(PatchStatus(patch, PatchState.APPLIED, ""))
        else:
            result.append(PatchStatus(patch, PatchState.CONFLICT, (forward.stdout + forward.stderr).strip()))
    return result


def apply(root: Path, patches: list[Path] | None = None) -> list[Path]:
    """Apply every patch not yet applied; returns those applied now. All-or-nothing."""
    patches = patches or patch_files()
    states = status(root, patches)
    _refuse_conflicts(states)
    done: list[Path] = []
    for item in states:
        if item.state is PatchState.APPLICABLE:
            run = _patch(root, item.patch, "--forward")
            if run.returncode != 0:
                failure = f"applying {item.patch.name} failed:\n{run.stdout}{run.stderr}"
                _roll_back(root, done, "--reverse", failure)
                raise PatchError(failure)
            done.append(item.patch)
    return done


def revert(root: Path, patches: list[Path] | None = None) -> list[Path]:
    """Reverse every applied patch, last first; returns those reverted now. All-or-nothing."""
    patches = patches or patch_files()
    states = status(root, patches)
    _refuse_conflicts(states)
    done: list[Path] = []
    for item in reversed(states):
        if item.state is PatchState.APPLIED:
            run = _patch(root, item.patch, "--reverse")
            if run.returncode != 0:
                failure = f"reverting {item.patch.name} failed:\n{run.stdout}{run.stderr}"
                _roll_back(root, done, "--forward", failure)
                raise PatchError(failure)
            done.append(item.patch)
    return done


def _roll_back(root: Path, done: list[Path], flag: str, failure: str) -> None:
    """Undo `done`, last first, with `flag`; raises RollbackError naming every undo that failed."""
    failed = []
    for patch in reversed(done):
        run = _patch(root, patch, flag)
        if run.returncode != 0:
            failed.append(f"{patch.name} (patch {flag} exited {run.returncode}):\n{run.stdout}{run.stderr}")
    if failed:
        raise RollbackError(
            f"{failure}\nROLLBACK FAILED, {root} is left half-done; undo by hand:\n" + "\n".join(failed)
        )


def _refuse_conflicts(states: list[PatchStatus]) -> None:
    conflicts = [item for item in states if item.state is PatchState.CONFLICT]
    if conflicts:
        names = ", ".join(item.patch.name for item in conflicts)
        raise PatchError(
            f"{names} neither apply nor reverse cleanly (not SGLang {SGLANG_VERSION}?); nothing changed"
        )
