"""`mqmeta local up`: its flags, and the whole cluster on this machine (cluster/local.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mqmeta.cluster.local import BROKER_SETS_MAX, CLUSTERS_MAX, CONTROLLERS_MAX, REPLICAS_MAX, local_up

from mqmeta.validate import FlagNumber


def add_parser(subparsers: Any) -> None:
    """`mqmeta local` and its one command, `up`."""
    local = subparsers.add_parser("local", help="run a whole cluster on this machine")
    local_sub = local.add_subparsers(dest="local_command", required=True, parser_class=type(local))
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


def run(args: argparse.Namespace) -> int:
    """`mqmeta local up` (the only `local` command)."""
    assert args.local_command == "up", args.local_command
    return local_up(args)
