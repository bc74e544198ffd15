"""`mqmeta replicator`: its flags, and a replication worker (worker.py) run until a signal stops it."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from typing import Any

from mqmeta.replicator.worker import Worker

from mqmeta.config_file import accept_config_file
from mqmeta.formats.replication_rules import load_config
from mqmeta.rpc import exit_at_once
from mqmeta.validate import parse_addresses, validate_name

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("replicator", help="run a cross-cluster replication worker")
    parser.add_argument("--config", type=Path, required=True, help="TOML file: [replicator] and [[rules]]")
    parser.add_argument(
        "--worker-id",
        default="w1",
        help="this worker's name in logs and, with controllers, its identity (unique per worker)",
    )
    parser.add_argument(
        "--metrics-listen", default="", help="HOST:PORT for Prometheus text per task (port 0: any)"
    )
    # worker_id and metrics_listen may also be keys of the file's [replicator] table
    accept_config_file(parser, section="replicator")


def run(args: argparse.Namespace) -> int:
    validate_name("--worker-id", args.worker_id)
    config = load_config(args.config)
    worker = Worker(config, args.worker_id)
    if args.metrics_listen:
        from mqmeta.replicator.metrics import serve_metrics

        address = parse_addresses(args.metrics_listen, "--metrics-listen address", allow_port_zero=True)[0]
        bound = serve_metrics(address, worker.running)
        log.warning("worker %s: metrics on %s", args.worker_id, bound)  # tests and scripts read the port

    def _stop(signum: int, frame: object) -> None:
        if not worker.stop.is_set():  # the first signal decides: SIGTERM leaves cleanly
            worker.graceful = signum == signal.SIGTERM
        worker.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    where = f"leases from {','.join(config.controllers)}" if config.controllers else "every task itself"
    log.info("worker %s: %d rules, runs %s", args.worker_id, len(config.rules), where)
    worker.run()
    exit_at_once(0)  # as the servers do: the interpreter's finalization is slow under load
