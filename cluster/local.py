"""`mqmeta local up`: a whole cluster on this machine, in the foreground.

The layout (ports, ids, the generated Raft secret) is written once to DIR/layout.json,
so running the command again on the same DIR restarts the same cluster from its data.
The command holds the cluster's ports while it runs (cluster/ports.py), so no other
process takes one before its child binds it. Once every node answers, DIR/cluster.json
says where everything is.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cluster.layout import (
    Layout,
    broker_command,
    controller_command,
    ensure_secret,
    load_or_create_layout,
    namesrv_command,
    tiered_dir,
)
from cluster.ready import wait_brokers_ready, wait_ready
from cluster.supervisor import Supervisor
from mqmeta.errors import InvalidArgument
from mqmeta.formats.atomic import write_json_atomically

CONTROLLERS_MAX = 7


def local_up(args: argparse.Namespace) -> int:
    if not 1 <= args.controllers <= CONTROLLERS_MAX or args.controllers % 2 == 0:
        raise InvalidArgument(f"--controllers must be odd, from 1 to {CONTROLLERS_MAX}")
    if not 0 <= args.broker_sets <= 26 or not 1 <= args.replicas <= 5:
        raise InvalidArgument("--broker-sets must be 0 to 26 and --replicas 1 to 5")
    root = args.data_dir.resolve()
    layout, ports = load_or_create_layout(
        root, args.controllers, args.embedded, args.broker_sets, args.replicas
    )
    with ports:
        return _run(root, layout)


def _run(root: Path, layout: Layout) -> int:
    ensure_secret(root)
    supervisor = Supervisor(root)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        for node in layout.controllers:
            supervisor.start(node.id, controller_command(root, layout, node))
        if not layout.embedded:
            supervisor.start("namesrv", namesrv_command(layout))
        wait_ready(layout.controller_addresses, layout.namesrv)
        for broker in layout.brokers:
            supervisor.start(broker.name, broker_command(root, layout, broker))
        statuses = wait_brokers_ready(layout.brokers) if layout.brokers else {}
        document = cluster_document(root, layout, supervisor)
        document["brokers"] = [
            {
                "cluster": statuses[b.name].cluster,
                "broker_name": b.broker_name,
                "broker_id": statuses[b.name].broker_id,
                "grpc": b.grpc,
                "pid": supervisor.children[b.name].pid,
                "data_dir": str(root / b.data_dir),
                "metrics": b.metrics,
            }
            for b in layout.brokers
        ]
        write_json_atomically(root / "cluster.json", document, indent=2)
        print(
            f"mqmeta local cluster ready: controllers {layout.controller_addresses}; "
            f"nameserver {','.join(layout.namesrv)}; see {root / 'cluster.json'}",
            flush=True,
        )
        _supervise(supervisor, stop)
    finally:
        supervisor.stop_all()
    return 0


def _supervise(supervisor: Supervisor, stop: threading.Event) -> None:
    reported: set[str] = set()
    while not stop.wait(0.5):
        for name in supervisor.dead():
            if name not in reported:
                reported.add(name)
                print(
                    f"mqmeta local: {name} exited with status "
                    f"{supervisor.children[name].returncode}; see logs/{name}.log",
                    file=sys.stderr,
                    flush=True,
                )


def cluster_document(root: Path, layout: Layout, supervisor: Supervisor) -> dict[str, Any]:
    controllers = [
        {
            "id": n.id,
            "grpc": n.grpc,
            "raft": n.raft,
            "pid": supervisor.children[n.id].pid,
            "data_dir": str(root / n.data_dir),
            "metrics": n.metrics,
        }
        for n in layout.controllers
    ]
    if layout.embedded:
        namesrv = [
            {"grpc": n.namesrv, "pid": supervisor.children[n.id].pid, "metrics": n.metrics}
            for n in layout.controllers
        ]  # one process: the controller's metrics
    else:
        namesrv = [
            {
                "grpc": layout.namesrv[0],
                "pid": supervisor.children["namesrv"].pid,
                "metrics": layout.namesrv_metrics,
            }
        ]
    tiered = {"url": str(tiered_dir(root))} if layout.brokers else None
    return {
        "controllers": controllers,
        "namesrv": namesrv,
        "brokers": [],
        "tiered_store": tiered,
        "embedded": layout.embedded,
    }
