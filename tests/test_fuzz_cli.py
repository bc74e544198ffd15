"""Fuzzed flags for every `mqmeta admin` command: bad input is exit 2 with one sentence.

Property: for every leaf command of `mqmeta admin` (walked from the real parser), argv
with drawn positionals and flag values (edge, huge and negative numbers, non-numbers,
empty, long and non-ASCII text, wrong choices) makes `mqmeta.cli.main` end with exit
status 2 and a last stderr line "mqmeta: error: ...", never a traceback (an exception
escaping main fails the test) and never a hang. The controller address is unreachable
(127.0.0.1:1) with a short --timeout, so every argv that parses ends in "no controller
answered" (exit 2) and nothing is changed anywhere; what a live controller answers to
bad requests is tests/test_fuzz_services.py's part.

Not here: the server commands (controller, namesrv, broker, replicator, local up, chaos,
audit) start processes that run until stopped, and produce/consume wait on a nameserver;
their flags are checked by tests/test_cli.py's bad-input cases.
"""

from __future__ import annotations

import argparse
import collections

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqmeta.cli import EXIT_BAD_INPUT, build_parser, main

pytestmark = [pytest.mark.timeout(300)]

EXAMPLES = 15
EXAMPLES_LONG = 400
UNREACHABLE = "127.0.0.1:1"
TIMEOUT_OK = "0.2"
# --timeout values that must be refused before any call (a valid large one would wait).
TIMEOUTS_BAD = ["nan", "inf", "-inf", "-1", "0", "1e9", "3601", "abc", "", "0x10", "1e400"]
VALUES = [
    "0",
    "-1",
    "1",
    "1024",
    "1025",
    "2147483648",
    "-2147483649",
    "9223372036854775808",
    "99999999999999999999999",
    "1e3",
    "nan",
    "",
    " ",
    "名字",
    "a" * 200,
    "x=y",
    "=",
    "T:A || B",
    "127.0.0.1:1",
    "--json",
]
CASES: collections.Counter[str] = collections.Counter()


def _leaves(
    parser: argparse.ArgumentParser, path: list[str]
) -> list[tuple[list[str], argparse.ArgumentParser]]:
    sub_actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not sub_actions:
        return [(path, parser)]
    found = []
    for name, child in sub_actions[0].choices.items():
        found += _leaves(child, [*path, name])
    return found


def _admin_leaves() -> list[tuple[list[str], argparse.ArgumentParser]]:
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    admin = top.choices["admin"]
    return [(path, leaf) for path, leaf in _leaves(admin, []) if path]


LEAVES = _admin_leaves()


def _value(action: argparse.Action) -> st.SearchStrategy[str]:
    choices = [str(c) for c in action.choices or ()]
    return st.one_of(
        st.sampled_from(VALUES),
        st.text(max_size=20).filter(lambda t: "\x00" not in t),
        *([st.sampled_from(choices)] if choices else []),
    )


@st.composite
def _argv(draw: st.DrawFn, path: list[str], leaf: argparse.ArgumentParser) -> list[str]:
    timeout = draw(st.one_of(st.just(TIMEOUT_OK), st.sampled_from(TIMEOUTS_BAD)))
    argv = ["admin", "--controllers", UNREACHABLE, f"--timeout={timeout}", *path]
    for action in leaf._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:  # a positional: given, with a drawn value (or left out)
            count = 1 if action.nargs in (None, 1) else draw(st.integers(0, 3))
            argv += [draw(_value(action)) for _ in range(count) if draw(st.integers(0, 9))]
        elif draw(st.booleans()):
            flag = action.option_strings[-1]
            if action.nargs == 0:
                argv.append(flag)
            else:
                argv.append(f"{flag}={draw(_value(action))}")  # '=' keeps a value like "-1" a value
    return argv


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    CASES[" ".join(argv[4:5])] += 1
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == EXIT_BAD_INPUT, f"{argv}: exit {code}, stderr {err[-500:]!r}"
    assert lines and lines[-1].startswith("mqmeta: error: "), f"{argv}: stderr {err[-500:]!r}"
    assert "Traceback" not in err, f"{argv}: {err[-2000:]}"


def _fuzz(path: list[str], leaf: argparse.ArgumentParser, examples: int, capsys) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=_argv(path, leaf))
    def case(argv):
        _check(argv, capsys)

    case()


@pytest.mark.parametrize(("path", "leaf"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_admin_flags_fuzzed(path, leaf, capsys):
    _fuzz(path, leaf, EXAMPLES, capsys)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("path", "leaf"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_admin_flags_fuzzed_long(path, leaf, capsys):
    _fuzz(path, leaf, EXAMPLES_LONG, capsys)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--timeout", "nan", "topic", "list"], "--timeout"),  # waited forever
        (["--timeout", "inf", "topic", "list"], "--timeout"),  # waited forever
        (["topic", "create", "T", "--queues", "99999999999"], "must be at most 1024"),  # a traceback
        (["group", "create", "G", "--retry-max-times", "99999999999"], "--retry-max-times"),  # a traceback
        (
            ["group", "create", "G", "--consume-timestamp-ms", "9" * 21],
            "--consume-timestamp-ms",
        ),  # a traceback
        (["elect-master", "--broker-name", "b", "--broker-id", "9" * 23], "--broker-id"),  # a traceback
    ],
)
def test_admin_flags_found_by_fuzzing(argv, fragment, capsys):
    """Each of these inputs was a traceback (a number past its protobuf field) or a wait
    without end (a --timeout of nan or inf to an unreachable controller); now exit 2 with
    one sentence naming the flag."""
    full = ["admin", "--controllers", UNREACHABLE, *argv]
    _check(full, capsys)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(full)
    assert fragment in capsys.readouterr().err and exit_.value.code == EXIT_BAD_INPUT


def test_every_admin_command_is_fuzzed():
    """The walk found the admin commands (a parser change that hid them would fail here)."""
    names = {" ".join(p) for p, _ in LEAVES}
    assert {"topic create", "group update", "config set", "elect-master", "handoff"} <= names
