"""`mqmeta local up`: a whole cluster on this machine, in the foreground.

The layout (ports, ids, the generated Raft secret) is written once to DIR/layout.json,
so running the command again on the same DIR restarts the same cluster from its data.
Once every node answers, DIR/cluster.json says where everything is.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument, MqmetaError, Unavailable
from mqmeta.formats.atomic import write_json_atomically
from mqmeta.pb import controller_pb2 as pb

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
CONTROLLERS_MAX = 7


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class NodeLayout:
    id: str
    grpc: str
    raft: str
    data_dir: str  # relative to the cluster directory
    namesrv: str = ""  # embedded deployment: this node's nameserver address


@dataclass
class BrokerLayout:
    name: str  # process name: {broker_name}-{replica}
    broker_name: str
    grpc: str
    data_dir: str  # relative to the cluster directory


def broker_set_name(index: int) -> str:
    return "broker-" + "abcdefghijklmnopqrstuvwxyz"[index]


@dataclass
class Layout:
    embedded: bool
    controllers: list[NodeLayout]
    namesrv: list[str]
    brokers: list[BrokerLayout] = field(default_factory=list)

    @staticmethod
    def create(count: int, embedded: bool, broker_sets: int = 0, replicas: int = 0) -> Layout:
        ports = free_ports(count * 3 + 1 + broker_sets * replicas)
        nodes = [
            NodeLayout(
                id=f"c{i + 1}",
                grpc=f"127.0.0.1:{ports[3 * i]}",
                raft=f"127.0.0.1:{ports[3 * i + 1]}",
                data_dir=f"controllers/c{i + 1}",
                namesrv=f"127.0.0.1:{ports[3 * i + 2]}" if embedded else "",
            )
            for i in range(count)
        ]
        namesrv = [n.namesrv for n in nodes] if embedded else [f"127.0.0.1:{ports[3 * count]}"]
        broker_ports = iter(ports[3 * count + 1 :])
        brokers = [
            BrokerLayout(
                name=f"{broker_set_name(s)}-{r + 1}",
                broker_name=broker_set_name(s),
                grpc=f"127.0.0.1:{next(broker_ports)}",
                data_dir=f"brokers/{broker_set_name(s)}-{r + 1}",
            )
            for s in range(broker_sets)
            for r in range(replicas)
        ]
        return Layout(embedded, nodes, namesrv, brokers)

    def peer_flags(self) -> list[str]:
        flags = []
        for node in self.controllers:
            flags += ["--peer", f"{node.id}={node.raft}/{node.grpc}"]
        return flags

    @property
    def controller_addresses(self) -> str:
        return ",".join(n.grpc for n in self.controllers)


def load_or_create_layout(
    root: Path, count: int, embedded: bool, broker_sets: int = 0, replicas: int = 0
) -> Layout:
    path = root / "layout.json"
    if path.exists():
        data = json.loads(path.read_text())
        layout = Layout(
            data["embedded"],
            [NodeLayout(**n) for n in data["controllers"]],
            data["namesrv"],
            [BrokerLayout(**b) for b in data.get("brokers", [])],
        )
        if (
            len(layout.controllers) != count
            or layout.embedded != embedded
            or len(layout.brokers) != broker_sets * replicas
        ):
            raise InvalidArgument(
                f"{root} already holds a cluster of {len(layout.controllers)} controllers "
                f"(embedded={layout.embedded}) and {len(layout.brokers)} brokers; use the same "
                "flags or another --data-dir"
            )
        return layout
    layout = Layout.create(count, embedded, broker_sets, replicas)
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, asdict(layout), indent=2)
    return layout


def ensure_secret(root: Path) -> Path:
    path = root / "secret"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path


def controller_command(root: Path, layout: Layout, node: NodeLayout) -> list[str]:
    base = [sys.executable, "-m", "mqmeta.cli"]
    flags = [
        "--id",
        node.id,
        "--grpc",
        node.grpc,
        "--raft",
        node.raft,
        "--data-dir",
        str(root / node.data_dir),
        "--secret-file",
        str(root / "secret"),
        *layout.peer_flags(),
    ]
    if layout.embedded:
        return [*base, "namesrv", "--listen", node.namesrv, "--embed-controller", *flags]
    return [*base, "controller", *flags]


def broker_command(root: Path, layout: Layout, broker: BrokerLayout) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mqmeta.cli",
        "broker",
        "--broker-name",
        broker.broker_name,
        "--listen",
        broker.grpc,
        "--controllers",
        layout.controller_addresses,
        "--data-dir",
        str(root / broker.data_dir),
        "--tiered-store",
        str(tiered_dir(root)),
    ]


def tiered_dir(root: Path) -> Path:
    """The embedded default tiered store: a local directory beside the cluster's data."""
    return root / "tiered"


def wait_brokers_ready(brokers: list[BrokerLayout], timeout_s: float = READY_TIMEOUT_S) -> dict:
    """Every broker registered with a role, and every broker set with a writable master."""
    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = {}
        for broker in brokers:
            with grpc.insecure_channel(broker.grpc) as channel:
                try:
                    statuses[broker.name] = broker_pb2_grpc.BrokerServiceStub(channel).GetHaStatus(
                        broker_pb2.HaStatusRequest(), timeout=1.0
                    )
                except grpc.RpcError:
                    break
        if len(statuses) == len(brokers) and all(s.role != "FENCED" for s in statuses.values()):
            writable = {s.broker_name for s in statuses.values() if s.writable}
            if writable == {b.broker_name for b in brokers}:
                return statuses
        time.sleep(0.1)
    raise Unavailable(f"the brokers did not become ready within {timeout_s:.0f}s; see the logs")


def namesrv_command(layout: Layout) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mqmeta.cli",
        "namesrv",
        "--listen",
        layout.namesrv[0],
        "--controllers",
        layout.controller_addresses,
    ]


class Supervisor:
    """Starts child processes with their logs in DIR/logs and stops them all together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, command: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log_file = open(self.root / "logs" / f"{name}.log", "ab")
        env = dict(
            os.environ, MQMETA_LOG_LEVEL=os.environ.get("MQMETA_LOG_LEVEL", "INFO"), **(extra_env or {})
        )
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
        )
        log_file.close()
        self.children[name] = proc
        return proc

    def dead(self) -> list[str]:
        return [name for name, p in self.children.items() if p.poll() is not None]

    def stop_all(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_ready(controllers: str, namesrv: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Every controller agrees on a leader and every nameserver reports SERVING."""
    deadline = time.monotonic() + timeout_s
    addresses = controllers.split(",")
    while time.monotonic() < deadline:
        if all(_leader_known(a) for a in addresses) and all(_serving(a) for a in namesrv):
            return
        time.sleep(0.1)
    raise Unavailable(f"the cluster did not become ready within {timeout_s:.0f}s; see the logs")


def _leader_known(address: str) -> bool:
    try:
        with ControllerClient([address], timeout_s=1.0) as client:
            return bool(client.call("GetMetadata", pb.GetMetadataRequest()).leader_id)
    except MqmetaError:
        return False


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def local_up(args: argparse.Namespace) -> int:
    if not 1 <= args.controllers <= CONTROLLERS_MAX or args.controllers % 2 == 0:
        raise InvalidArgument(f"--controllers must be odd, from 1 to {CONTROLLERS_MAX}")
    if not 0 <= args.broker_sets <= 26 or not 1 <= args.replicas <= 5:
        raise InvalidArgument("--broker-sets must be 0 to 26 and --replicas 1 to 5")
    root = args.data_dir.resolve()
    layout = load_or_create_layout(root, args.controllers, args.embedded, args.broker_sets, args.replicas)
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
        }
        for n in layout.controllers
    ]
    if layout.embedded:
        namesrv = [{"grpc": n.namesrv, "pid": supervisor.children[n.id].pid} for n in layout.controllers]
    else:
        namesrv = [{"grpc": layout.namesrv[0], "pid": supervisor.children["namesrv"].pid}]
    tiered = {"url": str(tiered_dir(root))} if layout.brokers else None
    return {
        "controllers": controllers,
        "namesrv": namesrv,
        "brokers": [],
        "tiered_store": tiered,
        "embedded": layout.embedded,
    }
