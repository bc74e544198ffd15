"""Writes the reference pages under docs/reference/ from the code, so that they cannot drift.

cli.md: every command and flag, walked from the argparse parsers. metrics.md: every
Prometheus metric, read from each process's registry. config.md: every key of the --config
files, [raft_settings], the replicator's file and the replicated run-time settings.
grpc.md: every gRPC method served, from the protobuf descriptors and the access table.
errors.md: the exception tree, the gRPC status of each class, the domain codes and the
CLI's exit codes.

`python tools/docgen.py` writes the pages; `python tools/docgen.py --check` writes nothing
and exits 1 naming the pages that differ from what the code gives now (tests/test_docgen.py
checks the same). Run it from a checkout with the dev extra installed. The output is
deterministic: no timestamps or addresses, unordered sources sorted, and neither the MQMETA_*
environment variables nor the terminal's width reach it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "reference"
GENERATED_NOTE = (
    "<!-- Generated from the code by tools/docgen.py: edit the code and run "
    "`python tools/docgen.py`, never this file. -->"
)
USAGE_COLUMNS = "100"  # argparse wraps usage lines to the terminal's width: fixed here

Command = tuple[list[str], argparse.ArgumentParser, str]  # path, parser, its one-line help


# -- Markdown ---------------------------------------------------------------------------


def text(value: str) -> str:
    """`value` as literal Markdown text on one line: no emphasis, no HTML, no cell breaks."""
    escaped = value.replace("\\", "\\\\")
    for char in "`*_[]|":
        escaped = escaped.replace(char, "\\" + char)
    escaped = escaped.replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"\s+", " ", escaped)


def prose(value: str) -> str:
    """`value` as Markdown on one line, its `backticked` spans kept as code and the rest literal."""
    parts = re.split(r"(`[^`]+`)", value)
    return "".join(code(part[1:-1]) if index % 2 else text(part) for index, part in enumerate(parts)).strip()


def code(value: object) -> str:
    """`value` as a code span (MkDocs' tables keep a pipe inside a span in its cell)."""
    shown = str(value)
    fence = "``" if "`" in shown else "`"
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip() else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def page(title: str, intro: str, sections: Iterable[str]) -> str:
    blocks = [f"# {title}\n", GENERATED_NOTE + "\n", intro.strip() + "\n", *sections]
    return "\n".join(blocks)


def anchor(heading: str) -> str:
    """The id MkDocs' toc extension gives a heading of plain words."""
    slug = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", slug)


# -- The parsers ------------------------------------------------------------------------


@contextlib.contextmanager
def plain_environment() -> Iterator[None]:
    """No MQMETA_* variables (some become defaults), a fixed width, and an empty working and
    home directory (so no file a default might be read from is found), all restored after."""
    saved, cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="docgen-") as empty:
        for name in [name for name in os.environ if name.startswith("MQMETA_")]:
            del os.environ[name]
        os.environ.update(COLUMNS=USAGE_COLUMNS, HOME=empty)
        os.chdir(empty)
        try:
            yield
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(saved)


def cli_parser() -> argparse.ArgumentParser:
    from mqmeta.cli import build_parser

    with plain_environment():
        return build_parser()


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, child, helps.get(name, "")) for name, child in action.choices.items()]
    return found


def commands(
    parser: argparse.ArgumentParser, path: list[str] | None = None, help_text: str = ""
) -> list[Command]:
    """Every parser of the tree, parents before their subcommands, in --help order."""
    here = path or [parser.prog]
    found: list[Command] = [(here, parser, help_text)]
    for name, child, child_help in subcommands(parser):
        found += commands(child, [*here, name], child_help)
    return found


def shown_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    hidden = (argparse._HelpAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, hidden) and a.help != argparse.SUPPRESS]


def config_spec(parser: argparse.ArgumentParser) -> Any:
    """The parser's --config file spec (mqmeta.config_file), or None when it takes no file."""
    from mqmeta.config_file import SPEC_DEST

    return parser.get_default(SPEC_DEST)


def default_of(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[Any, bool]:
    """(the flag's default, whether it is required): accept_config_file moves both aside."""
    spec = config_spec(parser)
    if spec is not None and action.dest in spec.actions:
        return spec.defaults[action.dest], action.dest in spec.required
    return action.default, action.required


# The folders of the installed package (tools/typecheck.py's PARTS, and the base package).
SOURCE_FOLDERS = ("mqmeta", "controller", "broker_agent", "replicator", "cluster", "spark", "chaos")
EnvironmentDefaults = dict[tuple[str, ...], str]  # (*command path, flag dest) -> variable


def environment_names() -> list[str]:
    """Every MQMETA_* variable the code names (a flag's default may come from one)."""
    names: set[str] = set()
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            names |= set(re.findall(r'"(MQMETA_[A-Z0-9_]+)"', path.read_text(encoding="utf-8")))
    return sorted(names)


def environment_defaults(
    build: Callable[[], argparse.ArgumentParser], names: Iterable[str]
) -> EnvironmentDefaults:
    """Which flag's default comes from which variable: the parsers built again with one
    variable set to a marker, and the flags whose default is that marker."""
    found: EnvironmentDefaults = {}
    for name in names:
        marker = f"<{name}>"
        with plain_environment():
            os.environ[name] = marker
            try:
                tree = build()
            except Exception:  # the parsers check this variable's value: not a plain default
                continue
        for path, command, _ in commands(tree):
            for action in shown_actions(command):
                if default_of(command, action)[0] == marker:
                    found[(*path, action.dest)] = name
    return found


# -- What a value may be ----------------------------------------------------------------


def number_range(action: argparse.Action) -> str | None:
    """The allowed values of a numeric flag's type, read from the type itself."""
    from mqmeta import admin_cli
    from mqmeta.validate import FlagNumber

    kind: Any = action.type
    if isinstance(kind, FlagNumber):
        return kind.allowed
    if kind is admin_cli._timeout_s:
        return f"seconds, more than 0 and at most {admin_cli.TIMEOUT_S_MAX:g}"
    names = getattr(getattr(kind, "__code__", None), "co_freevars", ())
    if getattr(kind, "__qualname__", "") == "_int_in.<locals>.parse" and kind is not None:
        cells = dict(zip(names, [cell.cell_contents for cell in kind.__closure__ or ()], strict=True))
        return f"a whole number from {cells['minimum']} to {cells['maximum']}"
    if kind in (int, float):
        raise ValueError(f"{action.option_strings}: a bare {kind} flag has no range; use FlagNumber")
    return None


def value_kind(action: argparse.Action) -> tuple[str, str]:
    """(its TOML type, what it may be) for a flag."""
    if action.nargs == 0:
        return "boolean", "switch"
    allowed = number_range(action)
    if allowed is not None:
        kind = "integer" if "whole" in allowed else "number"
    elif action.type is Path:
        kind, allowed = "string", "a path"
    elif action.type is None or action.type is str:
        kind, allowed = "string", "text"
    elif isinstance(named := getattr(action.type, "allowed", None), str):  # says what it takes
        kind, allowed = "string", named
    else:
        raise ValueError(f"tools/docgen.py does not know the values of {action.option_strings}'s type")
    if action.choices is not None:
        allowed = "one of " + ", ".join(code(choice if choice != "" else '""') for choice in action.choices)
    if isinstance(action, argparse._AppendAction):
        return f"list of {kind}s", f"{allowed}; repeatable"
    return kind, allowed


def shown_default(value: Any, required: bool, switch: bool = False) -> str:
    if required:
        return "required"
    if value is None or value == [] or value == argparse.SUPPRESS:
        return "off" if switch and value is None else ""
    if switch:
        return "on" if value else "off"
    if isinstance(value, bool):
        return code(str(value).lower())
    if value == "":
        return code('""')
    return code(value)


def help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    return prose(parser._get_formatter()._expand_help(action))


def argument_name(action: argparse.Action) -> str:
    if action.option_strings:
        return ", ".join(code(flag) for flag in action.option_strings)
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    suffix = {"+": " ...", "*": " ...", "?": ""}.get(str(action.nargs), "")
    return code(metavar + suffix)


# -- cli.md ------------------------------------------------------------------------------


def cli_page(
    parser: argparse.ArgumentParser | None = None, environment: EnvironmentDefaults | None = None
) -> str:
    """The page of `parser` (by default mqmeta's), its flags' variables from `environment`
    (by default found by environment_defaults)."""
    tree = parser or cli_parser()
    if environment is None:
        environment = {} if parser is not None else real_environment_defaults()
    intro = """
Every `mqmeta` command with each of its flags: what values it takes, its default and what
it does (as `mqmeta COMMAND --help` prints it). A command that takes `--config FILE` reads
the same settings from a TOML file: see [Configuration](config.md). Bad input is one
sentence on stderr and exit status 2: see [Errors](errors.md).
"""
    with plain_environment():
        sections = [command_section(*command, environment) for command in commands(tree)]
    return page("Command line", intro, sections)


def real_environment_defaults() -> EnvironmentDefaults:
    from mqmeta.cli import build_parser

    return environment_defaults(build_parser, environment_names())


def command_section(
    path: list[str], parser: argparse.ArgumentParser, help_text: str, environment: EnvironmentDefaults
) -> str:
    heading = " ".join(path)
    level = "#" * max(2, min(len(path), 4))
    blocks = [f"{level} {heading}\n"]
    # A command's own --help text (its description) says more than its line in its parent's;
    # mqmeta's own (and its epilog of examples) is the page's introduction.
    about = parser.description if parser.description and len(path) > 1 else help_text
    if about:
        blocks.append(prose(about) + "\n")
    blocks.append("```text\n" + parser.format_usage().strip() + "\n```\n")
    if parser.epilog and len(path) > 1:
        blocks.append(prose(parser.epilog) + "\n")
    children = subcommands(parser)
    if children:
        rows = [[f"[{code(name)}](#{anchor(heading + ' ' + name)})", prose(h)] for name, _, h in children]
        blocks.append(table(["Subcommand", "What it does"], rows))
    actions = shown_actions(parser)
    if actions:
        rows = flag_rows(
            parser, actions, {dest: name for (*at, dest), name in environment.items() if at == path}
        )
        blocks.append(table(["Argument", "Values", "Default", "What it does"], rows))
    return "\n".join(blocks)


def flag_rows(
    parser: argparse.ArgumentParser, actions: list[argparse.Action], variables: dict[str, str]
) -> list[list[str]]:
    """A row per flag; `variables`: the environment variable a flag's default comes from, by dest."""
    rows = []
    for action in actions:
        default, required = default_of(parser, action)
        if not action.option_strings and action.nargs not in ("?", "*"):
            required = True  # a positional argument
        _, allowed = value_kind(action)
        shown = shown_default(default, required, action.nargs == 0)
        if action.dest in variables:
            shown += f" (`${variables[action.dest]}` if set)"
        rows.append([argument_name(action), allowed, shown, help_of(parser, action)])
    return rows


# -- config.md ---------------------------------------------------------------------------


def config_page(parser: argparse.ArgumentParser | None = None) -> str:
    tree = parser or cli_parser()
    intro = """
The server commands take `--config FILE`, a TOML file whose keys are the command's flags in
snake_case (`--broker-name` is `broker_name`). A flag given on the command line wins over the
file, which wins over the default. An unknown key, a value of the wrong type or out of its
range is one sentence naming the key, and exit status 2. The values are never printed: a file
may hold secrets. The controllers' replicated settings, changed at run time with
`mqmeta admin config set KEY=VALUE`, are at the end.
"""
    sections = []
    for path, command, _ in commands(tree):
        spec = config_spec(command)
        if spec is not None:
            sections.append(config_file_section(path, command, spec))
    sections += [raft_settings_section(), replicator_file_section(), runtime_section()]
    return page("Configuration", intro, sections)


def config_file_section(path: list[str], parser: argparse.ArgumentParser, spec: Any) -> str:
    where = f"in its `[{spec.section}]` table" if spec.section else "at the top level"
    lines = [f"## {' '.join(path)} --config\n", f"The flags' keys live {where}."]
    if spec.tables:
        tables = ", ".join(f"[`[{name}]`](#{anchor(name)})" for name in spec.tables)
        lines.append(f"Tables: {tables}.")
    rows = []
    for key, action in sorted(spec.actions.items()):
        kind, allowed = value_kind(action)
        default = shown_default(spec.defaults[key], key in spec.required, action.nargs == 0)
        flag = code(action.option_strings[0])
        rows.append([code(key), kind, allowed, default, flag, help_of(parser, action)])
    header = ["Key", "Type", "Values", "Default", "Flag", "What it sets"]
    return "\n".join(lines) + "\n\n" + table(header, rows)


def bounded_rows(
    defaults: dict[str, Any], bounds: dict[str, tuple[int, int]], meanings: dict[str, str], where: str
) -> list[list[str]]:
    """A row per key; `meanings` must describe exactly these keys (a key added in the code and
    not described here stops the generator, naming the table in tools/docgen.py to extend)."""
    drift = sorted(set(defaults) ^ set(meanings))
    if drift:
        raise ValueError(f"{where} in tools/docgen.py is out of date for {drift}")
    rows = []
    for key, default in sorted(defaults.items()):
        if isinstance(default, bool):
            kind, allowed, shown = "boolean", "true or false", code(str(default).lower())
        elif isinstance(default, int):
            low, high = bounds[key]
            kind, allowed, shown = "integer", f"a whole number from {low} to {high}", code(default)
        else:
            kind, allowed, shown = "string", "a name", code(default)
        rows.append([code(key), kind, allowed, shown, prose(meanings[key])])
    return rows


BOUNDED_HEADER = ["Key", "Type", "Values", "Default", "What it sets"]

# What each [raft_settings] key does (RaftSettings in controller/raft_node.py).
RAFT_SETTINGS_MEANINGS = {
    "heartbeat_ms": "how often the leader sends entries or a heartbeat to each follower",
    "election_min_ms": "a follower that hears no leader for a random time between this and "
    "`election_max_ms` starts an election (more than 3 x `heartbeat_ms`)",
    "election_max_ms": "the upper end of that random time (more than `election_min_ms`)",
    "leader_fallback_ms": "a leader that hears from no majority for this long steps down "
    "(more than `heartbeat_ms`)",
    "connection_retry_ms": "the wait before dialing a peer again after a connection failed",
    "compaction_min_entries": "the log is compacted into a snapshot once it holds this many entries...",
    "compaction_min_time_s": "... or this long after the last compaction",
    "batch_commands_max": "the most commands proposed to Raft as one entry",
    "inflight_batches_max": "how many proposed entries may wait for their commit at once",
    "queue_commands_max": "commands waiting to be proposed; past it a write is refused (UNAVAILABLE, retry)",
    "proposal_timeout_ms": "a write not committed within this fails (UNAVAILABLE); it may still commit",
    "journal_fsync": "fsync the Raft journal before an entry counts as stored (off: faster, and a power "
    "loss can lose what this node acknowledged)",
    "scrub_interval_s": "how often the background scrub re-reads the Raft journal and snapshot, checking "
    "every checksum (damage found: the node stops, and its restart discards them and re-joins)",
    "gc_thaw_interval_s": "how often a follower has the garbage collector examine every object again; "
    "between, what survived a full pass is frozen and a full pass runs every few seconds, so passes "
    "examine a few seconds' growth, not the whole state (0: the collector as Python runs it, with passes "
    "that grow with the state)",
}

# What each run-time key does (CONFIG_SCHEMA in controller/state_machine.py).
RUNTIME_MEANINGS = {
    "enable_unclean_master_election": "let the controller elect a broker outside the SyncStateSet when "
    "no member is alive (it may lose acknowledged messages)",
    "broker_heartbeat_interval_ms": "how often a broker heartbeats to the controllers",
    "broker_dead_after_ms": "a broker silent this long is dead and its set's master is re-elected "
    "(at least 3 x `broker_heartbeat_interval_ms`)",
    "lease_ms": "how long a master may accept writes after its last acknowledged heartbeat",
    "lease_margin_ms": "the time between a cut-off master's lease ending and a successor's election "
    "(`lease_ms` + `lease_margin_ms` below `broker_dead_after_ms`)",
    "default_cluster": "the cluster of a topic created without `--cluster`",
    "default_queue_count": "the queues per broker set of a topic created without `--queues`",
}


def raft_settings_section() -> str:
    import dataclasses

    from mqmeta.controller.raft_node import RaftSettings
    from mqmeta.controller.server import RAFT_SETTINGS_BOUNDS

    fields = [f.name for f in dataclasses.fields(RaftSettings) if f.name != "secret"]
    defaults = {name: getattr(RaftSettings(), name) for name in fields}
    intro = (
        "## raft_settings\n\nThe Raft timing and batching of a controller node (`mqmeta controller` and "
        "`mqmeta namesrv --embed-controller`), in the `[raft_settings]` table of its --config file. "
        "The Raft secret is never a key: it comes from `--secret-file`.\n"
    )
    rows = bounded_rows(defaults, RAFT_SETTINGS_BOUNDS, RAFT_SETTINGS_MEANINGS, "RAFT_SETTINGS_MEANINGS")
    return intro + "\n" + table(BOUNDED_HEADER, rows)


# What each number in [replicator] does (SETTINGS_DEFAULTS in mqmeta/formats/replication_rules.py).
REPLICATOR_SETTINGS_MEANINGS = {
    "heartbeat_interval_ms": "with `controllers`: how often the worker heartbeats (and renews its leases)",
    "lease_ms": "with `controllers`: how long a task may run after the worker's last answered heartbeat",
    "dead_after_ms": "with `controllers`: a worker silent this long loses its tasks to the others "
    "(at least 3 x `heartbeat_interval_ms`, more than `lease_ms`)",
    "batch_count_max": "the most messages a task reads from the source in one pull",
    "batch_bytes_max": "the most body bytes a task sends to the target in one call",
    "inflight_batches_max": "how many batches a task may have sent and not yet had acknowledged",
    "commit_interval_ms": "with `controllers`: how often the tasks' progress is checkpointed",
    "offsets_interval_ms": "`full` mode: how often consumer progress is copied",
    "discovery_interval_ms": "how often the worker looks for new topics and queues its rules match",
}

# What each key of the replicator's file does (the file's reader, replication_rules.py, says
# only which values it takes): a key added there and missing here stops the generator.
REPLICATOR_KEY_MEANINGS = {
    "controllers": "the controllers, HOST:PORT[,HOST:PORT...]: workers then share the tasks through "
    "leases and checkpoints; unset: this worker runs every task",
    "name": "the rule's name, in logs, metrics and `mqmeta admin replicator-status`",
    "source_namesrv": "the source cluster's nameservers, HOST:PORT[,HOST:PORT...]",
    "target_namesrv": "the target cluster's nameservers (never the source's)",
    "topic": "a topic name, or `re:REGEX` for every topic it matches (system topics, `%...`, never match)",
    "tags": "a RocketMQ tag expression, `*` or `TagA || TagB`: only matching messages are copied",
    "target_topic": "the target's topic: a name, or a template of `{topic}` and `{source_cluster}`",
    "mode": "`enqueue` copies the messages; `full` also the consumer progress of the groups in `groups`",
    "start": "where a new task begins: the source's end, its beginning, or the first message stored at "
    "or after an ISO timestamp",
    "groups": "full mode: the consumer groups whose progress is replicated, as a tag expression (`*`: all)",
}


def replicator_file_section() -> str:
    from mqmeta.formats import replication_rules as rules

    missing = sorted({"controllers", *rules.RULE_KEYS} ^ set(REPLICATOR_KEY_MEANINGS))
    if missing:
        raise ValueError(f"REPLICATOR_KEY_MEANINGS in tools/docgen.py is out of date for {missing}")
    rows = bounded_rows(
        rules.SETTINGS_DEFAULTS,
        rules.SETTINGS_BOUNDS,
        REPLICATOR_SETTINGS_MEANINGS,
        "REPLICATOR_SETTINGS_MEANINGS",
    )
    settings = table(BOUNDED_HEADER, rows)
    return (
        "## replicator file\n\nBesides the flags' keys above, `mqmeta replicator --config FILE` reads "
        "its settings and its rules. In `[replicator]`: `controllers` (text: "
        f"{prose(REPLICATOR_KEY_MEANINGS['controllers'])}) and these numbers.\n\n{settings}\n"
        f"Each `[[rules]]` table is one routing rule (at most {rules.RULES_MAX}):\n\n{rule_table()}"
    )


def rule_table() -> str:
    from mqmeta.errors import InvalidArgument
    from mqmeta.formats import replication_rules as rules

    minimal = {"name": "r", "source_namesrv": "127.0.0.1:1", "target_namesrv": "127.0.0.1:2", "topic": "T"}
    defaults = rules.parse_rule(minimal, 0).definition()
    choices = {"mode": rules.MODES, "start": rules.STARTS}
    rows = []
    for key in rules.RULE_KEYS:
        required = False
        if key in minimal:
            try:
                rules.parse_rule({k: v for k, v in minimal.items() if k != key}, 0)
            except InvalidArgument:
                required = True
        allowed = "one of " + ", ".join(code(c) for c in choices[key]) if key in choices else "text"
        if key == "start":
            allowed += ", or an ISO timestamp"
        default = "required" if required else code(defaults[key])
        rows.append([code(key), allowed, default, prose(REPLICATOR_KEY_MEANINGS[key])])
    return table(["Key", "Values", "Default", "What it sets"], rows)


def runtime_section() -> str:
    from mqmeta.controller.state_machine import CONFIG_SCHEMA

    defaults = {key: spec[1] for key, spec in CONFIG_SCHEMA.items()}
    bounds = {key: (spec[2], spec[3]) for key, spec in CONFIG_SCHEMA.items()}
    return (
        "## run-time settings\n\nReplicated through Raft and the same on every controller: read them "
        "with `mqmeta admin config get`, change them with `mqmeta admin config set KEY=VALUE ...` "
        "(an admin call). Related values are checked together when set.\n\n"
        + table(BOUNDED_HEADER, bounded_rows(defaults, bounds, RUNTIME_MEANINGS, "RUNTIME_MEANINGS"))
    )


# -- metrics.md --------------------------------------------------------------------------


def stand_ins() -> dict[str, Any]:
    """What each process's metrics read at scrape time, in the state where every family
    appears: a Raft leader with a broker set; a master with a slave and a tiered checkpoint;
    a replication worker with one task."""
    import threading
    from types import SimpleNamespace as Fake

    from mqmeta.broker_agent.ha import Role
    from mqmeta.broker_agent.scrub import ScrubStats
    from mqmeta.controller.repair import RaftRepairStats

    raft = Fake(is_leader=lambda: True, leader_terms=1, on_applied=None)
    raft.repair_stats, raft.catching_up = RaftRepairStats(), lambda: False
    raft.raftCurrentTerm = raft.raftCommitIndex = raft.raftLastApplied = 1
    core = Fake(raft=raft, alive_ids=lambda *_: {"1"})
    core.state = Fake(broker_sets=lambda: [{"cluster": "c", "broker_name": "b", "replicas": {"1": {}}}])
    view = Fake(role=Role.MASTER, master_epoch=1, confirm_offset=1, sync_state_set={1, 2})
    store = Fake(max_offset=1, consumer_keys=lambda: [("g", "t", 0)], consumer_progress=lambda *_: (0, ()))
    store.readable_queue_max_offset = store.queue_min_offset = lambda *_: 0
    agent = Fake(lock=threading.Lock(), store=store, scrub_stats=ScrubStats())
    agent.core = Fake(view=lambda: view, acked_offsets=lambda: {2: 0})
    agent.tiered = Fake(checkpoint=Fake(uploaded_offset=0), failures={"enospc": 0})
    key = Fake(rule="r", topic="t", broker_name="b", queue_id=0)
    stats = Fake(replicated=1, replicated_bytes=1, errors=0, lag_messages=0, caught_up=True)
    stats.last_store_ms = stats.last_sync_ms = 0
    return {"controller": core, "broker": agent, "replicator": [Fake(key=key, stats=stats)]}


def registries() -> dict[str, Any]:
    """Each process's registry, built as the process builds it (mqmeta.metrics.Metrics, or
    the replicator's TaskCollector), around the stand-ins."""
    from mqmeta.broker_agent.metrics import BrokerMetrics
    from mqmeta.controller.metrics import controller_metrics, namesrv_metrics
    from mqmeta.replicator.metrics import TaskCollector
    from prometheus_client.registry import CollectorRegistry

    fakes = stand_ins()
    replicator = CollectorRegistry(auto_describe=False)
    replicator.register(TaskCollector(lambda: fakes["replicator"]))
    return {
        "controller": controller_metrics(fakes["controller"])[0].registry,
        "namesrv": namesrv_metrics()[0].registry,
        "broker": BrokerMetrics(fakes["broker"]).metrics.registry,
        "replicator": replicator,
    }


SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
}


def metric_row(metric: Any) -> list[str]:
    labels = list(getattr(metric, "_labelnames", ()))
    for sample in metric.samples:
        labels += [label for label in sample.labels if label not in labels and label != "le"]
    series = [metric.name + suffix for suffix in SERIES_SUFFIXES.get(metric.type, ("",))]
    buckets = sorted({float(s.labels["le"]) for s in metric.samples if "le" in s.labels} - {float("inf")})
    what = prose(metric.documentation)
    if buckets:
        what += " (buckets: " + ", ".join(f"{b:g}" for b in buckets) + ", +Inf)"
    return ["<br>".join(code(name) for name in series), metric.type, ", ".join(code(n) for n in labels), what]


# Which command serves which registry (as controller/cli.py starts them), when it is not the
# command of the registry's name alone.
METRICS_SERVED_BY = {
    "controller": "`mqmeta controller --metrics-listen HOST:PORT`, and `mqmeta namesrv "
    "--embed-controller --metrics-listen HOST:PORT`",
    "namesrv": "a standalone `mqmeta namesrv --controllers ADDRS --metrics-listen HOST:PORT`",
}


def metrics_page(processes: dict[str, Any] | None = None) -> str:
    found = processes if processes is not None else registries()
    intro = """
Each server serves Prometheus text on `--metrics-listen HOST:PORT` (`/metrics`). Gauges are
read from the process's state when scraped; counters and histograms count on the data path.
A histogram's unit is seconds unless its name says otherwise; a gauge labelled by broker or
task has one series per broker or task.
"""
    sections = []
    for process, registry in sorted(found.items()):
        metrics = sorted(registry.collect(), key=lambda metric: metric.name)
        rows = [metric_row(metric) for metric in metrics]
        served_by = METRICS_SERVED_BY.get(process, f"`mqmeta {process} --metrics-listen HOST:PORT`")
        heading = f"## {process}\n\nServed by {served_by}.\n\n"
        sections.append(heading + table(["Series", "Type", "Labels", "What it measures"], rows))
    return page("Metrics", intro, sections)


# -- grpc.md ------------------------------------------------------------------------------

ACCESS_MEANINGS = {
    "OPEN": "never checked (health checks)",
    "READ": "any identity the server's `--auth-file` lists; none with `--anonymous-reads`",
    "DATA": "producing and consuming: checked like READ",
    "ADMIN": "an `admin` identity, whenever the server takes `--auth-file`",
}


def served_services() -> list[Any]:
    """mqmeta.v1's services (every *_pb2 module of mqmeta.pb) and each other service the
    access table names (apache.rocketmq.v2, health, reflection), by full name."""
    import importlib
    import pkgutil

    from google.protobuf import descriptor_pool

    import mqmeta.pb
    from mqmeta import auth

    ours = []
    for module in sorted(info.name for info in pkgutil.iter_modules(mqmeta.pb.__path__)):
        if module.endswith("_pb2"):
            ours += importlib.import_module(f"mqmeta.pb.{module}").DESCRIPTOR.services_by_name.values()
    for module in ("mqmeta.pb.apache.rocketmq.v2.service_pb2", "grpc_health.v1.health_pb2"):
        importlib.import_module(module)
    importlib.import_module("grpc_reflection.v1alpha.reflection_pb2")
    names = {service.full_name for service in ours}
    pool = descriptor_pool.Default()
    others = [pool.FindServiceByName(name) for name in auth._ACCESS_BY_SERVICE if name not in names]
    return sorted(ours, key=lambda s: s.full_name) + sorted(others, key=lambda s: s.full_name)


# Which commands serve a service (controller/server.py and broker_agent/service.py register them).
SERVICES_SERVED_BY = {
    "ControllerService": "Served by `mqmeta controller` and `mqmeta namesrv --embed-controller` "
    "(on `--grpc`). ",
    "NameServer": "Served by `mqmeta namesrv` (on `--listen`). ",
    "BrokerService": "Served by `mqmeta broker` (on `--listen`). ",
    "MessagingService": "Served by `mqmeta namesrv` (routes) and `mqmeta broker` (messages), on `--listen`. ",
    "Health": "Served on every gRPC port. ",
    "ServerReflection": "Served on every gRPC port. ",
}


def defined_in(file: Any) -> str:
    """Where a service's .proto is: ours and the vendored RocketMQ 5 ones are under proto/."""
    if file.package == "mqmeta.v1":
        return f"Defined in `proto/{Path(file.name).name}`."
    if file.package.startswith("apache.rocketmq."):
        return f"Defined in `proto/{file.name}` (RocketMQ 5's, unchanged)."
    return f"The standard gRPC service (`{file.name}`)."


def compiled_with_comments(include: str, files: list[str]) -> Any:
    """A FileDescriptorSet of `files` with their source comments (the generated modules'
    descriptors have none), compiled by grpc_tools' protoc (the dev extra's, as protogen.py)."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    well_known = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="docgen-") as tmp:
        out = Path(tmp) / "descriptors.pb"
        flags = [f"-I{include}", f"-I{well_known}", "--include_source_info", f"--descriptor_set_out={out}"]
        if protoc.main(["protoc", *flags, *files]) != 0:
            raise RuntimeError(f"protoc could not compile {files}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def method_comments() -> dict[str, str]:
    """'/package.Service/Method' -> the first paragraph of the comment above its rpc in proto/."""
    proto = ROOT / "proto"
    vendored = sorted(proto.glob("apache/rocketmq/v2/*.proto"))
    sets = [
        compiled_with_comments(
            f"mqmeta/pb={proto}", [f"mqmeta/pb/{p.name}" for p in sorted(proto.glob("*.proto"))]
        ),
        compiled_with_comments(str(proto), [str(p.relative_to(proto)) for p in vendored]),
    ]
    comments = {}
    for file in (file for descriptor_set in sets for file in descriptor_set.file):
        for location in file.source_code_info.location:
            where = list(location.path)  # 6: FileDescriptorProto.service, 2: ServiceDescriptorProto.method
            if len(where) == 4 and where[0] == 6 and where[2] == 2:
                service = file.service[where[1]]
                name = f"/{file.package}.{service.name}/{service.method[where[3]].name}"
                comments[name] = location.leading_comments.strip().split("\n\n")[0]
    return comments


def method_rows(service: Any, access: dict[str, Any], comments: dict[str, str]) -> list[list[str]]:
    rows = []
    for method in sorted(service.methods, key=lambda m: m.name):
        request = ("stream " if method.client_streaming else "") + code(method.input_type.full_name)
        response = ("stream " if method.server_streaming else "") + code(method.output_type.full_name)
        path = f"/{service.full_name}/{method.name}"
        found = access.get(path)
        shown = found.name if found is not None else "ADMIN (not in the access table: fail closed)"
        rows.append([code(method.name), request, response, shown, prose(comments.get(path, ""))])
    return rows


def grpc_page(access: dict[str, Any] | None = None) -> str:
    from mqmeta import auth

    table_ = access if access is not None else auth.METHOD_ACCESS
    drift = sorted({member.name for member in auth.Access} ^ set(ACCESS_MEANINGS))
    if drift:
        raise ValueError(f"ACCESS_MEANINGS in tools/docgen.py is out of date for {drift}")
    classes = [[member.name, prose(ACCESS_MEANINGS[member.name])] for member in auth.Access]
    intro = (
        "Every gRPC method the servers serve: the `mqmeta.v1` services, the RocketMQ 5 "
        "`apache.rocketmq.v2.MessagingService` (nameservers and brokers), health checking and "
        "reflection (every port, for `grpcurl` and probes). A server started with `--auth-file` "
        "checks each call against the method's access class; a refused call is UNAUTHENTICATED "
        "or PERMISSION_DENIED (see [Errors](errors.md)).\n\n" + table(["Access", "Who may call"], classes)
    )
    sections = []
    comments = method_comments()
    for service in served_services():
        rows = method_rows(service, table_, comments)
        served_by = SERVICES_SERVED_BY.get(service.name, "")
        heading = f"## {service.full_name}\n\n{served_by}{defined_in(service.file)}\n\n"
        sections.append(heading + table(["Method", "Request", "Response", "Access", "What it does"], rows))
    return page("gRPC services", intro, sections)


# -- errors.md ----------------------------------------------------------------------------


def error_classes() -> list[Any]:
    """Every class of mqmeta.errors, parents before children, siblings by name."""
    from mqmeta import errors

    def tree(cls: Any) -> list[Any]:
        ours = [child for child in cls.__subclasses__() if child.__module__ == errors.__name__]
        children = sorted(ours, key=lambda child: child.__name__)
        return [cls] + [grand for child in children for grand in tree(child)]

    return tree(errors.MqmetaError)


def exit_codes() -> list[list[str]]:
    import signal

    from mqmeta.chaos import cli as chaos_cli

    from mqmeta import cli

    return [
        ["0", "the command did what it was asked: a server stopped on SIGINT or SIGTERM, a check passed"],
        [
            str(chaos_cli.EXIT_FAILED),
            "it ran and found a failure: an audit check or a chaos run failed, or `produce` had "
            "messages the broker did not acknowledge",
        ],
        [str(cli.EXIT_BAD_INPUT), "bad input or a failed call: one sentence on stderr, `mqmeta: error: ...`"],
        [str(128 + signal.SIGINT), "interrupted by Ctrl-C (SIGINT) before it finished"],
    ]


def errors_page() -> str:
    from mqmeta import errors, rpc

    classes = error_classes()
    rows = []
    for cls in classes:
        parent = cls.__mro__[1].__name__ if cls is not errors.MqmetaError else "Exception"
        status = rpc.status_of(cls("")).name
        doc = cls.__dict__.get("__doc__") or ""
        rows.append([code(cls.__name__), code(parent), status, code(cls.default_code), prose(doc)])
    by_class = {cls: cls.__name__ for cls in classes}
    codes = [
        [code(name), code(by_class[cls]), rpc.status_of(cls("")).name]
        for name, cls in sorted(errors.CODE_CLASSES.items())
    ]
    intro = (
        "Every error a server or a command reports on purpose is one class of `mqmeta.errors` "
        "with a domain code and a sentence saying what was wrong and what to do. A failed gRPC "
        "call carries the class's status, the sentence as its details, and in its trailing "
        f"metadata the domain code (`{rpc.ERROR_CODE_KEY}`) and, for NOT_LEADER and NOT_MASTER, "
        f"where to go (`{rpc.LEADER_KEY}`). Anything else is INTERNAL with the method named."
    )
    sections = [
        "## classes\n\n" + table(["Class", "Parent", "gRPC status", "Default code", "Meaning"], rows),
        "## domain codes\n\nA code not listed is a FailedPrecondition: the controller refused a "
        "well-formed request in its current state.\n\n" + table(["Code", "Class", "gRPC status"], codes),
        "## exit codes\n\nOf every `mqmeta` command.\n\n" + table(["Exit status", "Meaning"], exit_codes()),
    ]
    return page("Errors", intro, sections)


# -- Writing and checking -----------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "cli.md": cli_page,
    "config.md": config_page,
    "errors.md": errors_page,
    "grpc.md": grpc_page,
    "metrics.md": metrics_page,
}


def generate() -> dict[str, str]:
    """Each page's file name and text, as the code gives them now."""
    return {name: make() for name, make in sorted(PAGES.items())}


def stale_pages(pages: dict[str, str], out_dir: Path) -> list[str]:
    stale = []
    for name, wanted in pages.items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != wanted:
            stale.append(name)
    return stale


def main(argv: list[str] | None = None, out_dir: Path = OUT_DIR) -> int:
    parser = argparse.ArgumentParser(prog="docgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    pages = generate()
    stale = stale_pages(pages, out_dir)
    if args.check:
        for name in stale:
            print(f"{out_dir / name} is stale: run python tools/docgen.py", file=sys.stderr)
        return 1 if stale else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in stale:
        (out_dir / name).write_text(pages[name], encoding="utf-8")
        print(f"wrote {out_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
