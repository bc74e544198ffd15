"""`python -m bench.peers [--quick]`: mqmeta beside etcd, RabbitMQ and NATS, on this
machine, in one run, and one JSON document on stdout.

Each system runs as three nodes on 127.0.0.1 in a temporary directory (bench/peers/
servers.py); a peer that is not installed is skipped and named in `skipped`. Every
figure comes from the same Python load generator (bench/peers/load.py), in rounds that
alternate which system goes first; within a round each phase (one writer, 16 writers,
...) runs on every system back to back before the next phase. Metadata: mqmeta's
controller against etcd (one write = create a topic / put a key; one linearizable read =
the controller's configuration / a range read). Messages: mqmeta's brokers (one master, two slaves, acks
from the whole SyncStateSet) against a RabbitMQ quorum queue and a NATS JetStream R3
stream. `ratios` are mqmeta ÷ peer: each system's median figure over the rounds, one
divided by the other. `ratios_by_round` pairs the figures instead: a round's two
figures of one phase were taken seconds apart, so their ratio is what that round
measured, and the median of those ratios is less moved by a machine whose speed drifts
between rounds (the rounds' ratios are listed beside it).

One phase runs twice: one sync producer, as the kernel places the processes (`send_1`,
the headline) and with mqmeta's brokers and RabbitMQ's nodes pinned alike, the leading
node first (`send_1_placed`, bench/peers/placement.py): on a VM that runs a woken
process after the one that woke it, that placement decides much of a send's latency,
and not by the same amount for every system (`send_p50_vs_rabbitmq_placed_alike`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import brokerlib
from bench.benchlib import _r, _ratio, machine, make_log, percentile, run_main, seconds_summary
from bench.peers import load, placement
from bench.peers.servers import PEERS, Etcd, Nats, RabbitMQ, absent, b64, http_json

log = make_log("peers")
STARTED: list[Any] = []  # peers to stop on exit
WATCHDOG_S = {"quick": 14 * 60, "full": 45 * 60}
ONLY = {"metadata": ("etcd",)}
# --compare-call-stream: the same mqmeta cluster, driven by clients that make gRPC calls
NO_CALL_STREAM = "mqmeta-no-call-stream"  # --only: the peers each restricted run keeps


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 short rounds (under 15 minutes)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; quick 5)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per measurement (10; quick 4)")
    parser.add_argument("--peers", default="etcd,rabbitmq,nats", help="which peers to run (comma-separated)")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy phase")
    parser.add_argument("--root", default="", help="where the clusters live (default: a temp dir)")
    parser.add_argument(
        "--only",
        choices=sorted(ONLY),
        default=None,
        help="only these phases: `metadata` runs the controller beside etcd (writes, reads, the "
        "fsync count and the profile of 1 and 16 writers), no messages, kills or restarts",
    )
    parser.add_argument(
        "--compare-call-stream",
        action="store_true",
        help=f"also drive the same mqmeta cluster with clients that make gRPC calls, not the "
        f"call stream, in the same rounds: `{NO_CALL_STREAM}`",
    )
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (5 if args.quick else 3)
    args.duration = args.duration or (4.0 if args.quick else 10.0)
    args.warmup = 1.0 if args.quick else 2.0
    args.kills = 3 if args.quick else 10
    args.fsync_writes = 100 if args.quick else 300
    if args.only == "metadata":
        args.peers = ",".join(p for p in args.peers.split(",") if p in ONLY["metadata"])
    unknown = set(args.peers.split(",")) - set(PEERS) - {""}
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; choose from {sorted(PEERS)}")
    return args


# Systems ------------------------------------------------------------------------------------


class Mqmeta:
    """The mqmeta cluster: 3 controllers, a namesrv, one broker set of 3 (brokerlib's)."""

    name = "mqmeta"

    def __init__(self, root: Path, directory: str = "mqmeta", flags: list[str] | None = None) -> None:
        self.root = root
        self.directory = directory
        self.flags = flags or []  # the brokers' own, after brokerlib.FLAGS
        self.cluster: Any = None
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        self.cluster, self.info = brokerlib.start_cluster(
            self.root, self.directory, [*brokerlib.FLAGS, *self.flags], no_tiered=True
        )

    @property
    def addresses(self) -> list[str]:
        return [n.grpc for n in self.cluster.layout.controllers]

    def controller_pids(self) -> dict[str, int]:
        return {
            n.id: self.cluster.supervisor.children[n.id].pid
            for n in self.cluster.layout.controllers
            if self.cluster.is_running(n.id)
        }

    def broker_pids(self) -> dict[str, int]:
        return brokerlib.broker_pids(self.cluster)

    def stop(self) -> None:
        if self.cluster is not None:
            brokerlib.stop_cluster(self.cluster)


# Phases --------------------------------------------------------------------------------------


def _metadata_clients(name: str, system: Any) -> tuple[Any, Any]:
    """(write factory (k, batch), read factory (k)) for one system."""
    if name.startswith("mqmeta"):
        streamed = name != NO_CALL_STREAM
        return (
            partial(load.MqmetaWrite, system.addresses, call_stream=streamed),
            partial(load.MqmetaRead, system.addresses, call_stream=streamed),
        )
    endpoint = system.endpoint(system.leader() or "e0")
    return partial(load.EtcdWrite, endpoint), partial(load.EtcdRead, endpoint)


def _side_by_side(order: list[str], phases: dict[str, Any]) -> dict[str, Any]:
    """{system: {phase: figures}}: each phase (a function of the system's name) runs on
    every system in `order`, back to back, before the next phase starts: the two figures a
    ratio divides are taken seconds apart, not a whole system's phases apart, so a change
    in the machine's load within a round moves both alike."""
    out: dict[str, Any] = {name: {} for name in order}
    for phase, measure in phases.items():
        for name in order:
            out[name][phase] = measure(name)
    return out


def metadata_round(systems: dict[str, Any], order: list[str], args) -> dict[str, Any]:
    clients = {name: _metadata_clients(name, systems[name]) for name in order}
    out = _side_by_side(
        order,
        {
            "write_1": lambda name: load.drive(clients[name][0], 1, args.warmup, args.duration),
            "read_1": lambda name: load.drive(clients[name][1], 1, args.warmup, args.duration),
            "write_16": lambda name: load.drive(clients[name][0], 16, args.warmup, args.duration),
            "write_16x32": lambda name: load.drive(
                partial(_batched, clients[name][0], load.BATCH), 16, args.warmup, args.duration, load.BATCH
            ),
        },
    )
    for name, figures in out.items():
        log(
            f"{name}: write p50 {figures['write_1'].get('p50_ms')} ms, read p50 "
            f"{figures['read_1'].get('p50_ms')} ms, 16 writers {figures['write_16']['ops_per_s']}/s"
        )
    return out


def _batched(factory: Any, batch: int, k: int) -> Any:
    return factory(k, batch)


def _send_client(name: str, system: Any) -> Any:
    """A send factory (k, batch) for one system (an mqmeta one by any name: NO_CALL_STREAM
    sends as gRPC calls)."""
    if name.startswith("mqmeta"):
        streamed = name != NO_CALL_STREAM
        return lambda k, batch=1: load.MqmetaSend(system.cluster.namesrv, brokerlib.TOPIC, batch, streamed)
    if name == "rabbitmq":
        return lambda k, batch=1: load.RabbitSend(system.amqp_ports[0], k)
    return lambda k, batch=1: load.NatsSend(system.url(0), k, batch)


def message_round(systems: dict[str, Any], order: list[str], args) -> dict[str, Any]:
    """The message phases, side by side (as metadata_round's); RabbitMQ's queue is purged
    before each of its phases."""
    senders = {name: _send_client(name, systems[name]) for name in order}

    def sends(producers: int) -> Any:
        def measure(name: str) -> dict[str, Any]:
            if name == "rabbitmq":
                load.rabbit_purge(systems[name].amqp_ports[0])
            return load.drive(senders[name], producers, args.warmup, args.duration)

        return measure

    def batched(name: str) -> dict[str, Any]:
        if name == "rabbitmq":
            return {"skipped": "pika's blocking channel confirms one publish at a time"}
        return load.drive(
            partial(_batched, senders[name], load.BATCH), 4, args.warmup, args.duration, load.BATCH
        )

    out = _side_by_side(
        order,
        {
            "send_1": sends(1),
            "send_1_placed": lambda name: placed_alike(name, systems[name], lambda: sends(1)(name)),
            "send_16": sends(16),
            "send_4x32": batched,
        },
    )
    for name, figures in out.items():
        log(
            f"{name}: send p50 {figures['send_1'].get('p50_ms')} ms "
            f"({figures['send_1_placed'].get('p50_ms')} placed alike), 16 producers "
            f"{figures['send_16']['ops_per_s']}/s, 4x32 {figures['send_4x32'].get('ops_per_s')}/s"
        )
    return out


def placed_alike(name: str, system: Any, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`measure()` with the system's nodes placed alike (placement.placed), or why it was
    left out ({"skipped": ...})."""
    nodes = _leader_first(name, system)
    if isinstance(nodes, str):
        return {"skipped": nodes}
    with placement.placed(nodes):
        return measure()


def _leader_first(name: str, system: Any) -> list[int] | str:
    """The pids of a system's three nodes, the one that leads first (placement.placed);
    why not, as a sentence, for a system that phase leaves out."""
    if len(placement.usable_cpus()) < 2:
        return "one CPU: nothing to place"
    if getattr(system, "cluster", None) is not None:  # an mqmeta cluster (bench.peers.sends has several)
        try:
            master = system.cluster.master_of(brokerlib.BROKER_SET, timeout_s=10.0)
        except Exception as exc:  # no master named in time: the phase is left out, not the run
            return f"no master to place: {exc}"[:300]
        pids = brokerlib.all_pids(system.cluster, master)
        nodes = [pids[who] for who in ("master", "slave1", "slave2") if who in pids]
        return nodes if len(nodes) == 3 else "a broker is not running"
    if name == "rabbitmq":
        pids = system.pids()  # r0 leads the quorum queue: it is declared there (servers.py)
        return [pids[node] for node in ("r0", "r1", "r2")] if len(pids) == 3 else "a node is not running"
    return "only mqmeta's brokers and RabbitMQ are placed (the one-send target's pair)"


def fsync_phase(systems: dict[str, Any], root: Path, args) -> dict[str, Any]:
    out: dict[str, Any] = {}
    writes = args.fsync_writes
    for name, system in systems.items():
        if name == "mqmeta":
            client = load.MqmetaWrite(system.addresses, 99)
            out["mqmeta_controller"] = load.count_fsyncs(
                list(system.controller_pids().values()), client, writes, root / "strace-mqmeta-controller.txt"
            )
            client.close()
            if args.only == "metadata":
                continue
            sender = load.MqmetaSend(system.cluster.namesrv, brokerlib.TOPIC)
            out["mqmeta_broker"] = load.count_fsyncs(
                list(system.broker_pids().values()), sender, writes, root / "strace-mqmeta-broker.txt"
            )
            sender.close()
        elif name == "etcd":
            client = load.EtcdWrite(system.endpoint(system.leader() or "e0"), 99)
            out["etcd"] = load.count_fsyncs(
                list(system.pids().values()), client, writes, root / "strace-etcd.txt"
            )
            client.close()
        elif name == "rabbitmq":
            client = load.RabbitSend(system.amqp_ports[0], 99)
            out["rabbitmq"] = load.count_fsyncs(
                list(system.pids().values()), client, writes, root / "strace-rabbitmq.txt"
            )
            client.close()
        elif name == "nats":
            client = load.NatsSend(system.url(0), 99)
            out["nats"] = load.count_fsyncs(
                list(system.pids().values()), client, writes, root / "strace-nats.txt"
            )
            client.close()
        log(f"fsyncs: {name} done")
    return out


def _first_success(attempt, timeout_s: float) -> float | None:
    """Seconds until `attempt()` first returns True (None if not within timeout_s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if attempt():
                return time.monotonic() - t0
        except Exception:
            pass
        time.sleep(0.005)
    return None


def _kill_summary(to_write: list[float | None], to_serve: list[float | None]) -> dict[str, Any]:
    """Each figure over the kills that succeeded; `failed` counts those that did not."""
    out: dict[str, Any] = {}
    for name, samples in (("leader_kill_to_next_write_s", to_write), ("restart_to_serving_s", to_serve)):
        out[name] = seconds_summary([s for s in samples if s is not None])
        out[name]["failed"] = sum(1 for s in samples if s is None)
    return out


def mqmeta_kills(system: Mqmeta, kills: int) -> dict[str, Any]:
    """kill -9 of the controller leader -> the next write acknowledged; then the killed
    node's restart -> its first linearizable read answered."""
    to_write: list[float | None] = []
    to_serve: list[float | None] = []
    for k in range(kills):
        took, served = _mqmeta_kill_once(system.cluster, k)
        to_write.append(took)
        to_serve.append(served)
    return _kill_summary(to_write, to_serve)


def _mqmeta_kill_once(cluster: Any, k: int) -> tuple[float | None, float | None]:
    from mqmeta.client import ControllerClient
    from mqmeta.errors import AlreadyExists
    from mqmeta.pb import controller_pb2 as pb

    leader = cluster.leader_id()
    others = [n.grpc for n in cluster.layout.controllers if n.id != leader]
    attempt = iter(range(1_000_000))

    def write(client: Any) -> bool:
        # a new name per attempt: an attempt that timed out may have committed
        spec = pb.TopicSpec(name=f"kill-{k}-{next(attempt)}-{time.monotonic_ns()}", queue_count=1)
        try:
            return bool(client.create_topic(spec, timeout_s=0.5))
        except AlreadyExists:
            return True

    with ControllerClient(others, timeout_s=0.5) as client:
        cluster.kill(leader)
        took = _first_success(lambda: write(client), 30.0)
    t0 = time.monotonic()
    cluster.start_node(leader)
    served = _first_success(lambda: _read_once(cluster.node(leader).grpc), 60.0)
    restart = None if served is None else time.monotonic() - t0
    cluster.leader_id()
    return took, restart


def _read_once(address: str) -> bool:
    """One linearizable read on one node, over a new channel (as etcd's side gets a new
    connection per attempt: gRPC's reconnect backoff would otherwise be measured)."""
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    with ControllerClient([address], timeout_s=0.5) as client:
        return bool(client.get_config(pb.GetConfigRequest(), timeout_s=0.5))


def etcd_kills(system: Etcd, kills: int) -> dict[str, Any]:
    to_write: list[float | None] = []
    to_serve: list[float | None] = []
    for k in range(kills):
        if _first_success(lambda: system.leader() is not None, 20.0) is None:
            continue
        took, served = _etcd_kill_once(system, k)
        to_write.append(took)
        to_serve.append(served)
    return _kill_summary(to_write, to_serve)


def _etcd_kill_once(system: Etcd, k: int) -> tuple[float | None, float | None]:
    leader = system.leader() or "e0"
    others = [system.endpoint(n) for n in system.procs if n != leader]
    put = {"key": b64(f"kill-{k}"), "value": b64(b"x" * load.ETCD_VALUE_BYTES)}

    def write() -> bool:
        for endpoint in others:  # what a client with every endpoint does
            try:
                http_json(endpoint, "/v3/kv/put", put, timeout_s=0.5)
                return True
            except OSError:
                continue
        return False

    system.kill(leader)
    took = _first_success(write, 30.0)
    t0 = time.monotonic()
    system.restart(leader)
    endpoint = system.endpoint(leader)
    served = _first_success(
        lambda: bool(http_json(endpoint, "/v3/kv/range", {"key": b64("peers-read")}, timeout_s=0.5)), 60.0
    )
    return took, (None if served is None else time.monotonic() - t0)


def idle_rss(systems: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, system in systems.items():
        pids = system.controller_pids() if name == "mqmeta" else system.pids()
        values = {node: load.rss_mb(pid) for node, pid in pids.items()}
        out[name] = {
            "per_node_mb": values,
            "mean_mb": _r(sum(v or 0 for v in values.values()) / max(1, len(values)), 1),
        }
        if name == "mqmeta":
            brokers = {node: load.rss_mb(pid) for node, pid in system.broker_pids().items()}
            out["mqmeta_broker"] = {"per_node_mb": brokers}
    return out


def profile_phase(system: Mqmeta, root: Path, duration_s: float, only: str | None = None) -> dict[str, Any]:
    """py-spy on the mqmeta processes while one client sends (and, apart, writes metadata;
    with `only` metadata: one writer and 16)."""
    if only == "metadata":
        return {
            f"metadata_write_{writers}": _profile_metadata(
                system, root / f"meta-{writers}", duration_s, writers
            )
            for writers in (1, 16)
        }
    out: dict[str, Any] = {}
    cluster = system.cluster
    master = brokerlib.wait_in_sync(cluster, 3)
    pids = brokerlib.all_pids(cluster, master)
    targets = {k: v for k, v in pids.items() if k in ("master", "slave1", "slave2", "bench")}
    spies = brokerlib.start_py_spy({"dir": root, "rate": 200, "gil": False}, targets, duration_s)
    time.sleep(1.0)  # py-spy attaches
    sent = load.drive(lambda k: load.MqmetaSend(cluster.namesrv, brokerlib.TOPIC), 1, 0.0, duration_s - 1.5)
    out["send_1"] = {"figures": sent, "processes": brokerlib.finish_py_spy(spies)}
    out["metadata_write_1"] = _profile_metadata(system, root / "meta", duration_s, 1)
    return out


def _profile_metadata(system: Mqmeta, where: Path, duration_s: float, writers: int) -> dict[str, Any]:
    """py-spy (every thread, not only the GIL holder) on the controllers and this process
    while `writers` clients write metadata."""
    where.mkdir(parents=True, exist_ok=True)
    leader = system.cluster.leader_id()
    controllers = {
        ("leader" if n == leader else f"follower-{n}"): p for n, p in system.controller_pids().items()
    }
    controllers["bench"] = os.getpid()
    spies = brokerlib.start_py_spy({"dir": where, "rate": 200, "gil": False}, controllers, duration_s)
    time.sleep(1.0)  # py-spy attaches
    written = load.drive(lambda k: load.MqmetaWrite(system.addresses, k), writers, 0.0, duration_s - 1.5)
    return {"figures": written, "processes": brokerlib.finish_py_spy(spies)}


# Summary ------------------------------------------------------------------------------------


def _median_over_rounds(rounds: list[dict[str, Any]], system: str, phase: str, key: str) -> float | None:
    values = [
        r[system].get(phase, {}).get(key)
        for r in rounds
        if system in r and r[system].get(phase, {}).get(key) is not None
    ]
    return _r(percentile(values, 50)) if values else None


def summarize(result: dict[str, Any]) -> None:
    meta = result.get("metadata_rounds", [])
    msgs = result.get("message_rounds", [])
    figures: dict[str, Any] = {}
    for system in ("mqmeta", NO_CALL_STREAM, "etcd"):
        if any(system in r for r in meta):
            figures[system] = {
                "metadata_write_p50_ms": _median_over_rounds(meta, system, "write_1", "p50_ms"),
                "metadata_read_p50_ms": _median_over_rounds(meta, system, "read_1", "p50_ms"),
                "metadata_writes_per_s_16": _median_over_rounds(meta, system, "write_16", "ops_per_s"),
                "metadata_writes_per_s_16x32": _median_over_rounds(meta, system, "write_16x32", "ops_per_s"),
                "metadata_machine_cpu_ms_per_write_16": _median_over_rounds(
                    meta, system, "write_16", "machine_cpu_ms_per_op"
                ),
            }
    for system in ("mqmeta", NO_CALL_STREAM, "rabbitmq", "nats"):
        if any(system in r for r in msgs):
            figures.setdefault(system, {}).update(
                {
                    "send_p50_ms": _median_over_rounds(msgs, system, "send_1", "p50_ms"),
                    "send_p50_ms_placed_alike": _median_over_rounds(msgs, system, "send_1_placed", "p50_ms"),
                    "sends_per_s_1": _median_over_rounds(msgs, system, "send_1", "ops_per_s"),
                    "sends_per_s_16": _median_over_rounds(msgs, system, "send_16", "ops_per_s"),
                    "sends_per_s_4x32": _median_over_rounds(msgs, system, "send_4x32", "ops_per_s"),
                    "send_machine_cpu_ms_per_message_16": _median_over_rounds(
                        msgs, system, "send_16", "machine_cpu_ms_per_op"
                    ),
                }
            )
    kills = result.get("kills", {})
    for system in ("mqmeta", "etcd"):
        if system in kills:
            figures.setdefault(system, {})["leader_kill_to_next_write_p99_s"] = kills[system][
                "leader_kill_to_next_write_s"
            ].get("p99_s")
            figures[system]["restart_to_serving_p50_s"] = kills[system]["restart_to_serving_s"].get("p50_s")
    for system, rss in result.get("idle_rss", {}).items():
        if system in figures:
            figures[system]["rss_idle_mb_per_node"] = rss.get("mean_mb")
    result["figures"] = figures
    m, e, r, n = (figures.get(s, {}) for s in ("mqmeta", "etcd", "rabbitmq", "nats"))
    result["ratios"] = {
        "metadata_write_p50_vs_etcd": _ratio(m.get("metadata_write_p50_ms"), e.get("metadata_write_p50_ms")),
        "metadata_read_p50_vs_etcd": _ratio(m.get("metadata_read_p50_ms"), e.get("metadata_read_p50_ms")),
        "metadata_writes_per_s_16_vs_etcd": _ratio(
            m.get("metadata_writes_per_s_16"), e.get("metadata_writes_per_s_16")
        ),
        "metadata_writes_per_s_16x32_vs_etcd": _ratio(
            m.get("metadata_writes_per_s_16x32"), e.get("metadata_writes_per_s_16x32")
        ),
        "leader_kill_to_next_write_p99_vs_etcd": _ratio(
            m.get("leader_kill_to_next_write_p99_s"), e.get("leader_kill_to_next_write_p99_s")
        ),
        "restart_to_serving_vs_etcd": _ratio(
            m.get("restart_to_serving_p50_s"), e.get("restart_to_serving_p50_s")
        ),
        "rss_idle_vs_etcd": _ratio(m.get("rss_idle_mb_per_node"), e.get("rss_idle_mb_per_node")),
        "send_p50_vs_rabbitmq": _ratio(m.get("send_p50_ms"), r.get("send_p50_ms")),
        "send_p50_vs_rabbitmq_placed_alike": _ratio(
            m.get("send_p50_ms_placed_alike"), r.get("send_p50_ms_placed_alike")
        ),
        "sends_per_s_16_vs_rabbitmq": _ratio(m.get("sends_per_s_16"), r.get("sends_per_s_16")),
        "sends_per_s_4x32_vs_rabbitmq_16": _ratio(m.get("sends_per_s_4x32"), r.get("sends_per_s_16")),
        "send_p50_vs_nats": _ratio(m.get("send_p50_ms"), n.get("send_p50_ms")),
        "sends_per_s_16_vs_nats": _ratio(m.get("sends_per_s_16"), n.get("sends_per_s_16")),
        "sends_per_s_4x32_vs_nats": _ratio(m.get("sends_per_s_4x32"), n.get("sends_per_s_4x32")),
        "sends_per_s_16_vs_1_mqmeta": _ratio(m.get("sends_per_s_16"), m.get("sends_per_s_1")),
        "metadata_machine_cpu_per_write_16_vs_etcd": _ratio(
            m.get("metadata_machine_cpu_ms_per_write_16"), e.get("metadata_machine_cpu_ms_per_write_16")
        ),
        "send_machine_cpu_per_message_16_vs_rabbitmq": _ratio(
            m.get("send_machine_cpu_ms_per_message_16"), r.get("send_machine_cpu_ms_per_message_16")
        ),
    }
    result["ratios_by_round"] = ratios_by_round(result)
    g = figures.get(NO_CALL_STREAM)
    if g:  # the call stream beside gRPC calls, on the same cluster in the same rounds
        result["ratios"].update(
            {
                f"{key}_call_stream_vs_grpc": _ratio(m.get(key), g.get(key))
                for key in (
                    "metadata_write_p50_ms",
                    "metadata_read_p50_ms",
                    "metadata_writes_per_s_16",
                    "send_p50_ms",
                    "sends_per_s_16",
                    "sends_per_s_4x32",
                )
                if g.get(key) is not None
            }
        )


# (ratio name, rounds, mqmeta's phase, peer, peer's phase, figure)
_BY_ROUND = (
    ("metadata_write_p50_vs_etcd", "metadata_rounds", "write_1", "etcd", "write_1", "p50_ms"),
    ("metadata_read_p50_vs_etcd", "metadata_rounds", "read_1", "etcd", "read_1", "p50_ms"),
    ("metadata_writes_per_s_16_vs_etcd", "metadata_rounds", "write_16", "etcd", "write_16", "ops_per_s"),
    ("send_p50_vs_rabbitmq", "message_rounds", "send_1", "rabbitmq", "send_1", "p50_ms"),
    (
        "send_p50_vs_rabbitmq_placed_alike",
        "message_rounds",
        "send_1_placed",
        "rabbitmq",
        "send_1_placed",
        "p50_ms",
    ),
    ("sends_per_s_16_vs_rabbitmq", "message_rounds", "send_16", "rabbitmq", "send_16", "ops_per_s"),
    ("sends_per_s_4x32_vs_rabbitmq_16", "message_rounds", "send_4x32", "rabbitmq", "send_16", "ops_per_s"),
    ("sends_per_s_4x32_vs_nats", "message_rounds", "send_4x32", "nats", "send_4x32", "ops_per_s"),
    (
        "metadata_machine_cpu_per_write_16_vs_etcd",
        "metadata_rounds",
        "write_16",
        "etcd",
        "write_16",
        "machine_cpu_ms_per_op",
    ),
    (
        "send_machine_cpu_per_message_16_vs_rabbitmq",
        "message_rounds",
        "send_16",
        "rabbitmq",
        "send_16",
        "machine_cpu_ms_per_op",
    ),
)


def ratios_by_round(result: dict[str, Any]) -> dict[str, Any]:
    """For each ratio of _BY_ROUND (the targets' and the batched ones): mqmeta's figure ÷
    the peer's in each round that has both, and the median of those."""
    paired: dict[str, Any] = {}
    for name, rounds_key, phase, peer, peer_phase, figure in _BY_ROUND:
        ratios = []
        for round_ in result.get(rounds_key, []):
            if "mqmeta" in round_ and peer in round_:
                ratio = _ratio(
                    round_["mqmeta"].get(phase, {}).get(figure), round_[peer].get(peer_phase, {}).get(figure)
                )
                if ratio is not None:
                    ratios.append(ratio)
        paired[name] = {"median": _r(percentile(ratios, 50)) if ratios else None, "rounds": ratios}
    return paired


# Main ---------------------------------------------------------------------------------------


def start_systems(root: Path, wanted: list[str], result: dict[str, Any]) -> dict[str, Any]:
    systems: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    mqmeta = Mqmeta(root)
    STARTED.append(mqmeta)
    mqmeta.start()
    systems["mqmeta"] = mqmeta
    for name in wanted:
        why = absent(name)
        if why is not None:
            skipped[name] = why
            log(f"skipping {name}: {why}")
            continue
        peer = PEERS[name](root)
        STARTED.append(peer)
        t0 = time.monotonic()
        try:
            peer.start()
        except Exception as exc:
            skipped[name] = f"{name} did not start: {exc}"[:2000]
            log(skipped[name][:300])
            continue
        log(f"{name} up in {time.monotonic() - t0:.1f} s ({peer.version})")
        systems[name] = peer
    result["skipped"] = skipped
    result["systems"] = {
        "mqmeta": {"version": _mqmeta_version(), "settings": mqmeta.info},
        **{
            name: {"version": s.version, "settings": s.settings}
            for name, s in systems.items()
            if name != "mqmeta"
        },
    }
    return systems


def _mqmeta_version() -> str:
    import mqmeta

    try:
        commit = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return f"{mqmeta.__version__} ({commit})" if commit else mqmeta.__version__


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    wanted = [p for p in args.peers.split(",") if p]
    result["machine"] = machine()
    result["parameters"] = {
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "kills": args.kills,
        "fsync_writes": args.fsync_writes,
        "body_bytes": load.BODY_BYTES,
        "etcd_value_bytes": load.ETCD_VALUE_BYTES,
        "batch": load.BATCH,
        "only": args.only,
        "placement": placement.LAYOUT,
    }
    systems = start_systems(root, wanted, result)
    time.sleep(2.0)  # let start-up work settle before the idle memory figure
    result["idle_rss"] = idle_rss(systems)
    meta_systems = [s for s in ("mqmeta", "etcd") if s in systems]
    msg_systems = [s for s in ("mqmeta", "rabbitmq", "nats") if s in systems]
    drives = dict(systems)  # what the rounds drive: with the comparison, mqmeta twice
    if args.compare_call_stream:
        drives[NO_CALL_STREAM] = systems["mqmeta"]
        meta_systems.insert(1, NO_CALL_STREAM)
        msg_systems.insert(1, NO_CALL_STREAM)
    result["metadata_rounds"] = []
    result["message_rounds"] = []
    for k in range(args.rounds):
        log(f"round {k + 1}/{args.rounds}")
        meta_order = meta_systems[k % len(meta_systems) :] + meta_systems[: k % len(meta_systems)]
        msg_order = msg_systems[k % len(msg_systems) :] + msg_systems[: k % len(msg_systems)]
        result["metadata_rounds"].append(metadata_round(drives, meta_order, args))
        if args.only != "metadata":
            result["message_rounds"].append(message_round(drives, msg_order, args))
        summarize(result)
    result["fsyncs"] = fsync_phase(systems, root, args)
    if not args.no_profile:
        result["profile"] = profile_phase(
            systems["mqmeta"], root / "profile", min(10.0, args.duration + 3), args.only
        )
    if args.only == "metadata":
        result["machine"]["load_average_at_end"] = list(os.getloadavg())
        summarize(result)
        return
    result["kills"] = {"mqmeta": mqmeta_kills(systems["mqmeta"], args.kills)}
    if "etcd" in systems:
        result["kills"]["etcd"] = etcd_kills(systems["etcd"], args.kills)
    time.sleep(2.0)
    result["idle_rss_after_load"] = idle_rss(systems)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    summarize(result)


def cleanup() -> None:
    for system in reversed(STARTED):
        try:
            system.stop()
        except Exception as exc:  # keep stopping the others
            log(f"stopping {system.name}: {exc!r}")
    STARTED.clear()
    placement.stop_spinners()
    brokerlib.cleanup()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.keep = bool(args.root)
    args.budget_s = WATCHDOG_S["quick" if args.quick else "full"]
    root = Path(args.root) if args.keep else Path(tempfile.mkdtemp(prefix="mqmeta-peers-"))
    (root / "profile" / "meta").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"benchmark": "bench.peers", "quick": args.quick, "only": args.only}
    return run_main(
        args,
        root,
        result,
        lambda t0: run(args, root, result),
        summarize,
        cleanup,
        log,
        watchdog_grace_s=60.0,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["Etcd", "Mqmeta", "Nats", "RabbitMQ", "main"]
