"""The `mqmeta` command: one front door, a subcommand per part.

The one module of the base package that imports the parts (lazily, through the PART_CLIS
table: every part's `<part>/cli.py` has an `add_parser(subparsers)` and a `run(args) -> int`)
and wires them together: the chaos matrix borrows the Spark audit from here (LOANS), so
that chaos/ does not import spark/. Errors reach the user as one sentence on stderr and exit
status 2, never a traceback. The texts a user reads in `--help` are in COMMANDS below.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from mqmeta import __version__
from mqmeta.config_file import apply_config_file, extend_config_file
from mqmeta.errors import MqmetaError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one sentence, exit 2
        self.exit(EXIT_BAD_INPUT, f"mqmeta: error: {message} (see --help)\n")


DESCRIPTION = """\
mqmeta keeps the metadata of RocketMQ-style master/slave brokers (broker sets, their
masters and in-sync replicas, topics, groups) on a Raft group of controllers, and
elects a new master when one fails.

Try it on one machine:
  mqmeta local up --data-dir mqmeta-data        # a whole cluster, in the foreground
  mqmeta admin --cluster-dir mqmeta-data topic create Orders
  mqmeta produce --cluster-dir mqmeta-data --topic Orders --count 1000
  mqmeta consume --cluster-dir mqmeta-data --topic Orders --group g1
"""
# command -> the module of the part that serves it: its add_parser(subparsers) adds the
# command's parser (a module may add several), its run(args) -> int carries it out.
# Imported only to build the parser or run the command (a command imports its own part
# only; --help imports them all); no module imports an extra's package
# before its run has checked the extra (mqmeta.extras), so a missing one is one sentence.
PART_CLIS: dict[str, str] = {
    "controller": "mqmeta.controller.cli",
    "namesrv": "mqmeta.controller.cli",
    "local": "mqmeta.cluster.cli",
    "broker": "mqmeta.broker_agent.cli",
    "produce": "mqmeta.data_cli",
    "consume": "mqmeta.data_cli",
    "admin": "mqmeta.admin_cli",
    "chaos": "mqmeta.chaos.cli",
    "audit": "mqmeta.spark.cli",
    "replicator": "mqmeta.replicator.cli",
}
EPILOG = (
    "Run `mqmeta COMMAND --help` for a command's flags. A bad input is one sentence on stderr and exit 2."
)

# Each command's line in `mqmeta --help`, and the first lines of its own --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "controller": (
        "run one controller node",
        "Run one controller node: it keeps the cluster's metadata in a Raft group with its peers "
        "(--peer) and elects masters. Run three or five for a cluster that survives a failure.",
    ),
    "namesrv": (
        "run a nameserver, where clients find a topic's brokers",
        "Run a nameserver: producers and consumers ask it which brokers serve a topic. It reads "
        "the metadata from the controllers (--controllers), or runs a controller node in the "
        "same process (--embed-controller).",
    ),
    "local": (
        "run a whole cluster on this machine",
        "Run controllers, a nameserver and brokers on this machine, for trying mqmeta out.",
    ),
    "broker": (
        "run one broker: stores and replicates a broker set's messages",
        "Run one broker of a broker set: it stores messages, replicates them between the "
        "set's master and slaves, and takes the role the controllers give it.",
    ),
    "produce": (
        "send messages to a topic",
        "Send COUNT messages to a topic and report how many the brokers acknowledged.",
    ),
    "consume": (
        "receive a topic's messages as a consumer group",
        "Receive a topic's messages as a consumer group until none arrives for --until-idle "
        "seconds, and report how many arrived.",
    ),
    "admin": (
        "look at and change the cluster: controllers, broker sets, topics, groups",
        "Look at and change the cluster through the controllers: their status, broker sets and "
        "their masters, topics, subscription groups, run-time configuration.",
    ),
    "chaos": (
        "break a local cluster under load and check what it promised (mqmeta[chaos])",
        "Run a local cluster behind fault proxies, inject faults (kills, partitions, pauses) "
        "while a workload runs, then check the history and audit the logs. Needs "
        "pip install 'mqmeta[chaos]'.",
    ),
    "audit": (
        "check a cluster's logs on disk with Spark (mqmeta[audit])",
        "Read every log a cluster wrote (a `local up` data dir, a chaos run's output, node data "
        "dirs) with Spark and check its invariants; write report.json and report.html. Needs "
        "pip install 'mqmeta[audit]'.",
    ),
    "replicator": (
        "copy topics from one cluster to another",
        "Run a replication worker: it copies the messages of the topics its rules name from "
        "one cluster to another, resuming where it stopped.",
    ),
}


def _describe(sub: argparse._SubParsersAction, every_command: bool) -> None:
    """The texts of COMMANDS on each command's line of `mqmeta --help` and atop its own."""
    if every_command:
        assert set(sub.choices) == set(COMMANDS), set(sub.choices) ^ set(COMMANDS)
        listed = {line.dest for line in sub._choices_actions}
        assert listed == set(COMMANDS), f"commands without a line in --help: {set(COMMANDS) - listed}"
    for line in sub._choices_actions:
        line.help, sub.choices[line.dest].description = COMMANDS[line.dest]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command`, one with only the parsers of the part that serves
    it (importing every part costs a controller seconds of its restart under load)."""
    parser = _Parser(
        prog="mqmeta",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mqmeta {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("MQMETA_LOG_LEVEL", "WARNING"),
        help="DEBUG, INFO, WARNING (default, or $MQMETA_LOG_LEVEL) or ERROR",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    modules = [PART_CLIS[command]] if command in PART_CLIS else PART_CLIS.values()
    for module in dict.fromkeys(modules):  # in the table's order: the order of --help
        importlib.import_module(module).add_parser(sub)
    _add_tls_flags_to_leaves(sub, tuple(name for name in TLS_COMMANDS if name in sub.choices))
    _describe(sub, every_command=command not in PART_CLIS)
    return parser


def command_in(argv: list[str]) -> str | None:
    """The command `argv` runs, when it names one before any other flag than --log-level
    (None: --help, --version, a typo: the whole parser answers those)."""
    position = 0
    while position < len(argv):
        word = argv[position]
        if word == "--log-level":
            position += 2
        elif word.startswith("--log-level="):
            position += 1
        else:
            return word if word in PART_CLIS else None
    return None


# The subcommands that serve or dial gRPC (`local up` makes its own: --tls).
TLS_COMMANDS = ("controller", "namesrv", "broker", "produce", "consume", "admin", "replicator")


SERVING_COMMANDS = ("controller", "namesrv", "broker")  # they take --auth-file
# The commands that dial a cluster, with the credentials they take from a --cluster-dir.
CONTEXT_ROLES = {"admin": "admin", "produce": "client", "consume": "client"}


def _add_tls_flags_to_leaves(sub: argparse._SubParsersAction, names: tuple[str, ...]) -> None:
    """--tls-* on every leaf parser under `names` (on a leaf only: a subparser's defaults
    would overwrite the values its parent parsed)."""
    from mqmeta.auth import add_auth_flags
    from mqmeta.tls import add_tls_flags

    for name in names:
        serves = name in SERVING_COMMANDS
        pending = [sub.choices[name]]
        while pending:
            parser = pending.pop()
            nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not nested:
                extend_config_file(parser, add_tls_flags)
                extend_config_file(parser, functools.partial(add_auth_flags, serves=serves))
            for action in nested:
                pending.extend(dict.fromkeys(action.choices.values()))


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_in(argv))
    args = parser.parse_args(argv)
    try:
        _setup_logging(args.log_level)
    except ValueError:
        print(f"mqmeta: error: unknown --log-level {args.log_level!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        from mqmeta import auth, context, dialmap, tls

        dialmap.load_from_environment()
        args = apply_config_file(args)  # first: a --config file may give the TLS flags
        if args.command in CONTEXT_ROLES:  # then the addresses (and a local cluster's credentials)
            context.resolve(args, CONTEXT_ROLES[args.command])
        tls_config = tls.config_from_args(args)
        tls.configure(tls_config)
        auth.configure_from_args(args, peer_certificates=tls_config is not None and tls_config.mutual)
        return _dispatch(args)
    except MqmetaError as error:
        print(f"mqmeta: error: {error.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    part = importlib.import_module(PART_CLIS[args.command])
    lend = LOANS.get(args.command)
    return part.run(args, lend) if lend is not None else part.run(args)


def _chaos_audits() -> Any:
    """The Spark audits a chaos run borrows (chaos/ does not import spark/): one session."""
    from mqmeta.chaos.cli import SharedAudits
    from mqmeta.spark.cli import shared_session_audit, shared_session_replication_status, stop_shared_session

    return SharedAudits(shared_session_audit, shared_session_replication_status, stop_shared_session)


# command -> what the front door lends its run besides the arguments (wiring between parts)
LOANS: dict[str, Callable[[], Any]] = {"chaos": _chaos_audits}


if __name__ == "__main__":
    sys.exit(main())
