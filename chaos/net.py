"""The chaos cluster's network: a Toxiproxy proxy on every link, one per (source, destination).

Links (each a proxy named ``SOURCE__DESTINATION``):
- controller -> controller, Raft (both directions; pysyncobj dials from one side only);
- broker -> controller and nameserver -> controller, gRPC;
- broker -> broker of the same set, gRPC and the HA stream (a slave fetching from its
  master: the handshake over gRPC, the later fetches over the stream; both links are named
  SOURCE__DESTINATION, the stream's with the suffix ``__stream``, and a fault between the
  two brokers hits both);
- client -> nameserver, client -> controller, client -> broker (the workloads' process).

Every process keeps the real addresses as identities and dials through its own dial map
(`mqmeta/dialmap.py`), written here as `ROOT/dial/SOURCE.json`. A partition between
nodes A and B disables every proxy between them (both directions): existing connections
are closed and new ones refused. Clients are never partitioned from the cluster (like
OpenChaos's clients): an isolated master stays reachable to producers, which is exactly
the case that its lease must make safe.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass

from mqmeta.cluster.harness import Cluster
from toxiproxy import Toxiproxy

CLIENT = "client"
NAMESRV = "namesrv"
PROXY_SEPARATOR = "__"
STREAM_SUFFIX = "stream"  # the HA stream's link beside a slave's gRPC link to its master


@dataclass(frozen=True)
class Link:
    source: str
    destination: str
    upstream: str  # the real address dialled
    listen: str = ""  # the proxy's address, once created
    stream: bool = False  # the HA stream's link (broker -> broker), beside the gRPC one

    @property
    def name(self) -> str:
        name = f"{self.source}{PROXY_SEPARATOR}{self.destination}"
        return f"{name}{PROXY_SEPARATOR}{STREAM_SUFFIX}" if self.stream else name


def _links(cluster: Cluster) -> list[Link]:
    layout = cluster.layout
    controllers = layout.controllers
    links = [Link(a.id, b.id, b.raft) for a, b in itertools.permutations(controllers, 2)]
    for broker in layout.brokers:
        links += [Link(broker.name, c.id, c.grpc) for c in controllers]
        # every other broker of its set: each may become its master
        peers = [o for o in layout.brokers if o.broker_name == broker.broker_name and o.name != broker.name]
        links += [Link(broker.name, peer.name, peer.grpc) for peer in peers]
        # A layout written before HA stream ports has none: those slaves fetch over gRPC.
        links += [Link(broker.name, p.name, p.ha_stream, stream=True) for p in peers if p.ha_stream]
    if not layout.embedded:
        links += [Link(NAMESRV, c.id, c.grpc) for c in controllers]
        links += [Link(CLIENT, NAMESRV, address) for address in layout.namesrv]
    links += [Link(CLIENT, c.id, c.grpc) for c in controllers]
    links += [Link(CLIENT, b.name, b.grpc) for b in layout.brokers]
    return links


class ProxiedNetwork:
    """Creates the proxies on a Toxiproxy server and the per-process dial maps."""

    def __init__(self, cluster: Cluster, toxiproxy_url: str) -> None:
        self.cluster = cluster
        host, _, port = toxiproxy_url.removeprefix("http://").rstrip("/").rpartition(":")
        self.server = Toxiproxy()
        self.server.update_api_consumer(host, int(port))
        self.links: list[Link] = []

    def create(self) -> None:
        """One proxy per link (existing ones of the same name are replaced); dial maps."""
        self.server.destroy_all()
        created = []
        links = _links(self.cluster)
        for link in links:
            # Port 0: the proxy server binds a free port and answers with it. It cannot be
            # one of the cluster's: the Cluster holds those until it stops (cluster/ports.py).
            proxy = self.server.create(upstream=link.upstream, name=link.name, listen="127.0.0.1:0")
            created.append(Link(link.source, link.destination, link.upstream, proxy.listen, link.stream))
        self.links = created
        dial_dir = self.cluster.root / "dial"
        dial_dir.mkdir(exist_ok=True)
        for source in {link.source for link in created}:
            mapping = {link.upstream: link.listen for link in created if link.source == source}
            (dial_dir / f"{source}.json").write_text(json.dumps(mapping, indent=1, sort_keys=True))
        self.cluster.process_env = self.env_for

    def env_for(self, process_name: str) -> dict[str, str]:
        path = self.cluster.root / "dial" / f"{process_name}.json"
        return {"MQMETA_DIAL_MAP": str(path)} if path.exists() else {}

    def client_map(self) -> dict[str, str]:
        return {link.upstream: link.listen for link in self.links if link.source == CLIENT}

    # Faults ----------------------------------------------------------------------------
    def between(self, nodes_a: Iterable[str], nodes_b: Iterable[str]) -> list[Link]:
        a, b = set(nodes_a), set(nodes_b)
        return [
            link
            for link in self.links
            if (link.source in a and link.destination in b) or (link.source in b and link.destination in a)
        ]

    def touching(self, nodes: Iterable[str]) -> list[Link]:
        chosen = set(nodes)
        return [link for link in self.links if link.source in chosen or link.destination in chosen]

    def cut(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Disables every proxy between each pair of nodes; returns how many."""
        names = set()
        for a, b in pairs:
            names |= {link.name for link in self.between([a], [b])}
        for name in sorted(names):
            proxy = self.server.get_proxy(name)
            if proxy is not None:
                proxy.disable()
        return len(names)

    def add_toxic(
        self,
        links: Iterable[Link],
        toxic_type: str,
        attributes: dict[str, int],
        toxicity: float = 1.0,
        streams: tuple[str, ...] = ("upstream", "downstream"),
    ) -> int:
        """The same toxic on the given streams (both by default) of each link."""
        count = 0
        for link in links:
            proxy = self.server.get_proxy(link.name)
            if proxy is None:
                continue
            for stream in streams:
                proxy.add_toxic(type=toxic_type, stream=stream, toxicity=toxicity, attributes=attributes)
            count += 1
        return count

    def heal(self) -> None:
        """Every proxy enabled, every toxic removed (Toxiproxy's /reset)."""
        self.server.reset()
