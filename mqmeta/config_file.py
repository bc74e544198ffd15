"""`--config FILE` for the server commands: a TOML file whose keys are the command's flags.

A key has its flag's name in snake_case (`--broker-name` -> `broker_name`, `--id` ->
`node_id`: the flag's argparse dest), a value of the flag's type (a whole number for an
int flag, true/false for a switch, a list of strings for a repeated flag), and a flag
given on the command line wins over the file, which wins over the flag's default.

How: accept_config_file(parser) gives a subcommand's parser its --config option and moves
the flags' defaults aside (to None), so that once argparse has parsed,
apply_config_file(args) can tell a flag the user gave from one they did not, fill the
latter from the file or from the default, and check the flags that argparse no longer
requires (they may come from the file). An unknown key, a key of the wrong type, a
missing or unreadable file and bad TOML are each one InvalidArgument sentence (CLI exit
2) naming the key or the line; values are never shown, so a secret in a file never
reaches a terminal or a log.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.errors import InvalidArgument
from mqmeta.validate import FlagNumber

# The namespace attribute that carries a parser's _Spec from argparse to apply_config_file.
SPEC_DEST = "_config_file_spec"
# tomllib's messages end with "(at line L, column C)" or "(at end of document)".
_TOML_WHERE = re.compile(r"\s*\(at (?:line (\d+), column \d+|end of document)\)$")


@dataclass(frozen=True)
class _Spec:
    actions: dict[str, argparse.Action]  # by key (the flag's dest)
    defaults: dict[str, Any]
    required: tuple[str, ...]  # keys that argparse required before accept_config_file
    tables: tuple[str, ...]  # tables handed to the part as dicts (e.g. raft_settings)
    section: str  # "": flags are top-level keys; else they live in [section], the part judges the rest
    parser: argparse.ArgumentParser


def load_toml(path: Path) -> dict[str, Any]:
    """The parsed file; InvalidArgument when it is missing, unreadable or not TOML (with the line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgument(f"config file {path} does not exist; give the path of a TOML file") from None
    except UnicodeDecodeError:
        raise InvalidArgument(f"config file {path} is not UTF-8 text; save it as UTF-8 TOML") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_WHERE.search(message)
        what = message[: found.start()] if found else message
        line = found.group(1) if found and found.group(1) else str(max(1, len(text.splitlines())))
        raise InvalidArgument(f"config file {path} is not valid TOML at line {line}: {what}") from None


def accept_config_file(
    parser: argparse.ArgumentParser, tables: tuple[str, ...] = (), section: str = ""
) -> None:
    """Let `parser`'s command take --config FILE (added unless it has one already).

    tables: TOML tables passed through as dicts (args.<table>, {} when absent), for the
    part to validate. section: the flags' keys live in this table ([replicator]) and the
    part validates the file's other keys and tables itself."""
    if "config" not in _actions(parser):
        parser.add_argument("--config", type=Path, help="TOML file with any of these flags as keys")
    actions = _actions(parser)
    actions.pop("config")
    defaults = {key: action.default for key, action in actions.items()}
    required = tuple(key for key, action in actions.items() if action.required)
    for action in actions.values():
        action.default = None  # None after parsing = not given on the command line
        action.required = False  # checked after the merge: the file may give it
    spec = _Spec(actions, defaults, required, tables, section, parser)
    parser.set_defaults(**{SPEC_DEST: spec})


def extend_config_file(
    parser: argparse.ArgumentParser, add_flags: Callable[[argparse.ArgumentParser], None]
) -> None:
    """`add_flags(parser)`, on a parser that already took accept_config_file() or not: its
    new flags become keys of the --config file like the others (flags added to every
    subcommand at once, e.g. --tls-*, come after each part's own accept_config_file())."""
    spec: _Spec | None = parser.get_default(SPEC_DEST)
    before = set(_actions(parser))
    add_flags(parser)
    if spec is None:
        return
    for key, action in _actions(parser).items():
        if key not in before:
            assert not action.required, f"{key}: a late flag cannot be required"
            spec.actions[key] = action
            spec.defaults[key] = action.default
            action.default = None  # None after parsing = not given on the command line


def apply_config_file(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the flags not given on the command line from args.config, then from their defaults."""
    spec: _Spec | None = getattr(args, SPEC_DEST, None)
    if spec is None:
        return args
    delattr(args, SPEC_DEST)
    late = sorted(set(_actions(spec.parser)) - set(spec.actions) - {"config"})
    # A bug, not bad input: that flag's default was never moved aside, so the file could not set it.
    assert not late, f"flags {late} were added after accept_config_file(); call it after the last flag"
    path: Path | None = getattr(args, "config", None)
    document = load_toml(path) if path is not None else {}
    where = str(path)
    values = _flag_values(spec, document, where)
    for table in spec.tables:
        value = document.get(table, {})
        if not isinstance(value, dict):
            raise InvalidArgument(f"{table!r} in {where} must be a table: write [{table}] above its keys")
        setattr(args, table, value)
    for key, action in spec.actions.items():
        if getattr(args, key) is not None:
            continue  # given on the command line: it wins
        if key in values:
            setattr(args, key, _typed(action, key, values[key], spec.defaults[key], where))
        else:
            default = spec.defaults[key]
            if isinstance(default, str) and callable(action.type) and action.type is not str:
                default = action.type(default)  # as argparse converts a string default
            setattr(args, key, default)
    missing = [spec.actions[key] for key in spec.required if getattr(args, key) is None]
    if missing:
        flags = ", ".join(action.option_strings[0] for action in missing)
        keys = ", ".join(action.dest for action in missing)
        raise InvalidArgument(f"missing {flags}: give them as flags or as keys ({keys}) of a --config file")
    return args


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    # argparse keeps a parser's actions in `_actions` only (its help formatter walks them too).
    return {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def _flag_values(spec: _Spec, document: dict[str, Any], where: str) -> dict[str, Any]:
    if spec.section:
        values = document.get(spec.section, {})
        if not isinstance(values, dict):
            raise InvalidArgument(f"{spec.section!r} in {where} must be a table: write [{spec.section}]")
        return {key: value for key, value in values.items() if key in spec.actions}
    known = sorted([*spec.actions, *spec.tables])
    for key in document:
        if key not in known:
            import difflib  # only for a mistake: not in a running server's memory

            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidArgument(f"unknown key {key!r} in {where}{hint}; known keys: {', '.join(known)}")
    return {key: value for key, value in document.items() if key in spec.actions}


def _typed(action: argparse.Action, key: str, value: Any, default: Any, where: str) -> Any:
    """The value a flag would have had: checked against the flag's type, converted like argparse."""
    if action.nargs == 0:  # a switch (store_true / store_false)
        if not isinstance(value, bool):
            raise _wrong_type(key, where, "true or false", value)
        return action.const if value else default
    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise _wrong_type(key, where, 'a list, e.g. ["..."]', value)
        return [_scalar(action, key, item, where) for item in value]
    return _scalar(action, key, value, where)


def _scalar(action: argparse.Action, key: str, value: Any, where: str) -> Any:
    if isinstance(action.type, FlagNumber):  # a bounded number: the flag's type, then its range
        whole = action.type.kind is int
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            raise _wrong_type(key, where, "a whole number" if whole else "a number", value)
        return action.type.check(value, key, where)
    if action.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong_type(key, where, "a whole number", value)
        converted: Any = value
    elif action.type is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _wrong_type(key, where, "a number", value)
        converted = float(value)
    elif not isinstance(value, str):
        raise _wrong_type(key, where, "a string in quotes", value)
    elif callable(action.type):
        try:
            converted = action.type(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise InvalidArgument(f"key {key!r} in {where} has a malformed value; see --help") from None
    else:
        converted = value
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(repr(choice) for choice in action.choices)
        raise InvalidArgument(f"key {key!r} in {where} must be one of {choices}")
    return converted


def _wrong_type(key: str, where: str, expected: str, value: Any) -> InvalidArgument:
    # The value's TOML type only, never the value: it may be a secret.
    return InvalidArgument(f"key {key!r} in {where} must be {expected}, not {_toml_type(value)}")


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"
