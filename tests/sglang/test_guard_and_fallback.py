"""Startup guard (SGLang version and hook signatures) and the FCFS fallback when Feather raises in a pass."""

from __future__ import annotations

import importlib.metadata

import pytest
from conftest import (
    FakeClock,
    adder_pass,
    batch,
    feather_policy,
    group_prompt,
    idle_plan,
    make_allocator,
    make_cache,
    make_req,
    scheduler_view,
)
from prometheus_client import CollectorRegistry

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sglang import plugin
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import FeatherOptions
from sglang_feather.sglang.scheduler_hooks import on_queued, on_step_end


def test_installed_sglang_passes_the_guard():
    assert plugin.check_sglang() is None


def test_other_sglang_version_is_refused_naming_the_supported_one(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.5.24" if name == "sglang" else real(name)
    )
    message = plugin.check_sglang()
    assert "0.5.23" in message and "0.5.24" in message


def test_moved_or_changed_hook_target_is_refused(monkeypatch):
    hooks = dict(plugin.HOOKS)
    hooks["sglang.srt.managers.scheduler.Scheduler.no_such_method"] = (None, ("self",))
    monkeypatch.setattr(plugin, "HOOKS", hooks)
    assert "no_such_method" in plugin.check_sglang()
    hooks.pop("sglang.srt.managers.scheduler.Scheduler.no_such_method")
    target = "sglang.srt.managers.scheduler.Scheduler._add_request_to_queue"
    hooks[target] = (None, ("self", "request"))
    assert target in plugin.check_sglang()


def test_choosing_feather_on_a_refused_sglang_fails_at_startup(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(plugin, "_startup_error", "sglang-feather supports SGLang 0.5.23 only, found 9.9")
    with pytest.raises(plugin.FeatherStartupError, match="0.5.23"):
        plugin._refuse_feather(None, None, SimpleNamespace(schedule_policy="feather"))
    plugin._refuse_feather(None, None, SimpleNamespace(schedule_policy="lpm"))


def test_exception_in_a_pass_falls_back_to_fcfs_and_the_tree_is_rebuilt(monkeypatch):
    registry = CollectorRegistry()
    labels = {"model_name": "tiny"}
    allocator = make_allocator()
    cache = make_cache(allocator)
    policy = feather_policy(
        cache,
        FeatherOptions(AdmissionConfig(chunk_size=16, stopper="always")),
        FakeClock(),
        FeatherMetrics(labels, registry),
    )
    runtime = policy.feather
    waiting: list = []
    view = scheduler_view(policy, waiting)
    reqs = [make_req(f"r{i}", group_prompt(i % 2, 32, 40 - 10 * i, salt=i)) for i in range(4)]
    for req in reqs:
        waiting.append(req)
        on_queued(view, req)

    def boom(*_args, **_kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(runtime.admission, "decide", boom)
    running = batch()
    admitted = adder_pass(policy, cache, allocator, waiting, running)
    assert [r.rid for r in admitted] == ["r0", "r1", "r2", "r3"], "FCFS, nothing lost"
    assert runtime.num_errors == 1
    assert registry.get_sample_value("sglang:feather_errors_total", labels) == 1
    monkeypatch.undo()
    running.reqs.extend(admitted)
    waiting.clear()
    on_step_end(view, idle_plan(running))
    tree = policy.feather.admission.tree
    tree.check_invariants()
    assert set(tree.active_ids()) == {r.rid for r in reqs} and tree.num_waiting == 0
