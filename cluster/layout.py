"""Where each process of a local cluster listens and keeps its data, and how it is started.

The layout (ports, ids) is written once to DIR/layout.json, so a later run on the same
DIR restarts the same cluster from its data; the Raft secret is DIR/secret (mode 0600).
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mqmeta.errors import InvalidArgument
from mqmeta.formats.atomic import write_json_atomically


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
