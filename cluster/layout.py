"""Where each process of a local cluster listens and keeps its data, and how it is started.

The layout (ports, ids) is written once to DIR/layout.json, so a later run on the same
DIR restarts the same cluster from its data; the Raft secret is DIR/secret (mode 0600).
Whoever runs the cluster holds its ports (a PortReservation) while its processes live.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mqmeta.cluster.ports import PortReservation

from mqmeta.errors import InvalidArgument
from mqmeta.formats.atomic import fsync_dir, make_directories, write_json_atomically

DEFAULT_CLUSTER = "DefaultCluster"  # the brokers' --cluster default


@dataclass
class NodeLayout:
    id: str
    grpc: str
    raft: str
    data_dir: str  # relative to the cluster directory
    namesrv: str = ""  # embedded deployment: this node's nameserver address
    metrics: str = ""  # Prometheus text (HTTP); empty in layouts written before metrics
    remoting: str = ""  # embedded: its nameserver's RocketMQ remoting address; empty = none
    remoting_proxy: str = ""  # embedded: its proxies, "broker-a=HOST:PORT,..."; empty = none
    console: str = ""  # embedded: its nameserver's web console; empty in older layouts


@dataclass
class BrokerLayout:
    name: str  # process name: {broker_name}-{replica}
    broker_name: str
    grpc: str
    data_dir: str  # relative to the cluster directory
    metrics: str = ""  # Prometheus text (HTTP); empty in layouts written before metrics
    remoting: str = ""  # RocketMQ remoting address; empty in layouts written before it
    ha_stream: str = ""  # its HA stream's address (--ha-stream-port); empty: a port the kernel picks


def broker_set_name(index: int) -> str:
    return "broker-" + "abcdefghijklmnopqrstuvwxyz"[index]


@dataclass
class Layout:
    embedded: bool
    controllers: list[NodeLayout]
    namesrv: list[str]
    brokers: list[BrokerLayout] = field(default_factory=list)
    namesrv_metrics: str = ""  # the standalone nameserver's metrics address
    namesrv_remoting: str = ""  # the standalone nameserver's RocketMQ remoting address
    cluster: str = ""  # the brokers' cluster name ("": the default cluster)
    replicator_metrics: str = ""  # local up --replicate: its worker's metrics address
    namesrv_remoting_proxy: str = ""  # the standalone nameserver's proxies, "broker-a=HOST:PORT,..."
    namesrv_console: str = ""  # the standalone nameserver's web console; empty in older layouts

    @staticmethod
    def port_count(count: int, embedded: bool, broker_sets: int = 0, replicas: int = 0) -> int:
        """How many ports such a cluster listens on: gRPC and Raft per controller, a nameserver
        per controller (embedded) or one standalone, one per broker; then one metrics port
        per process; then a RocketMQ remoting port per nameserver and per broker; then a
        remoting proxy port per nameserver and broker set, then a web console per nameserver,
        then an HA stream port per broker."""
        processes = count + (0 if embedded else 1) + broker_sets * replicas
        nameservers = count if embedded else 1
        servers = count * (3 if embedded else 2) + (0 if embedded else 1) + broker_sets * replicas
        brokers = broker_sets * replicas
        return servers + processes + 2 * nameservers + 2 * brokers + nameservers * broker_sets

    @staticmethod
    def create(count: int, embedded: bool, broker_sets: int, replicas: int, addresses: list[str]) -> Layout:
        """The layout on `addresses` (HOST:PORT, port_count() of them, in this order)."""
        needed = Layout.port_count(count, embedded, broker_sets, replicas)
        if len(addresses) != needed:
            raise ValueError(f"this layout listens on {needed} addresses, {len(addresses)} were given")
        free = iter(addresses)
        nodes = []
        for i in range(count):
            grpc, raft = next(free), next(free)
            namesrv = next(free) if embedded else ""
            nodes.append(NodeLayout(f"c{i + 1}", grpc, raft, f"controllers/c{i + 1}", namesrv))
        namesrv_addresses = [n.namesrv for n in nodes] if embedded else [next(free)]
        brokers = [
            BrokerLayout(
                name=f"{broker_set_name(s)}-{r + 1}",
                broker_name=broker_set_name(s),
                grpc=next(free),
                data_dir=f"brokers/{broker_set_name(s)}-{r + 1}",
            )
            for s in range(broker_sets)
            for r in range(replicas)
        ]
        for node in nodes:  # metrics ports come last: older layouts keep theirs
            node.metrics = next(free)
        for broker in brokers:
            broker.metrics = next(free)
        namesrv_metrics = "" if embedded else next(free)
        for node in nodes if embedded else []:  # remoting ports after those: older layouts keep theirs
            node.remoting = next(free)
        namesrv_remoting = "" if embedded else next(free)
        for broker in brokers:
            broker.remoting = next(free)
        sets = [broker_set_name(s) for s in range(broker_sets)]
        for node in nodes if embedded else []:
            node.remoting_proxy = ",".join(f"{name}={next(free)}" for name in sets)
        namesrv_proxy = "" if embedded else ",".join(f"{name}={next(free)}" for name in sets)
        for node in nodes if embedded else []:  # consoles last: older layouts keep their ports
            node.console = next(free)
        namesrv_console = "" if embedded else next(free)
        for broker in brokers:  # HA stream ports after those: older layouts keep theirs
            broker.ha_stream = next(free)
        layout = Layout(embedded, nodes, namesrv_addresses, brokers, namesrv_metrics, namesrv_remoting)
        layout.namesrv_remoting_proxy = namesrv_proxy
        layout.namesrv_console = namesrv_console
        return layout

    def addresses(self) -> list[str]:
        """Every address a process of this cluster listens on (what its reservation holds)."""
        found = [a for n in self.controllers for a in (n.grpc, n.raft, n.namesrv) if a]
        found += [a for a in self.namesrv if a not in found]
        found += [b.grpc for b in self.brokers]
        metrics = [n.metrics for n in self.controllers] + [b.metrics for b in self.brokers]
        metrics += [self.namesrv_metrics, self.replicator_metrics]
        remoting = [n.remoting for n in self.controllers] + [self.namesrv_remoting]
        remoting += [b.remoting for b in self.brokers]
        proxies = [n.remoting_proxy for n in self.controllers] + [self.namesrv_remoting_proxy]
        remoting += [item.partition("=")[2] for p in proxies if p for item in p.split(",")]
        consoles = [n.console for n in self.controllers] + [self.namesrv_console]
        streams = [b.ha_stream for b in self.brokers]
        found += [a for a in metrics if a] + [a for a in remoting if a] + [a for a in consoles if a]
        return found + [a for a in streams if a]

    def peer_flags(self) -> list[str]:
        flags = []
        for node in self.controllers:
            flags += ["--peer", f"{node.id}={node.raft}/{node.grpc}"]
        return flags

    @property
    def controller_addresses(self) -> str:
        return ",".join(n.grpc for n in self.controllers)


def reserve_layout(
    count: int, embedded: bool, broker_sets: int = 0, replicas: int = 0
) -> tuple[Layout, PortReservation]:
    """A new layout on ports the kernel picks, and the reservation holding them: keep it
    until the cluster's processes are stopped for good (see cluster/ports.py)."""
    ports = PortReservation.pick(Layout.port_count(count, embedded, broker_sets, replicas))
    return Layout.create(count, embedded, broker_sets, replicas, ports.addresses), ports


def load_or_create_layout(
    root: Path, count: int, embedded: bool, broker_sets: int = 0, replicas: int = 0, cluster: str = ""
) -> tuple[Layout, PortReservation]:
    """DIR/layout.json's cluster (created on first use, with the brokers' cluster name),
    with its ports held for it. A DIR whose brokers are of another cluster is refused
    (InvalidArgument): its brokers would register under the wrong name."""
    path = root / "layout.json"
    if path.exists():
        data = json.loads(path.read_text())
        layout = Layout(
            data["embedded"],
            [NodeLayout(**n) for n in data["controllers"]],
            data["namesrv"],
            [BrokerLayout(**b) for b in data.get("brokers", [])],
            data.get("namesrv_metrics", ""),
            data.get("namesrv_remoting", ""),
            data.get("cluster", cluster),
            data.get("replicator_metrics", ""),
            data.get("namesrv_remoting_proxy", ""),
            data.get("namesrv_console", ""),
        )
        if layout.cluster != cluster:
            raise InvalidArgument(
                f"{root} holds the brokers of cluster {layout.cluster or DEFAULT_CLUSTER}, not of "
                f"cluster {cluster or DEFAULT_CLUSTER}: start it as it was first started, or use "
                "another --data-dir"
            )
        if "cluster" not in data:  # written before layouts named their cluster
            save_layout(root, layout)
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
        return layout, PortReservation.hold(layout.addresses())
    layout, ports = reserve_layout(count, embedded, broker_sets, replicas)
    layout.cluster = cluster
    try:
        make_directories(root)
        write_json_atomically(path, asdict(layout), indent=2)
    except BaseException:
        ports.release()
        raise
    return layout, ports


def save_layout(root: Path, layout: Layout) -> None:
    write_json_atomically(root / "layout.json", asdict(layout), indent=2)


def ensure_secret(root: Path) -> Path:
    path = root / "secret"
    if not path.exists():  # temp (0600) + fsync + rename + directory fsync: never empty
        tmp = root / "secret.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, secrets.token_urlsafe(32).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(root)
    return path


def controller_command(root: Path, layout: Layout, node: NodeLayout, secret: bool = True) -> list[str]:
    """`mqmeta controller` for `node`; secret=False: with --insecure-raft instead of the Raft
    secret (a benchmark beside a peer whose Raft traffic is not authenticated either)."""
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
        *(["--secret-file", str(root / "secret")] if secret else ["--insecure-raft"]),
        *layout.peer_flags(),
        *(["--metrics-listen", node.metrics] if node.metrics else []),
    ]
    if layout.embedded:
        remoting = ["--remoting-listen", node.remoting] if node.remoting else []
        remoting += ["--remoting-proxy", node.remoting_proxy] if node.remoting and node.remoting_proxy else []
        # every nameserver proxies RocketMQ 5 clients: each names them all in its routes
        proxies = ["--rocketmq-endpoints", ",".join(layout.namesrv)] if len(layout.namesrv) > 1 else []
        console = ["--console-listen", node.console] if node.console else []
        return [
            *base,
            "namesrv",
            "--listen",
            node.namesrv,
            "--embed-controller",
            *remoting,
            *proxies,
            *console,
            *flags,
        ]
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
        *(["--metrics-listen", broker.metrics] if broker.metrics else []),
        *(["--remoting-listen", broker.remoting] if broker.remoting else []),
        *(["--ha-stream-port", broker.ha_stream.rpartition(":")[2]] if broker.ha_stream else []),
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
        *(["--metrics-listen", layout.namesrv_metrics] if layout.namesrv_metrics else []),
        *(["--remoting-listen", layout.namesrv_remoting] if layout.namesrv_remoting else []),
        *(
            ["--remoting-proxy", layout.namesrv_remoting_proxy]
            if layout.namesrv_remoting and layout.namesrv_remoting_proxy
            else []
        ),
        *(["--console-listen", layout.namesrv_console] if layout.namesrv_console else []),
    ]
