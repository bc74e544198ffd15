"""`python -m bench.peers.restart`: restart of a controller node -> serving, beside etcd's
(when installed), and where the restarting controller spends the time. Short: about a
minute for the default 5 restarts of each.

Three controllers only (no brokers or nameserver: their traffic would be load), holding
`--topics` topics. Each restart kills -9 the leader, waits until a new leader commits a
write (as bench.peers' kill phase does), starts the node again and times its first
linearizable read (GetConfig), each attempt on a new connection. An attempt first checks
that the port accepts a TCP connection, as etcd's HTTP attempt finds a refused port at
once: otherwise a gRPC channel opened before the node listens waits out its reconnect
backoff and that is what gets measured. The restarted controller runs under
bench/peers/timed_controller.py; the seconds from the spawn to the end of each start-up
phase (interpreter, imports, arguments, raft_node, grpc_serving, leader_known, caught_up)
go in the JSON with the load average, and so does each controller's idle RSS (2 s after
the topics were created). etcd's side is bench.peers' own (`etcd_kills`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, _ratio, make_log, percentile, seconds_summary
from bench.peers import load, timed_controller
from bench.peers.run import _first_success, etcd_kills
from bench.peers.servers import Etcd, absent

log = make_log("restart")
FIRST_READ_TIMEOUT_S = 30.0
CONNECT_PROBE_TIMEOUT_S = 0.2
IDLE_SETTLE_S = 2.0
PHASES = ("interpreter", "imports", "arguments", "raft_node", "grpc_serving", "leader_known", "caught_up")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.restart", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--restarts", type=int, default=5, help="restarts of each system (default 5)")
    parser.add_argument("--topics", type=int, default=100, help="topics in the controllers' state (100)")
    parser.add_argument("--no-etcd", action="store_true", help="mqmeta alone")
    return parser.parse_args(argv)


def accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def read_once(address: str) -> bool:
    """One linearizable read on one node over a new channel, once its port accepts."""
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    if not accepts(address):
        return False
    with ControllerClient([address], timeout_s=0.5) as client:
        return bool(client.get_config(pb.GetConfigRequest(), timeout_s=0.5))


def phases_of(log_path: Path, offset: int, spawned_at: float) -> dict[str, float | None]:
    """Seconds from the spawn to the end of each phase, from the node's log after `offset`."""
    found: dict[str, float] = {}
    with open(log_path, "rb") as lines:
        lines.seek(offset)
        for raw in lines:
            words = raw.decode(errors="replace").split()
            if len(words) == 3 and words[0] == timed_controller.PHASE_PREFIX:
                found.setdefault(words[1], float(words[2]) - spawned_at)
    return {phase: _r(found.get(phase)) for phase in PHASES}


def restart_once(cluster: Any, k: int) -> dict[str, Any]:
    from mqmeta.cluster.layout import controller_command

    from mqmeta.pb import controller_pb2 as pb

    leader = cluster.leader_id()
    node = cluster.node(leader)
    cluster.kill(leader)
    with cluster.client([n.id for n in cluster.layout.controllers if n.id != leader], timeout_s=30) as client:
        client.create_topic(pb.TopicSpec(name=f"after-kill-{k}", queue_count=1))  # a new leader commits
    command = controller_command(cluster.root, cluster.layout, node) + ["--config", str(cluster._config_file)]
    assert command[1:3] == ["-m", "mqmeta.cli"], command
    command[1:3] = [str(Path(timed_controller.__file__).resolve())]
    log_path = cluster.root / "logs" / f"{leader}.log"
    offset = log_path.stat().st_size
    spawned_at = time.time()
    t0 = time.monotonic()
    cluster.supervisor.start(leader, command, cluster.process_env(leader))
    served = _first_success(lambda: read_once(node.grpc), FIRST_READ_TIMEOUT_S)
    restart_s = None if served is None else time.monotonic() - t0
    time.sleep(0.2)  # the last phase lines reach the log
    return {"restart_to_serving_s": _r(restart_s), "phases_s": phases_of(log_path, offset, spawned_at)}


def mqmeta_restarts(root: Path, restarts: int, topics: int) -> dict[str, Any]:
    from mqmeta.cluster.harness import Cluster

    from mqmeta.pb import controller_pb2 as pb

    cluster = Cluster(root / "mqmeta", count=3)
    try:
        cluster.start()
        with cluster.client() as client:
            for i in range(topics):
                client.create_topic(pb.TopicSpec(name=f"topic-{i}", queue_count=4))
        time.sleep(IDLE_SETTLE_S)
        idle_rss_mb = {
            n.id: load.rss_mb(cluster.supervisor.children[n.id].pid) for n in cluster.layout.controllers
        }
        samples = []
        for k in range(restarts):
            samples.append(restart_once(cluster, k))
            log(f"mqmeta restart {k + 1}/{restarts}: {samples[-1]['restart_to_serving_s']} s")
            cluster.wait_ready()
    finally:
        cluster.stop()
    times = [s["restart_to_serving_s"] for s in samples]
    phases = {
        phase: _r(percentile([s["phases_s"][phase] for s in samples if s["phases_s"][phase] is not None], 50))
        for phase in PHASES
    }
    summary = seconds_summary([t for t in times if t is not None])
    return {
        "restart_to_serving_s": summary,
        "failed": times.count(None),
        "phases_p50_s": phases,
        "idle_rss_mb": idle_rss_mb,
        "runs": samples,
    }


def etcd_restarts(root: Path, restarts: int) -> dict[str, Any]:
    etcd = Etcd(root)
    try:
        etcd.start()
        time.sleep(IDLE_SETTLE_S)
        idle_rss_mb = {node: load.rss_mb(pid) for node, pid in etcd.pids().items()}
        return dict(etcd_kills(etcd, restarts), idle_rss_mb=idle_rss_mb)
    finally:
        etcd.stop()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqmeta-restart-"))
    result: dict[str, Any] = {
        "benchmark": "bench.peers.restart",
        "parameters": {"restarts": args.restarts, "topics": args.topics},
        "load_average_at_start": list(os.getloadavg()),
    }
    result["mqmeta"] = mqmeta_restarts(root, args.restarts, args.topics)
    if not args.no_etcd:
        missing = absent("etcd")
        if missing:
            result["skipped"] = {"etcd": missing}
        else:
            result["etcd"] = etcd_restarts(root, args.restarts)
            result["restart_to_serving_p50_vs_etcd"] = _ratio(
                result["mqmeta"]["restart_to_serving_s"]["p50_s"],
                result["etcd"]["restart_to_serving_s"].get("p50_s"),
            )
    result["load_average_at_end"] = list(os.getloadavg())
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
