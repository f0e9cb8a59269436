"""`--feather-*` flags on SGLang's real parser, their validation, and the plugin's hook wiring."""

from __future__ import annotations

import argparse
import pickle

import pytest
from conftest import batch, decode_plan, feather_policy, group_prompt, make_cache, make_req, scheduler_view
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.managers.schedule_policy import PrefillAdder
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
from sglang.srt.server_args import ServerArgs

from sglang_feather.admission import AdmissionConfig
from sglang_feather.sglang import plugin
from sglang_feather.sglang.options import (
    FEATHER,
    FeatherOptions,
    FeatherOptionsError,
    attach,
    options_of,
)


@pytest.fixture
def parser():
    """SGLang's server parser with the plugin's two additions (choice and flags), undone afterwards."""
    choices = plugin.policy_choices()
    added = FEATHER not in choices
    if added:
        choices.append(FEATHER)
    parser = argparse.ArgumentParser(prog="sglang serve")
    add_cli_args = _wrap_fn(ServerArgs.add_cli_args, plugin._after_add_cli_args, HookType.AFTER)
    add_cli_args(parser)
    yield parser
    if added:
        choices.remove(FEATHER)


def _server_args(parser, argv):
    from_cli_args = _wrap_fn(ServerArgs.from_cli_args.__func__, plugin._after_from_cli_args, HookType.AFTER)
    return from_cli_args(ServerArgs, parser.parse_args(["--model-path", "dummy", *argv]))


def test_flags_reach_the_scheduler_process_with_server_args(parser, tmp_path):
    argv = [
        "--schedule-policy=feather",
        "--feather-chunk-size=32",
        "--feather-stopper=static",
        '--feather-stopper-options={"max_chunk_loss": 3}',
        f"--feather-state-path={tmp_path / 'state.json'}",
        "--feather-max-wait-s=none",
        "--feather-seed=5",
        "--feather-self-check-interval-s=0",
    ]
    server_args = _server_args(parser, argv)
    expected = FeatherOptions(
        AdmissionConfig(
            chunk_size=32,
            stopper="static",
            stopper_options={"max_chunk_loss": 3},
            state_path=str(tmp_path / "state.json"),
            max_wait_s=None,
            seed=5,
        ),
        self_check_interval_s=0.0,
    )
    assert options_of(server_args) == expected
    assert options_of(pickle.loads(pickle.dumps(server_args))) == expected


def test_defaults(parser):
    server_args = _server_args(parser, ["--schedule-policy", "feather"])
    assert options_of(server_args) == FeatherOptions()
    assert FeatherOptions().admission.stopper == "always"
    plain = _server_args(parser, ["--schedule-policy", "lpm"])
    assert not hasattr(plain, "_feather_options")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--feather-chunk-size", "0"], "--feather-chunk-size must be a positive integer"),
        (["--feather-stopper", "nope"], r"--feather-stopper must be one of \['always', .*\], got 'nope'"),
        (
            ["--feather-stopper", "static", "--feather-stopper-options", '{"nope": 1}'],
            "--feather-stopper-options do not fit stopper 'static': unknown option",
        ),
        (
            ["--feather-stopper-options", '{"max_chunk_loss": -1}', "--feather-stopper", "static"],
            "--feather-stopper-options .*max_chunk_loss",
        ),
        (["--feather-max-wait-s", "-3"], "--feather-max-wait-s must be"),
        (["--feather-state-path", "/nonexistent-dir/x/state.json"], "--feather-state-path .* does not exist"),
        (["--feather-batch-order", "dfs"], "--feather-batch-order must be one of"),
        (["--feather-self-check-interval-s", "-1"], "--feather-self-check-interval-s must be .* >= 0"),
        (["--feather-self-check-interval-s", "inf"], "--feather-self-check-interval-s must be a finite"),
    ],
)
def test_bad_values_raise_a_clear_error(parser, argv, message):
    with pytest.raises(FeatherOptionsError, match=message):
        _server_args(parser, ["--schedule-policy", "feather", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedule-policy", "nonsense"], "argument --schedule-policy: invalid choice: 'nonsense'"),
        (["--feather-chunk-size", "big"], "argument --feather-chunk-size: not an integer: 'big'"),
        (["--feather-stopper-options", "{oops"], "argument --feather-stopper-options: not valid JSON"),
        (["--feather-stopper-options", "[1]"], "must be a JSON object"),
        (["--feather-max-wait-s", "soon"], "not a number of seconds"),
        (["--feather-self-check-interval-s", "often"], "not a number of seconds: 'often'"),
    ],
)
def test_malformed_values_are_argparse_errors(parser, argv, message, capsys):
    with pytest.raises(SystemExit):
        _server_args(parser, ["--schedule-policy", "feather", *argv])
    assert message in capsys.readouterr().err


def test_feather_flags_need_the_feather_policy(parser):
    with pytest.raises(FeatherOptionsError, match="only apply with --schedule-policy feather"):
        _server_args(parser, ["--schedule-policy", "lpm", "--feather-chunk-size", "32"])


@pytest.mark.parametrize(
    "argv",
    [["--disaggregation-mode", "prefill"], ["--pp-size", "2"], ["--dllm-algorithm", "LowConfidence"]],
)
def test_scheduler_modes_feather_does_not_mirror_are_refused(parser, argv):
    with pytest.raises(FeatherOptionsError, match="unified scheduler only"):
        _server_args(parser, ["--schedule-policy", "feather", *argv])


def test_attach_ignores_other_policies():
    server_args = ServerArgs(model_path="dummy")
    attach(server_args, None)
    assert options_of(server_args) == FeatherOptions()


def test_scheduler_hooks_through_sglangs_hook_wrappers():
    cache = make_cache()
    policy = feather_policy(cache)
    view = scheduler_view(policy, [])
    get_adder = _wrap_fn(
        Scheduler.get_prefill_adder_class, plugin._after_get_prefill_adder_class, HookType.AFTER
    )
    assert issubclass(get_adder(view), PrefillAdder) and get_adder(view).__name__ == "FeatherPrefillAdder"
    waiting = [make_req("w", group_prompt(0, 32, 0, salt=1))]
    running = batch([make_req("r", group_prompt(0, 32, 0, salt=2))])
    policy.calc_priority(waiting, running)
    gone = running.reqs.pop()
    gone.finished_reason = FINISH_LENGTH(length=1)
    release = _wrap_fn(
        lambda req, tree_cache, *, checkpoint: None, plugin._after_release_kv_cache, HookType.AFTER
    )
    release(gone, cache, checkpoint=False)
    view.waiting_queue = waiting
    plugin._after_get_next_batch_to_run(decode_plan(running), view, running_batch=running, last_batch=None)
    assert gone.rid not in policy.feather.admission.tree and "w" in policy.feather.admission.tree


def test_hooks_applied_twice_stay_single(parser):
    """SGLang can run `load_plugins()` twice in one process; the flags and the adder must not stack."""
    from sglang_feather.sglang.options import add_cli_args
    from sglang_feather.sglang.policy import FeatherAdderMixin

    add_cli_args(parser)
    assert parser.parse_args(["--model-path", "m", "--feather-chunk-size", "32"]).feather_chunk_size == 32
    policy = feather_policy(make_cache())
    view = scheduler_view(policy, [])
    once = plugin._after_get_prefill_adder_class(PrefillAdder, view)
    twice = plugin._after_get_prefill_adder_class(once, view)
    assert twice is once
    assert sum(cls is FeatherAdderMixin for cls in twice.__mro__) == 1
