"""Declared options: a config field's name, default, help, choices and check, from which flags and keys are made."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

# How it works.
#
# A config dataclass declares each user-facing field with `option(...)`: its default, a metavar, one line of
# help, how command-line text becomes a value (`parse`) and what makes a value wrong (`check`, or `choices`).
# The dataclass calls `check_options(self)` in `__post_init__`, so a value is validated once whichever surface
# it came from. Each surface only spells the name: SGLang's and the simulator's `--feather-max-wait-s` flags
# (`add_flags`, `given_flags`), vLLM's `additional_config["feather"]["max_wait_s"]` key; a `ConfigError`
# carries the field name and `shown_as` renames it into the spelling the user typed. The workload spec
# (`sglang_feather.workload`) declares its fields the same way, spelt without the prefix (`--num-groups`).

T = TypeVar("T")

_KEY = "sglang_feather.option"
FLAG_PREFIX = "--feather-"
"""Every engine's command line spells option `max_wait_s` as `--feather-max-wait-s`."""


class ConfigError(ValueError):
    """An option has an invalid value; the message names the option as the user wrote it."""

    def __init__(self, option: str, problem: str, shown_as: str | None = None) -> None:
        super().__init__(f"{shown_as or option} {problem}")
        self.option = option
        self.problem = problem

    def shown_as(self, name: str) -> ConfigError:
        """The same error naming the option as one surface spells it (a flag, a config key)."""
        return type(self)(self.option, self.problem, name)


@dataclass(frozen=True)
class Option:
    """A config field offered to users."""

    name: str
    default: Any
    metavar: str
    help: str
    parse: Callable[[str], Any]
    """Command-line text to a value; ValueError says what is malformed."""
    check: Callable[[Any], str | None] | None = None
    """What is wrong with a value ("must be ..., got ..."), or None when it is valid."""
    choices: Callable[[], Sequence[str]] | None = None
    """The valid values, for a field that takes a name (the check then is membership)."""
    prefix: str = FLAG_PREFIX
    """What the command-line spelling puts before the name."""

    def problem(self, value: Any) -> str | None:
        if self.choices is not None and value not in self.choices():
            return f"must be one of {sorted(self.choices())}, got {value!r}"
        return None if self.check is None else self.check(value)

    def flag(self) -> str:
        return self.prefix + self.name.replace("_", "-")

    def dest(self) -> str:
        return self.flag().lstrip("-").replace("-", "_")

    def flag_help(self) -> str:
        choices = f" ({', '.join(self.choices())})" if self.choices is not None else ""
        return f"{self.help}{choices}; default {show(self.default)}."


def flag(name: str) -> str:
    """The command-line spelling of option `name`."""
    return FLAG_PREFIX + name.replace("_", "-")


def option(
    default: Any = MISSING,
    *,
    metavar: str,
    help: str,
    parse: Callable[[str], Any],
    check: Callable[[Any], str | None] | None = None,
    choices: Callable[[], Sequence[str]] | None = None,
    default_factory: Callable[[], Any] | Any = MISSING,
) -> Any:
    """A dataclass field declared as an option (see `Option`)."""
    spec = {"metavar": metavar, "help": help, "parse": parse, "check": check, "choices": choices}
    return field(default=default, default_factory=default_factory, metadata={_KEY: spec})


def declared(cls: type, *, prefix: str = FLAG_PREFIX) -> tuple[Option, ...]:
    """The options a config dataclass declares, in field order, spelt on command lines with `prefix`."""
    return tuple(
        Option(
            f.name,
            f.default if f.default_factory is MISSING else f.default_factory(),
            **f.metadata[_KEY],
            prefix=prefix,
        )
        for f in fields(cls)
        if _KEY in f.metadata
    )


def check_options(config: Any, error: type[ConfigError] = ConfigError) -> None:
    """Raise `error` for the first declared field of `config` whose value is invalid."""
    for opt in declared(type(config)):
        problem = opt.problem(getattr(config, opt.name))
        if problem is not None:
            raise error(opt.name, problem)


def build(cls: type[T], values: Mapping[str, Any], name: Callable[[str], str], **engine_set: Any) -> T:
    """`cls(**values, **engine_set)`, its ConfigError naming the option as `name(field)` spells it."""
    try:
        return cls(**values, **engine_set)
    except ConfigError as err:
        raise err.shown_as(name(err.option)) from None


def show(value: Any) -> str:
    """A value as a command line writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    return str(value)


# ----------------------------------------------------------------- command lines


def add_flags(
    parser: argparse.ArgumentParser | Any,
    options: Iterable[Option],
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Add a flag per option (with the extra spellings `aliases[name]`); a flag not given leaves no attribute
    (the dataclass default applies), so the default is written once, on the field."""
    for opt in options:
        parser.add_argument(
            opt.flag(),
            *(aliases or {}).get(opt.name, ()),
            dest=opt.dest(),
            type=_argparse_type(opt),
            metavar=opt.metavar,
            help=opt.flag_help(),
            default=argparse.SUPPRESS,
        )


def given_flags(args: argparse.Namespace, options: Iterable[Option]) -> dict[str, Any]:
    """{field name: value} of the flags given on the command line."""
    return {opt.name: getattr(args, opt.dest()) for opt in options if hasattr(args, opt.dest())}


def _argparse_type(opt: Option) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return opt.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = opt.name
    return parse


def _parser(convert: Callable[[str], T], what: str) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return convert(text)
        except ValueError:
            raise ValueError(f"not {what}: {text!r}") from None

    return parse


def _or_none(parse: Callable[[str], T]) -> Callable[[str], T | None]:
    return lambda text: None if text.strip().lower() == "none" else parse(text)


parse_int = _parser(int, "an integer")
parse_float = _parser(float, "a number")
parse_int_or_none = _or_none(parse_int)
parse_float_or_none = _or_none(parse_float)
parse_seconds_or_none = _or_none(_parser(float, "a number of seconds"))


def parse_on_off(text: str) -> bool:
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(text.lower())
    if value is None:
        raise ValueError(f"expected on or off, got {text!r}")
    return value


def parse_path_or_none(text: str) -> str | None:
    return None if text.strip().lower() == "none" else text


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object, e.g. '{\"max_chunk_loss\": 3}'")
    return value


# ----------------------------------------------------------------- checks


def positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a positive integer, got {value!r}"
    return None


def non_negative_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"must be an integer >= 0, got {value!r}"
    return None


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def non_negative_number(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else f"must be a finite number >= 0, got {value!r}"


def positive_number_or_none(value: Any) -> str | None:
    if value is None or (_is_number(value) and value > 0):
        return None
    return f"must be a finite number > 0, or none, got {value!r}"


def integer(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {value!r}"
    return None


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be on or off (true or false), got {value!r}"


def positive_int_or_none(value: Any) -> str | None:
    return None if value is None else positive_int(value)


def seconds_or_none(value: Any) -> str | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        return f"must be a finite number of seconds > 0, or none (null) to disable, got {value!r}"
    return None


def object_of_names(value: Any) -> str | None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return f"must be a JSON object of option names to values, got {value!r}"
    return None


def file_in_existing_dir(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | Path) or not str(value):
        return f"must be a file path, got {value!r}"
    folder = Path(value).expanduser().resolve().parent
    if not folder.is_dir():
        return f"{str(value)!r}: directory {str(folder)!r} does not exist"
    return None
