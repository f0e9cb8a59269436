"""Feather's options are declared once: SGLang's flags, vLLM's keys and the simulator's flags agree with them."""

from __future__ import annotations

import argparse
import pickle
import re
from dataclasses import fields
from pathlib import Path

import pytest

from sglang_feather.admission import AdmissionConfig, ConfigError
from sglang_feather.options import Option, declared, flag, show
from sglang_feather.policy import policy_names
from sglang_feather.sglang import options as sglang_options
from sglang_feather.sim import cli as sim_cli
from sglang_feather.vllm import config as vllm_config

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {opt.name: opt for opt in declared(AdmissionConfig)}

VALID = {
    "chunk_size": ("32", 32),
    "stopper": ("static", "static"),
    "stopper_options": ('{"exploration": 0.25}', {"exploration": 0.25}),
    "stop_scope": ("pass", "pass"),
    "max_wait_s": ("none", None),
    "state_path": ("{tmp}/state.json", "{tmp}/state.json"),
    "seed": ("5", 5),
    "defer_uncached_prefix": ("off", False),
    "concentrate": ("off", False),
    "due_when_overtaken": ("off", False),
}
"""Per option, a valid non-default value: (command-line text, JSON value)."""

COMPANIONS = {"stopper_options": {"stopper": ("ucb", "ucb")}}
"""Options whose value is valid only beside another's non-default value (`ucb`'s options; the default stopper,
`always`, takes none): (command-line text, JSON value) of each."""

INVALID = {
    "chunk_size": ("0", 0),
    "stopper": ("nope", "nope"),
    "stopper_options": ('{"nope": 1}', {"nope": 1}),
    "stop_scope": ("everything", "everything"),
    "max_wait_s": ("-3", -3),
    "state_path": ("/nonexistent-dir/x/state.json", "/nonexistent-dir/x/state.json"),
    "seed": (None, 1.5),
    "defer_uncached_prefix": (None, "off"),
    "concentrate": (None, "off"),
    "due_when_overtaken": (None, 1),
}
"""Per option, a value that parses but is invalid: (command-line text or None when no text parses to an invalid
value, JSON value)."""

MALFORMED = {
    "chunk_size": "big",
    "stopper_options": "{oops",
    "max_wait_s": "soon",
    "seed": "x",
    "defer_uncached_prefix": "maybe",
    "concentrate": "maybe",
    "due_when_overtaken": "sometimes",
}
"""Per option, command-line text that does not parse."""


def _sglang(argv: list[str]) -> sglang_options.FeatherOptions:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule-policy")
    sglang_options.add_cli_args(parser)
    return sglang_options.options_from_namespace(parser.parse_args(["--schedule-policy", "feather", *argv]))


def _sim(argv: list[str]) -> AdmissionConfig:
    return sim_cli.admission_config(sim_cli.build_parser().parse_args(argv))


def _vllm(section: dict) -> AdmissionConfig:
    return vllm_config.admission_config({"feather": section}, chunk_size=64, page_size=16, state_tag={})


def _options_of(config: AdmissionConfig) -> dict:
    return {name: getattr(config, name) for name in OPTIONS}


def test_the_tables_cover_every_option():
    assert set(VALID) == set(INVALID) == set(OPTIONS)
    assert set(MALFORMED) <= set(OPTIONS)


def test_every_option_is_on_every_surface_unless_that_surface_says_why():
    sglang_flags = {opt.flag() for opt in sglang_options.FLAGS}
    sim_flags = {s for a in sim_cli.build_parser()._actions for s in a.option_strings}
    vllm_keys = {opt.name for opt in vllm_config.options()}
    for name in OPTIONS:
        assert flag(name) in sglang_flags
        assert flag(name) in sim_flags or name in sim_cli.NOT_SIMULATED
        assert name in vllm_keys or name in vllm_config.ENGINE_SET
    assert set(sim_cli.NOT_SIMULATED) | set(vllm_config.ENGINE_SET) <= set(OPTIONS)
    assert all(reason for reason in {**sim_cli.NOT_SIMULATED, **vllm_config.ENGINE_SET}.values())
    assert set(OPTIONS) - set(vllm_config.ENGINE_SET) == vllm_keys


def test_defaults_are_the_same_everywhere():
    default = _options_of(AdmissionConfig())
    assert _options_of(_sglang([]).admission) == default
    assert _options_of(_sim([])) == default
    assert _options_of(_vllm({})) == {**default, "chunk_size": 64}
    assert (
        default["stopper"] == "always" and default["max_wait_s"] == 300.0 and default["defer_uncached_prefix"]
    )


def test_help_shows_the_declared_default():
    helps = {a.option_strings[0]: a.help for a in sim_cli.build_parser()._actions if a.option_strings}
    for opt in sim_cli.FEATHER_FLAGS:
        assert helps[opt.flag()].endswith(f"default {show(opt.default)}.")
        assert opt.help in helps[opt.flag()]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_a_value_means_the_same_on_every_surface(name, tmp_path):
    text, value = (v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for v in VALID[name])
    companions = COMPANIONS.get(name, {})
    argv = [arg for other, (t, _) in companions.items() for arg in (flag(other), t)] + [flag(name), text]
    values = {other: v for other, (_, v) in companions.items()} | {name: value}
    expected = AdmissionConfig(**values)
    assert getattr(expected, name) != getattr(AdmissionConfig(), name)
    assert _sglang(argv).admission == expected
    if name not in sim_cli.NOT_SIMULATED:
        assert _sim(argv) == expected
    if name not in vllm_config.ENGINE_SET:
        assert _options_of(_vllm(values)) == _options_of(expected)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_an_invalid_value_names_the_flag_or_key_the_user_wrote(name, capsys):
    text, value = INVALID[name]
    with pytest.raises(ConfigError, match=rf"^{name} ") as refused:
        AdmissionConfig(**{name: value})
    problem = refused.value.problem
    if text is not None:
        with pytest.raises(sglang_options.FeatherOptionsError) as err:
            _sglang([flag(name), text])
        assert str(err.value).startswith(f"{flag(name)} ")
        if name not in sim_cli.NOT_SIMULATED:
            with pytest.raises(SystemExit) as exit_:
                _sim([flag(name), text])
            assert str(exit_.value.code).startswith(f"error: {flag(name)} ")
    if name not in vllm_config.ENGINE_SET:
        with pytest.raises(ConfigError) as err:
            _vllm({name: value})
        assert str(err.value) == f'additional_config["feather"]["{name}"] {problem}'


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_text_is_an_argparse_error_naming_the_flag(name, capsys):
    for parse in (_sglang, _sim):
        with pytest.raises(SystemExit):
            parse([flag(name), MALFORMED[name]])
        assert f"argument {flag(name)}: " in capsys.readouterr().err


def test_sglangs_own_options_are_declared_the_same_way():
    own = declared(sglang_options.FeatherOptions)
    assert [o.name for o in own] == ["batch_order", "self_check_interval_s"]
    assert {o.flag() for o in own} <= {o.flag() for o in sglang_options.FLAGS}
    assert _sglang(["--feather-batch-order", "prefix"]).batch_order == "prefix"
    with pytest.raises(sglang_options.FeatherOptionsError, match=r"^--feather-batch-order must be one of"):
        _sglang(["--feather-batch-order", "dfs"])
    assert _sglang(["--feather-self-check-interval-s", "0"]).self_check_interval_s == 0.0
    with pytest.raises(sglang_options.FeatherOptionsError, match=r"^--feather-self-check-interval-s must be"):
        _sglang(["--feather-self-check-interval-s", "-1"])


def test_vllm_refuses_an_option_it_sets_itself_and_says_why():
    with pytest.raises(ValueError, match="chunk_size is always vLLM's block size"):
        _vllm({"chunk_size": 32})


def test_a_config_pickles_to_an_equal_config(tmp_path):
    config = AdmissionConfig(
        stopper="static",
        stopper_options={"max_chunk_loss": 3},
        state_path=str(tmp_path / "s.json"),
        state_tag={"engine": "sglang"},
    )
    assert pickle.loads(pickle.dumps(config)) == config
    options = sglang_options.FeatherOptions(config, batch_order="prefix")
    assert pickle.loads(pickle.dumps(options)) == options


def test_option_checks():
    assert OPTIONS["chunk_size"].problem(True) is not None, "a bool is not a chunk size"
    assert OPTIONS["max_wait_s"].problem(float("inf")) is not None
    assert OPTIONS["max_wait_s"].problem(None) is None
    assert OPTIONS["stopper"].problem("qlearn") is None
    err = ConfigError("max_wait_s", "must be > 0")
    assert str(err) == "max_wait_s must be > 0" and str(err.shown_as("--x")) == "--x must be > 0"
    assert [f.name for f in fields(AdmissionConfig) if f.name not in OPTIONS] == [
        "page_size",
        "state_tag",
        "cache_events",
    ]
    assert all(isinstance(opt, Option) and opt.help and opt.metavar for opt in OPTIONS.values())


def test_the_docs_list_every_flag_and_key():
    sglang_doc = (ROOT / "docs" / "sglang.md").read_text()
    vllm_doc = (ROOT / "docs" / "vllm.md").read_text()
    for opt in sglang_options.FLAGS:
        assert re.search(rf"^\| `{opt.flag()} ", sglang_doc, re.MULTILINE), opt.flag()
    for opt in vllm_config.options():
        assert re.search(rf"^\| `{opt.name}` \|", vllm_doc, re.MULTILINE), opt.name


def test_the_readme_table_lists_every_flag_with_its_vllm_key():
    readme = (ROOT / "README.md").read_text()
    vllm_keys = {opt.name for opt in vllm_config.options()}
    for opt in sglang_options.FLAGS:
        row = re.search(rf"^\| `{opt.flag()}` (.*)$", readme, re.MULTILINE)
        assert row is not None, f"README.md: no row for {opt.flag()}"
        key = f"/ `{opt.name}` |" if opt.name in vllm_keys else "(SGLang only) |"
        assert row[1].startswith(key), f"README.md: the {opt.flag()} row should go on with {key!r}"


def documented_choices(doc: str, first_cell: str) -> list[str]:
    """The names a docs table row lists in its description (its last cell) as `name` or `"name"` (a word of
    letters, digits, `-` and `_`; other code spans, such as a function to call, are not choices)."""
    row = re.search(rf"^\| {re.escape(first_cell)}.*$", doc, re.MULTILINE)
    assert row is not None, f"no row starting {first_cell}"
    cells = re.split(r"(?<!\\)\|", row[0])[1:-1]
    return re.findall(r'`"?([\w-]+)"?`', cells[-1])


def test_the_docs_tables_list_exactly_the_choices_an_option_declares():
    """A row that documents an option with declared choices names exactly those (`name`, or `"name"` as a
    vLLM config value): a choice added to or removed from the declaration (the stopper registry's names for
    the stopper) cannot be missing from the docs or linger there."""
    sglang_doc = (ROOT / "docs" / "sglang.md").read_text()
    vllm_doc = (ROOT / "docs" / "vllm.md").read_text()
    checked = 0
    for opt in OPTIONS.values():
        if opt.choices is None:
            continue
        for where, doc, first_cell in (
            ("docs/sglang.md", sglang_doc, f"`{opt.flag()} "),
            ("docs/vllm.md", vllm_doc, f"`{opt.name}` |"),
        ):
            assert sorted(documented_choices(doc, first_cell)) == sorted(opt.choices()), (
                f"{where}: {opt.name}"
            )
            checked += 1
    assert checked >= 4, "stopper and stop_scope on both surfaces"


def test_the_readme_and_the_policy_page_list_exactly_the_registered_stoppers():
    readme = (ROOT / "README.md").read_text()
    assert sorted(documented_choices(readme, "`--feather-stopper` ")) == policy_names()
    policy_doc = (ROOT / "docs" / "policy.md").read_text()
    listed = re.search(r"`policy_names\(\)` lists the names:\s*(.*?)\.\n", policy_doc, re.DOTALL)
    assert listed is not None, "docs/policy.md lists the stoppers after `policy_names()` lists the names:"
    assert sorted(re.findall(r"`([^`]+)`", listed[1])) == policy_names()


def test_documented_choices_reads_the_description_cell_only():
    doc = '| `--x NAME` | `a` | pick `b` or `"c"` (`names()`), a\\|b |\n'
    assert documented_choices(doc, "`--x ") == ["b", "c"]
