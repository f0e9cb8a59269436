"""The patch tool's rollback: a failed patch undoes the ones done before it, and a failed undo is reported."""

from __future__ import annotations

import subprocess

import pytest

from sglang_feather import patches
from sglang_feather.patches import PatchError, RollbackError, __main__, patch_files


class FakePatch:
    """GNU patch on a tree where every patch applies; the real run of `fail` and the undos in `undo_fails`
    exit 1. Records each real (not dry) run as (patch name, direction)."""

    def __init__(self, fail: str, undo_fails: tuple[str, ...] = ()) -> None:
        self.fail, self.undo_fails, self.runs = fail, undo_fails, []

    def __call__(self, root, patch, *flags) -> subprocess.CompletedProcess:
        if "--dry-run" in flags:
            return subprocess.CompletedProcess([], 0 if "--forward" in flags else 1, "", "")
        self.runs.append((patch.name, flags[0]))
        undo = flags[0] == "--reverse"
        failed = patch.name == self.fail if not undo else patch.name in self.undo_fails
        return subprocess.CompletedProcess([], 1 if failed else 0, "", f"hunk FAILED in {patch.name}")


@pytest.fixture
def root(tmp_path):
    (tmp_path / "sglang").mkdir()
    return tmp_path


def test_a_failed_patch_undoes_the_ones_before_it(root, monkeypatch):
    names = [p.name for p in patch_files()]
    fake = FakePatch(fail=names[2])
    monkeypatch.setattr(patches, "_patch", fake)
    with pytest.raises(PatchError, match=f"applying {names[2]} failed") as err:
        patches.apply(root)
    assert not isinstance(err.value, RollbackError)
    assert fake.runs == [(n, "--forward") for n in names[:3]] + [
        (names[1], "--reverse"),
        (names[0], "--reverse"),
    ]


def test_a_failed_undo_is_reported_as_a_half_done_tree(root, monkeypatch, capsys):
    names = [p.name for p in patch_files()]
    fake = FakePatch(fail=names[2], undo_fails=(names[1],))
    monkeypatch.setattr(patches, "_patch", fake)
    with pytest.raises(RollbackError) as err:
        patches.apply(root)
    message = str(err.value)
    assert "ROLLBACK FAILED" in message and "half-done" in message
    assert f"{names[1]} (patch --reverse exited 1)" in message and f"hunk FAILED in {names[1]}" in message
    assert names[0] not in message.split("ROLLBACK FAILED")[1], "the undo that worked is not listed"
    assert (names[0], "--reverse") in fake.runs, "the other undos still run"
    assert __main__.main(["apply", "--root", str(root)]) == 3
    assert "ROLLBACK FAILED" in capsys.readouterr().err
