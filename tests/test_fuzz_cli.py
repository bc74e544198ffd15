"""Fuzzed flags for every `mqmeta admin` command: bad input is exit 2 with one sentence.

Property: for every leaf command of `mqmeta admin` (walked from the real parser), argv
with drawn positionals and flag values (edge, huge and negative numbers, non-numbers,
empty, long and non-ASCII text, wrong choices) makes `mqmeta.cli.main` end with exit
status 2 and a last stderr line "mqmeta: error: ...", never a traceback (an exception
escaping main fails the test) and never a hang. The controller address is unreachable
(127.0.0.1:1) with a short --timeout, so every argv that parses ends in "no controller
answered" (exit 2) and nothing is changed anywhere; what a live controller answers to
bad requests is tests/test_fuzz_services.py's part.

Numbers of the server and data commands (broker, produce, consume, local up, chaos run and
matrix, chaos faultfs; controller, namesrv and replicator have none on the command line): every numeric flag
has a range (a bare int or float flag fails the walk); each out of its range (negative, zero
where meaningless, huge, nan, inf, not a number) is exit 2 with one line naming the flag and
the range, and the range's ends are taken; drawn combinations reach the command exactly when
every number is in range. main()'s dispatch is replaced by a sentinel, so nothing starts. The
same ranges hold for a --config file's keys, and [raft_settings] numbers have theirs.
(What the server commands do with addresses and files: tests/test_cli.py's bad-input cases.)
"""

from __future__ import annotations

import argparse
import collections

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqmeta.cli import EXIT_BAD_INPUT, build_parser, main
from mqmeta.validate import FlagNumber

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


# The numbers of the server and data commands -------------------------------------------------
# Each command's required flags; a numeric flag is added to them. main()'s dispatch is replaced
# by a sentinel, so an argv that parses stops there: nothing starts, nothing waits.
SERVER_COMMANDS: dict[str, list[str]] = {
    "broker": ["--broker-name", "b", "--listen", "127.0.0.1:1", "--controllers", UNREACHABLE],
    "namesrv": ["--listen", "127.0.0.1:1"],
    "controller": [],
    "replicator": [],
    "produce": ["--namesrv", UNREACHABLE, "--topic", "T", "--count", "1"],
    "consume": ["--namesrv", UNREACHABLE, "--topic", "T", "--group", "G"],
    "local up": [],
    "chaos run": ["--fault", "noop"],
    "chaos matrix": ["--faults", "noop"],
    "chaos faultfs lose-power": ["/nonexistent"],
    "chaos faultfs delay": ["/nonexistent"],
    "chaos faultfs fail-fsync": ["/nonexistent"],
}
NUMBERS_BAD = ["nan", "inf", "-inf", "1e400", "99999999999999999999999", "-1", "abc", "", "0x10", "1e3"]


class _Reached(Exception):
    """main() parsed the argv and went on to run the command."""


def _command_leaves() -> dict[str, argparse.ArgumentParser]:
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    leaves = {" ".join(path): leaf for path, leaf in _leaves_of(top)}
    return {name: leaves[name] for name in SERVER_COMMANDS}


def _leaves_of(top: argparse._SubParsersAction) -> list[tuple[list[str], argparse.ArgumentParser]]:
    return [pair for name, child in top.choices.items() for pair in _leaves(child, [name])]


def _numeric(leaf: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in leaf._actions
        if a.option_strings and (a.type in (int, float) or isinstance(a.type, FlagNumber))
    ]


COMMAND_LEAVES = _command_leaves()
NUMERIC_FLAGS = [(name, action) for name, leaf in COMMAND_LEAVES.items() for action in _numeric(leaf)]


def _run_until_dispatch(argv: list[str], monkeypatch, capsys) -> tuple[int | str | None, str]:
    """(exit status, stderr), or ("reached", "") when main() would have run the command."""

    def reached(args):
        raise _Reached()

    monkeypatch.setattr("mqmeta.cli._dispatch", reached)
    try:
        code: int | str | None = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    except _Reached:
        code = "reached"
    return code, capsys.readouterr().err


def _argv_for(command: str, tmp_path, extra: list[str]) -> list[str]:
    argv = [*command.split(), *SERVER_COMMANDS[command]]
    if command in ("broker", "local up", "chaos run", "chaos matrix"):
        argv += ["--data-dir" if command in ("broker", "local up") else "--output-dir", str(tmp_path / "d")]
    return [*argv, *extra]


def test_every_numeric_flag_of_the_server_and_data_commands_has_a_range():
    """A bare int or float flag would take nan, inf, negatives and numbers past any timer."""
    assert {name for name, _ in NUMERIC_FLAGS} == set(SERVER_COMMANDS) - {
        "namesrv",
        "controller",
        "replicator",
    }
    bare = [
        f"{name} {a.option_strings[-1]}" for name, a in NUMERIC_FLAGS if not isinstance(a.type, FlagNumber)
    ]
    assert not bare, f"numeric flags without a range: {bare}"


@pytest.mark.parametrize(
    ("command", "action"), NUMERIC_FLAGS, ids=[f"{n} {a.option_strings[-1]}" for n, a in NUMERIC_FLAGS]
)
def test_a_numeric_flag_out_of_its_range_is_exit_2_naming_flag_and_range(
    command, action, tmp_path, monkeypatch, capsys
):
    bound: FlagNumber = action.type
    flag = action.option_strings[-1]
    below, above = bound.minimum - 1, bound.maximum * 2 + 1
    values = [v for v in NUMBERS_BAD if bound.kind is int or v != "1e3"]  # 1e3 is a fine float
    values += [repr(below) if bound.kind is float else str(int(below)), str(int(above))]
    if bound.minimum > 0:
        values.append("0")
    for value in values:
        CASES[command] += 1
        code, err = _run_until_dispatch(
            _argv_for(command, tmp_path, [f"{flag}={value}"]), monkeypatch, capsys
        )
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == EXIT_BAD_INPUT, f"{command} {flag}={value!r}: {code} {err!r}"
        assert len(lines) == 1 and lines[0].startswith("mqmeta: error: "), err
        assert flag in lines[0] and bound.allowed in lines[0], lines[0]
    # and the range's ends are taken
    for value in (bound.minimum, bound.maximum):
        text = repr(float(value)) if bound.kind is float else str(int(value))
        code, err = _run_until_dispatch(_argv_for(command, tmp_path, [f"{flag}={text}"]), monkeypatch, capsys)
        assert code == "reached", f"{command} {flag}={text}: {code} {err!r}"


@st.composite
def _numbers_argv(draw: st.DrawFn, command: str) -> tuple[list[str], bool]:
    """Some numeric flags with drawn values; whether every one of them is in its range."""
    extra, good = [], True
    for action in _numeric(COMMAND_LEAVES[command]):
        if not draw(st.booleans()):
            continue
        bound: FlagNumber = action.type
        value = draw(
            st.one_of(
                st.sampled_from(NUMBERS_BAD + ["0", "1", "2"]),
                st.integers(-(2**70), 2**70).map(str),
                st.floats(allow_nan=True, allow_infinity=True).map(repr),
            )
        )
        try:
            bound(value)
        except argparse.ArgumentTypeError:
            good = False
        extra.append(f"{action.option_strings[-1]}={value}")
    return extra, good


@pytest.mark.parametrize("command", sorted(set(SERVER_COMMANDS) - {"namesrv", "controller", "replicator"}))
def test_numeric_flags_fuzzed(command, tmp_path, monkeypatch, capsys):
    """Drawn values: an argv whose every number is in range reaches the command; any other is
    exit 2 with one "mqmeta: error:" line, never a traceback."""

    @settings(
        max_examples=EXAMPLES * 2,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(drawn=_numbers_argv(command))
    def case(drawn):
        extra, good = drawn
        CASES[command] += 1
        code, err = _run_until_dispatch(_argv_for(command, tmp_path, extra), monkeypatch, capsys)
        if good:
            assert code == "reached", f"{extra}: {code} {err!r}"
        else:
            assert code == EXIT_BAD_INPUT and err.startswith("mqmeta: error: ") and "Traceback" not in err, (
                err
            )

    case()


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (
            "send_timeout_ms = -1",
            "'send_timeout_ms' in {} (--send-timeout-ms) must be a whole number from 100",
        ),
        ("send_timeout_ms = 99999999999999999999", "(--send-timeout-ms) must be a whole number from 100"),
        # a protobuf traceback at registration before
        ("election_priority = 2147483648", "'election_priority' in {} (--election-priority) must be"),
        ("segment_bytes = 0", "(--segment-bytes) must be a whole number from 4096 to 1073741824"),
        ("ha_stream_port = 65536", "(--ha-stream-port) must be a whole number from 0 to 65535"),
        (
            "tiered_upload_interval_ms = nan",
            "'tiered_upload_interval_ms' in {} must be a whole number, not a",
        ),
        ("local_retention_bytes = inf", "'local_retention_bytes' in {} must be a whole number, not a number"),
        ("in_sync_replicas = 1.5", "'in_sync_replicas' in {} must be a whole number, not a number"),
    ],
)
def test_a_config_file_number_out_of_its_flags_range_is_exit_2(line, fragment, tmp_path, monkeypatch, capsys):
    config = tmp_path / "broker.toml"
    config.write_text(line + "\n")
    code, err = _run_until_dispatch(
        _argv_for("broker", tmp_path, ["--config", str(config)]), monkeypatch, capsys
    )
    assert code == EXIT_BAD_INPUT and err.startswith("mqmeta: error: ") and "Traceback" not in err, err
    assert fragment.format(config) in err, err


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("heartbeat_ms", 0),
        ("heartbeat_ms", -5),
        ("proposal_timeout_ms", 10**12),
        ("election_max_ms", 0),
        ("compaction_min_time_s", -1),
        ("queue_commands_max", 0),
    ],
)
def test_raft_settings_out_of_range_are_refused_naming_the_key(key, value):
    from mqmeta.controller.server import raft_settings_from

    from mqmeta.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=f"'{key}' in \\[raft_settings\\] must be a whole number from"):
        raft_settings_from({key: value}, None)
