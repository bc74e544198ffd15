"""The chaos suite's fault shapes and proxied links, without processes.

- majorities ring: every node still sees a majority (itself included) and no two nodes see
  the same majority; for 3 nodes that cuts every link;
- bridge: two halves cannot talk, the bridge node talks to everyone;
- every link kind of the cluster gets a proxy: Raft both ways, broker -> controller,
  slave -> master (gRPC, and the HA stream to the master's fixed stream port),
  nameserver -> controller, client -> nameserver/controller/broker;
- bad run settings are refused with a sentence (CLI exit 2).
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from mqmeta.chaos.faults import FAULT_NAMES, bridge, majorities_ring
from mqmeta.chaos.net import _links
from mqmeta.chaos.runner import RunConfig
from mqmeta.cluster.harness import Cluster

from mqmeta.errors import InvalidArgument

pytestmark = pytest.mark.timeout(60)


def _sees(node: str, nodes: list[str], cut: set[frozenset[str]]) -> frozenset[str]:
    return frozenset(
        [node] + [other for other in nodes if other != node and frozenset((node, other)) not in cut]
    )


@pytest.mark.parametrize("count", [5, 7])
def test_majorities_ring_gives_each_node_its_own_majority(count):
    nodes = [f"n{i}" for i in range(count)]
    for seed in range(20):
        cut = majorities_ring(nodes, random.Random(seed))
        views = [_sees(n, nodes, cut) for n in nodes]
        assert all(len(v) > count // 2 for v in views), "every node sees a majority"
        assert len(set(views)) == count, "no two nodes see the same majority"


def test_majorities_ring_of_three_cuts_every_link():
    nodes = ["a", "b", "c"]
    assert majorities_ring(nodes, random.Random(1)) == {
        frozenset(p) for p in (("a", "b"), ("b", "c"), ("a", "c"))
    }


def test_bridge_splits_two_halves_joined_by_one_node():
    nodes = [f"n{i}" for i in range(5)]
    cut = bridge(nodes, random.Random(3))
    touched = {n for pair in cut for n in pair}
    bridges = [n for n in nodes if n not in touched]
    assert len(bridges) == 1 and len(cut) == 4  # 2 x 2 pairs across the halves
    left = {n for n in nodes if n != bridges[0] and frozenset((n, nodes[0])) not in cut}
    assert all(frozenset((a, b)) not in cut for a in left for b in left)


def test_every_link_kind_gets_its_own_proxy(tmp_path):
    with Cluster(tmp_path / "c", count=3, broker_sets=1, replicas=3) as cluster:  # never started
        links = _links(cluster)
    pairs = {(link.source, link.destination) for link in links}
    assert len({link.name for link in links}) == len(links), "one proxy per (source, destination, kind)"
    assert len(pairs) == len([link for link in links if not link.stream])
    controllers = {n.id: n for n in cluster.layout.controllers}
    assert ("c1", "c2") in pairs and ("c2", "c1") in pairs
    raft = next(link for link in links if (link.source, link.destination) == ("c1", "c2"))
    assert raft.upstream == controllers["c2"].raft
    assert {
        ("broker-a-1", "c1"),
        ("broker-a-2", "broker-a-1"),
        ("namesrv", "c3"),
        ("client", "namesrv"),
        ("client", "c1"),
        ("client", "broker-a-3"),
    } <= pairs
    assert not any(link.source == link.destination for link in links)
    streams = {(link.source, link.destination): link for link in links if link.stream}
    assert set(streams) == {(a, b) for a, b in pairs if a.startswith("broker") and b.startswith("broker")}
    brokers = {b.name: b for b in cluster.layout.brokers}
    assert streams["broker-a-2", "broker-a-1"].upstream == brokers["broker-a-1"].ha_stream
    assert len(links) == 6 + 9 + 6 + 6 + 3 + 1 + 3 + 3


def test_run_settings_are_validated(tmp_path):
    good = dict(fault="noop", output_dir=tmp_path, time_limit_s=10, interval_s=5)
    RunConfig(**good).validate()
    for bad, message in (
        ({"fault": "meteor"}, "unknown fault"),
        ({"fault_target": "clients"}, "fault-target"),
        ({"interval_s": 20}, "interval"),
        ({"concurrency": 0}, "concurrency"),
        ({"consumers": 0}, "consumers"),
        ({"workload": "kv"}, "workload"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            RunConfig(**dict(good, **bad)).validate()
    assert "all-kill" in FAULT_NAMES and len(FAULT_NAMES) == len(set(FAULT_NAMES))
    assert {"power-loss-node", "power-loss-all", "slow-disk", "fsync-eio", "corrupt-replica"} <= set(
        FAULT_NAMES
    )
    assert {"disk-full", "slow-replica", "clock-jump"} <= set(FAULT_NAMES)
    with pytest.raises(InvalidArgument, match="unknown fault 'meteor'"):
        RunConfig(**dict(good, fault="noop,meteor")).validate()
    (tmp_path / "history.tsv").write_text("")
    with pytest.raises(InvalidArgument, match="already holds a chaos run"):
        RunConfig(**good).validate()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["chaos", "run", "--fault", "meteor", "--output-dir", "x"], "unknown fault"),
        (["chaos", "matrix", "--faults", "noop,meteor", "--output-dir", "x"], "unknown meteor"),
        (["chaos", "run", "--fault", "noop", "-t", "5", "-i", "9", "--output-dir", "x"], "interval"),
        (["chaos", "run", "--fault", "noop", "--consumers", "0", "--output-dir", "x"], "consumers"),
        (
            ["chaos", "run", "--fault", "noop", "--fault-target", "clients", "--output-dir", "x"],
            "fault-target",
        ),
        (
            [
                "chaos",
                "run",
                "--workload",
                "replication",
                "--fault",
                "random-delay",
                "--fault-target",
                "workers",
            ]
            + ["--output-dir", "x"],
            "applies to none of workers",
        ),
        (
            [
                "chaos",
                "matrix",
                "--workload",
                "replication",
                "--faults",
                "leader-kill@link",
                "--output-dir",
                "x",
            ],
            "applies to none of link",
        ),
        (
            ["chaos", "matrix", "--faults", "leader-kill@link", "--output-dir", "x"],
            "replication workload only",
        ),
    ],
)
def test_chaos_cli_rejects_bad_input_with_exit_2(argv, message, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mqmeta.cli", *argv], capture_output=True, text=True, cwd=tmp_path, timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists(), "nothing is started or written on bad input"


def test_network_cuts_poisons_and_heals_the_right_proxies(tmp_path):
    """Against a real (in-process) Toxiproxy-compatible server: a cut disables exactly the
    proxies between the two nodes (both directions), a toxic lands on both streams of the
    chosen links, heal restores everything; each process's dial map names its own proxies."""
    import json

    from mqmeta.chaos.net import ProxiedNetwork
    from mqmeta.chaos.toxiproxy import ToxiproxyServer

    with (
        ToxiproxyServer("127.0.0.1:0") as server,
        Cluster(tmp_path / "c", count=3, broker_sets=1, replicas=3) as cluster,  # never started
    ):
        network = ProxiedNetwork(cluster, server.url)
        network.create()
        proxies = network.server.proxies()
        assert len(proxies) == len(network.links) == len(_links(cluster))
        assert network.cut([("c1", "c2"), ("broker-a-1", "c3")]) == 3
        disabled = {name for name, p in network.server.proxies().items() if not p.enabled}
        assert disabled == {"c1__c2", "c2__c1", "broker-a-1__c3"}
        assert network.cut([("broker-a-2", "broker-a-1")]) == 4, "gRPC and HA stream, both ways"
        disabled = {name for name, p in network.server.proxies().items() if not p.enabled} - disabled
        assert disabled == {
            "broker-a-2__broker-a-1",
            "broker-a-1__broker-a-2",
            "broker-a-2__broker-a-1__stream",
            "broker-a-1__broker-a-2__stream",
        }
        assert network.add_toxic(network.between(["c1"], ["c2"]), "latency", {"latency": 5}) == 2
        toxics = network.server.get_proxy("c1__c2").toxics()
        assert sorted(t.stream for t in toxics.values()) == ["downstream", "upstream"]
        network.heal()
        assert all(p.enabled for p in network.server.proxies().values())
        assert network.server.get_proxy("c1__c2").toxics() == {}
        broker_map = json.loads((cluster.root / "dial" / "broker-a-2.json").read_text())
        by_name = {link.name: link for link in network.links}
        link = by_name["broker-a-2__broker-a-1"]
        assert broker_map[link.upstream] == link.listen
        stream = by_name["broker-a-2__broker-a-1__stream"]
        assert broker_map[stream.upstream] == stream.listen, "the slave dials its master's stream proxy"
        assert network.env_for("broker-a-2") == {
            "MQMETA_DIAL_MAP": str(cluster.root / "dial" / "broker-a-2.json")
        }
        cluster_ports = {a.rpartition(":")[2] for a in cluster.layout.addresses()}
        assert not cluster_ports & {link.listen.rpartition(":")[2] for link in network.links}


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_consumer_shares_split_the_queues(count):
    """The queue workload's consumers (Consumer share (i, n)) together pull every queue of
    the topic exactly once, whatever order the route lists them in."""
    from mqmeta.broker_client import Consumer, QueueRef

    queues = [QueueRef(f"broker-{b}", q) for b in "ab" for q in range(8)]
    shares = []
    for index in range(count):
        consumer = Consumer("127.0.0.1:1", "Orders", "g", share=(index, count))
        consumer.routes.queues = lambda topic: random.sample(queues, len(queues))  # type: ignore[method-assign]
        shares.append(consumer.queues())
        consumer.close()
    pulled = [q for share in shares for q in share]
    assert sorted(pulled, key=str) == sorted(queues, key=str)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(InvalidArgument, match="share"):
        Consumer("127.0.0.1:1", "Orders", "g", share=(count, count))
