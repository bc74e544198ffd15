"""The `mqmeta` command: one front door, a subcommand per part.

The one module of the base package that imports the parts (lazily, per subcommand) and
wires them together: e.g. the chaos matrix gets the Spark audit from here, so that
chaos/ does not import spark/. Errors reach the user as one sentence on stderr and exit
status 2, never a traceback. The texts a user reads in `--help` are in COMMANDS below.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from mqmeta import __version__
from mqmeta.config_file import accept_config_file, apply_config_file, extend_config_file
from mqmeta.errors import MqmetaError
from mqmeta.extras import require_extra
from mqmeta.validate import FlagNumber

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one sentence, exit 2
        self.exit(EXIT_BAD_INPUT, f"mqmeta: error: {message} (see --help)\n")


def _add_node_flags(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--config", type=Path, help="TOML file with any of these flags as keys")
    parser.add_argument("--id", dest="node_id", help="this controller node's id, e.g. c1")
    parser.add_argument("--grpc", help="gRPC address HOST:PORT of this node")
    parser.add_argument("--raft", help="Raft address HOST:PORT of this node")
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        help="another node as ID=RAFT_HOST:PORT/GRPC_HOST:PORT (repeat)",
    )
    parser.add_argument("--data-dir", type=Path, help="where this node keeps its journal and logs")
    parser.add_argument(
        "--secret-file", type=Path, help="file holding the Raft secret (authenticates and encrypts peers)"
    )
    parser.add_argument(
        "--insecure-raft",
        action="store_true",
        help="let a node with peers run without --secret-file (its Raft port must be unreachable "
        "from untrusted hosts: the wire format is pickle)",
    )
    parser.add_argument("--metrics-listen", help="serve Prometheus metrics over HTTP on HOST:PORT")


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


def _describe(sub: argparse._SubParsersAction) -> None:
    """The texts of COMMANDS on each command's line of `mqmeta --help` and atop its own."""
    assert set(sub.choices) == set(COMMANDS), set(sub.choices) ^ set(COMMANDS)
    listed = {line.dest for line in sub._choices_actions}
    assert listed == set(COMMANDS), f"commands without a line in --help: {set(COMMANDS) - listed}"
    for line in sub._choices_actions:
        line.help, sub.choices[line.dest].description = COMMANDS[line.dest]


def build_parser() -> argparse.ArgumentParser:
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

    controller = sub.add_parser("controller", help="run one standalone controller node")
    _add_node_flags(controller, required=True)
    accept_config_file(controller, tables=("raft_settings",))

    namesrv = sub.add_parser("namesrv", help="run a nameserver (optionally embedding a controller)")
    namesrv.add_argument("--listen", required=True, help="nameserver gRPC address HOST:PORT")
    namesrv.add_argument("--controllers", help="controller addresses (standalone nameserver)")
    namesrv.add_argument(
        "--embed-controller", action="store_true", help="also run a controller node in this process"
    )
    namesrv.add_argument(
        "--remoting-listen",
        nargs="?",
        const="0.0.0.0:9876",
        default="",
        help="serve RocketMQ 4.x clients (the classic remoting protocol) on HOST:PORT "
        "(RocketMQ's 0.0.0.0:9876 when the flag has no value)",
    )
    namesrv.add_argument(
        "--rocketmq-routes",
        choices=("proxy", "direct"),
        default="proxy",
        help="what QueryRoute gives RocketMQ 5 clients: proxy (the nameservers, which forward "
        "every call to the current master; the default) or direct (the masters' addresses)",
    )
    namesrv.add_argument(
        "--rocketmq-endpoints",
        default="",
        help="with proxy routes: every nameserver's gRPC address HOST:PORT,... "
        "(default: this one's --listen)",
    )
    namesrv.add_argument(
        "--remoting-proxy",
        action="append",
        metavar="BROKER_SET=HOST:PORT",
        help="a remoting proxy for a broker set (repeatable): routes name it instead of the "
        "set's master, and it forwards to whichever replica is master, so RocketMQ 4.x clients "
        "keep working across a failover without waiting for their next route refresh",
    )
    namesrv.add_argument(
        "--remoting-routes",
        choices=("proxy", "direct"),
        default="proxy",
        help="proxy (default): routes name the --remoting-proxy of a set that has one; direct: "
        "every route names the master's own remoting address (no proxy is started)",
    )
    namesrv.add_argument(
        "--console-listen",
        default="",
        help="serve the web console on HOST:PORT (https with --tls-cert; the --auth-file allow list)",
    )
    _add_node_flags(namesrv, required=False)
    accept_config_file(namesrv, tables=("raft_settings",))

    local = sub.add_parser("local", help="run a whole cluster on this machine")
    local_sub = local.add_subparsers(dest="local_command", required=True, parser_class=_Parser)
    up = local_sub.add_parser(
        "up",
        help="start the cluster in the foreground (Ctrl-C stops it)",
        description="Start a cluster on this machine in the foreground; Ctrl-C stops it. Once every "
        "node answers, DIR/cluster.json says where everything is, and the command prints the "
        "export line that points admin, produce and consume at it. Run it again on the same "
        "DIR to restart the same cluster from its data.",
    )
    up.add_argument(
        "--data-dir", type=Path, default=Path("mqmeta-data"), help="where the cluster keeps everything"
    )
    from mqmeta.cluster.local import BROKER_SETS_MAX, CLUSTERS_MAX, CONTROLLERS_MAX, REPLICAS_MAX

    up.add_argument(
        "--controllers",
        type=FlagNumber("--controllers", int, 1, CONTROLLERS_MAX),
        default=3,
        help=f"controller nodes (odd, 1-{CONTROLLERS_MAX})",
    )
    up.add_argument(
        "--embedded",
        action="store_true",
        help="run the controllers inside the nameservers (one per controller)",
    )
    up.add_argument(
        "--rocketmq-routes",
        choices=("proxy", "direct"),
        default="proxy",
        help="what the nameservers give RocketMQ 5 clients: proxy (themselves, forwarding to the "
        "masters; the default) or direct (the masters' addresses)",
    )
    up.add_argument(
        "--broker-sets",
        type=FlagNumber("--broker-sets", int, 0, BROKER_SETS_MAX),
        default=1,
        help=f"broker sets (0-{BROKER_SETS_MAX})",
    )
    up.add_argument(
        "--replicas",
        type=FlagNumber("--replicas", int, 1, REPLICAS_MAX),
        default=3,
        help=f"brokers per set (1-{REPLICAS_MAX})",
    )
    up.add_argument(
        "--clusters",
        type=FlagNumber("--clusters", int, 1, CLUSTERS_MAX),
        default=1,
        help=f"clusters a, b, ... (1-{CLUSTERS_MAX}), each like the first",
    )
    up.add_argument(
        "--replicate", action="store_true", help="also run a replicator with a rule a -> b for every topic"
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="make a local CA in DIR/tls/ and run every gRPC port over mutual TLS",
    )
    up.add_argument(
        "--auth",
        action="store_true",
        help="admin writes need a credential: tokens in DIR/auth/ (with --tls, certificates too)",
    )
    up.add_argument(
        "--anonymous-reads",
        action="store_true",
        help="with --auth: reads, sends and fetches need no credential (by default they need one)",
    )

    from mqmeta.broker_agent.service import add_broker_parser
    from mqmeta.data_cli import add_data_parsers

    add_broker_parser(sub)
    add_data_parsers(sub)

    admin = sub.add_parser("admin", help="gRPC admin calls")
    from mqmeta.controller.admin_cli import add_admin_commands

    add_admin_commands(admin)
    from mqmeta.chaos.cli import add_chaos_parsers

    add_chaos_parsers(sub)
    from mqmeta.spark.cli import add_audit_parser

    add_audit_parser(sub)
    from mqmeta.replicator import add_replicator_parser

    add_replicator_parser(sub)
    _add_tls_flags_to_leaves(sub, TLS_COMMANDS)
    _describe(sub)
    return parser


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
    parser = build_parser()
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
    if args.command == "controller":
        from mqmeta.controller.run import run_controller

        return run_controller(args)
    if args.command == "namesrv":
        from mqmeta.controller.run import run_namesrv

        return run_namesrv(args)
    if args.command == "local":
        from mqmeta.cluster.local import local_up

        return local_up(args)
    if args.command == "broker":
        from mqmeta.broker_agent.service import run_broker

        return run_broker(args)
    if args.command in ("produce", "consume"):
        from mqmeta import data_cli

        return data_cli.run_produce(args) if args.command == "produce" else data_cli.run_consume(args)
    if args.command == "admin":
        from mqmeta.controller.admin_cli import run_admin

        return run_admin(args)
    if args.command == "chaos" and args.chaos_command == "faultfs":
        from mqmeta.chaos.faultfs.cli import run_faultfs  # needs no Spark session

        return run_faultfs(args)
    if args.command == "chaos":
        require_extra("chaos", "the chaos suite")
        from mqmeta.chaos.cli import run_chaos
        from mqmeta.spark.cli import (
            shared_session_audit,
            shared_session_replication_status,
            stop_shared_session,
        )

        try:
            return run_chaos(
                args, shared_session_audit, stop_shared_session, shared_session_replication_status
            )
        finally:
            stop_shared_session()  # a replication run's X1 used the session too
    if args.command == "audit":
        from mqmeta.spark.cli import run_audit

        return run_audit(args)
    if args.command == "replicator":
        from mqmeta.replicator import run_replicator

        return run_replicator(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
