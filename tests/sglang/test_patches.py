"""The source patch set: applies to a pristine copy of the installed SGLang and gives the plugin's behaviour."""

from __future__ import annotations

import ast
import filecmp
import inspect
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_feather.patches import (
    PatchError,
    PatchState,
    apply,
    installed_root,
    patch_files,
    revert,
    status,
    touched_files,
)
from sglang_feather.sglang import plugin

pytestmark = pytest.mark.slow
"""Patches and probes a copy of SGLang in subprocesses (about a minute of CPU): `make test`, not `make test-fast`."""

PROBE = Path(__file__).with_name("probe_admission.py")
PROBE_ARGS = ["feather,lpm,fcfs", "--feather-chunk-size", "32", "--feather-stopper", "static"]


def _pristine_copy(dest: Path) -> Path:
    """The installed `sglang/` as a tree of symlinks, except real copies of the files the patches touch.

    Their stale byte-code is dropped, so Python compiles the patched sources into the copy's own
    `__pycache__`; nothing under site-packages is ever written.
    """
    source = installed_root() / "sglang"
    root = dest / "root"
    shutil.copytree(source, root / "sglang", copy_function=os.symlink)
    for rel in touched_files():
        target = root / rel
        target.unlink()
        shutil.copyfile(installed_root() / rel, target)
        for pyc in (target.parent / "__pycache__").glob(target.stem + ".*.pyc"):
            pyc.unlink()
    return root


def _probe(args: list[str], *, root: Path | None, plugins: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SGLANG_PLUGINS", None)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, str(PROBE), *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def _result(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched_root(tmp_path_factory) -> Path:
    root = _pristine_copy(tmp_path_factory.mktemp("sglang-copy"))
    assert {item.state for item in status(root)} == {PatchState.APPLICABLE}
    applied = apply(root)
    assert [p.name for p in applied] == [p.name for p in patch_files()]
    return root


def test_patch_set_touches_only_five_files_and_calls_into_sglang_feather():
    assert touched_files() == [
        "sglang/srt/arg_groups/fields/schedule.py",
        "sglang/srt/server_args.py",
        "sglang/srt/managers/scheduler.py",
        "sglang/srt/mem_cache/common.py",
        "sglang/srt/managers/schedule_batch.py",
    ]
    added = [
        line
        for patch in patch_files()
        for line in patch.read_text().splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert len(added) < 60, "the patch set should stay a thin set of calls into sglang_feather"
    assert sum("sglang_feather" in line for line in added) >= 10


def _feather_imports(tree: ast.AST, *, guarded: bool) -> set[str]:
    """Names imported from sglang_feather under `tree`; with `guarded`, only inside an `if` that tests for
    the `feather` policy."""
    scopes = [tree]
    if guarded:
        scopes = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "'feather'" in ast.unparse(node.test)
        ]
    return {
        alias.name
        for scope in scopes
        for node in ast.walk(scope)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang_feather")
        for alias in node.names
    }


def _patched_function(root: Path, target: str) -> ast.AST:
    obj = pkgutil.resolve_name(target)
    module = ast.parse((root / (obj.__module__.replace(".", "/") + ".py")).read_text())
    scope: ast.AST = module
    for name in obj.__qualname__.split("."):
        scope = next(
            node
            for node in ast.iter_child_nodes(scope)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name
        )
    return scope


@pytest.mark.parametrize("target", [t for t in plugin.HOOKS if not t.startswith(plugin.SERVER_ARGS)])
def test_patched_sglang_calls_what_the_plugin_hook_calls(patched_root, target):
    """Every scheduler hook the plugin registers has its call in the patch set, behind the feather guard
    (the `ServerArgs` hooks are patch 0002, checked by the probes below)."""
    hook = plugin.HOOKS[target][0]
    wanted = _feather_imports(ast.parse(textwrap.dedent(inspect.getsource(hook))), guarded=False)
    assert wanted, f"the plugin's hook for {target} calls nothing in sglang_feather"
    assert wanted <= _feather_imports(_patched_function(patched_root, target), guarded=True)


def test_installed_sglang_is_pristine():
    assert {item.state for item in status(installed_root())} == {PatchState.APPLICABLE}


def test_apply_is_idempotent_and_revert_restores_the_pristine_files(patched_root, tmp_path):
    root = _pristine_copy(tmp_path)
    apply(root)
    assert {item.state for item in status(root)} == {PatchState.APPLIED}
    assert apply(root) == []
    for rel in touched_files():
        assert not filecmp.cmp(root / rel, installed_root() / rel, shallow=False)
    assert len(revert(root)) == len(patch_files())
    for rel in touched_files():
        assert filecmp.cmp(root / rel, installed_root() / rel, shallow=False)
    assert revert(root) == []


def test_conflicting_tree_is_refused_and_left_untouched(tmp_path):
    root = _pristine_copy(tmp_path)
    scheduler = root / "sglang/srt/managers/scheduler.py"
    text = scheduler.read_text().replace("        return PrefillAdder\n", "        return None\n")
    scheduler.write_text(text)
    with pytest.raises(PatchError, match="0003"):
        apply(root)
    assert scheduler.read_text() == text
    for rel in touched_files()[:2]:
        assert filecmp.cmp(root / rel, installed_root() / rel, shallow=False)


def test_cli_check_reports_the_installed_tree():
    run = subprocess.run(
        [sys.executable, "-m", "sglang_feather.patches", "check"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("applicable") == len(patch_files())


@pytest.fixture(scope="module")
def probes(patched_root) -> dict[str, dict]:
    """One subprocess per SGLang variant, each probing feather, lpm and fcfs."""
    return {
        "pristine": _result(_probe(PROBE_ARGS, root=None, plugins="none")),
        "patched": _result(_probe(PROBE_ARGS, root=patched_root, plugins="none")),
        "plugin": _result(_probe(PROBE_ARGS, root=None, plugins=None)),
        "patched+plugin": _result(_probe(PROBE_ARGS, root=patched_root, plugins=None)),
    }


def test_unpatched_sglang_without_plugin_rejects_feather(probes):
    assert probes["pristine"]["feather"] == {"error": "argument parsing exited with 2"}


def test_patched_sglang_orders_and_admits_like_the_plugin(probes):
    patched, plugin = probes["patched"]["feather"], probes["plugin"]["feather"]
    assert patched["policy_class"] == plugin["policy_class"] == "FeatherSchedulePolicy"
    assert patched["adder_class"] == plugin["adder_class"] == "FeatherPrefillAdder"
    assert patched["options"] == plugin["options"]
    assert "chunk_size=32" in patched["options"]
    assert (
        patched["state_tag"] == plugin["state_tag"] == {"engine": "sglang", "model": "dummy", "device": "cpu"}
    )
    assert patched["order"] == plugin["order"]
    assert patched["admitted"] == plugin["admitted"]
    assert patched["tracked"] == plugin["tracked"]
    assert "late1" in patched["tracked"] and "late0" not in patched["tracked"], "queue events reach Feather"
    groups = [rid.split("-")[1] for rid in patched["admitted"]]
    assert sorted(set(groups)) == ["g0", "g1", "g2"] and len(groups) == 3, "one leader per cold group"


def test_plugin_stays_inactive_on_a_patched_sglang(probes):
    """For scheduling, that is: the attention backend registers on both paths (the test below)."""
    policies = lambda variant: {k: v for k, v in probes[variant].items() if k != "attention"}  # noqa: E731
    assert policies("patched+plugin") == policies("patched")
    assert probes["patched+plugin"]["lpm"]["policy_class"] == "SchedulePolicy"


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_patched_and_plugged_sglang_keep_other_policies(probes, policy):
    pristine = probes["pristine"][policy]
    assert pristine["policy_class"] == "SchedulePolicy"
    assert probes["patched"][policy]["policy_class"] == "SchedulePolicy"
    assert probes["plugin"][policy]["policy_class"] == "FeatherSchedulePolicy"
    assert probes["plugin"][policy]["adder_class"] == pristine["adder_class"] == "PrefillAdder"
    for variant in ("patched", "plugin"):
        assert probes[variant][policy]["order"] == pristine["order"]
        assert probes[variant][policy]["admitted"] == pristine["admitted"]


def _build_kv_cache_events_argument(root: Path) -> str:
    """The source of the `enable_kv_cache_events=` argument the scheduler passes to `build_kv_cache`."""
    module = ast.parse((root / "sglang/srt/managers/scheduler.py").read_text())
    calls = [
        node
        for node in ast.walk(module)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("build_kv_cache")
    ]
    assert len(calls) == 1, "the scheduler builds its KV cache in one call"
    (keyword,) = [k for k in calls[0].keywords if k.arg == "enable_kv_cache_events"]
    return ast.unparse(keyword.value)


def test_patched_sglang_records_kv_events_for_feather_like_the_plugin(patched_root):
    """The cache tier needs the tree cache's KV events: the patch turns them on for feather, as the plugin's
    BEFORE hook on `build_kv_cache` does, and leaves other policies as SGLang has them."""
    pristine = _build_kv_cache_events_argument(installed_root())
    patched = _build_kv_cache_events_argument(patched_root)
    assert "feather" not in pristine
    assert patched == f"{pristine} or self.schedule_policy == 'feather'"
    feather = SimpleNamespace(schedule_policy="feather")
    other = SimpleNamespace(schedule_policy="lpm")
    args, kwargs = plugin._before_build_kv_cache(server_args=feather, enable_kv_cache_events=False)
    assert args == () and kwargs == {"server_args": feather, "enable_kv_cache_events": True}
    assert plugin._before_build_kv_cache(server_args=other, enable_kv_cache_events=False) is None
    assert plugin._before_build_kv_cache(server_args=feather, enable_kv_cache_events=True) is None


def test_grouped_attention_registers_through_the_plugin_with_or_without_the_patch_set(probes):
    """`--attention-backend feather_grouped` comes from the plugin entry point alone: without plugins SGLang
    rejects it, patched or not; with them it parses on both paths and resolves as torch_native does (CUDA
    graphs off for decode and prefill, no Triton helpers)."""
    for variant in ("pristine", "patched"):
        assert probes[variant]["attention"] == {"error": "argument parsing exited with 2"}
    for variant in ("plugin", "patched+plugin"):
        attention = probes[variant]["attention"]
        assert attention["registered"] is True
        assert attention["feather_grouped"] == attention["torch_native"]
        assert attention["feather_grouped"] == {
            "cuda_graphs": ["disabled", "disabled"],
            "support_triton": False,
        }
