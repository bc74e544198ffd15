"""The replication chaos workload: two clusters, replicator workers between them, faults on
every part, and what the target holds checked against what the source acknowledged.

Set-up (real processes, as cluster/harness.py builds them): clusters `a` (source) and `b`
(target), each one controller with an embedded nameserver and one broker set of 2
replicas, in OUT/cluster-a and OUT/cluster-b; topic `chaos` (4 queues) in both; `workers`
`mqmeta replicator` processes (OUT/workers/logs) all running one rule a -> b
(OUT/replicator.toml, start earliest), sharing the tasks through leases held by b's
controllers (`[replicator] controllers`, the production mode). Each worker dials b through
fault proxies ("the link": one proxy per address of b, its controllers included, on the
run's Toxiproxy-compatible server) and a directly.

Workload: the queue workload's producers send keyed messages into a (each key pinned to
one queue, sent in sequence; SUCCESS = a acknowledged). `consumers` consumers of one
group read b and record each record once per target position (a re-read of a position is
not a delivery), keeping its origin properties.

Faults (`--fault`, `--fault-target`; both may be comma-separated lists here). Round k
applies fault k mod n to the next place of the target list that takes it (`all` =
source,target,link,workers):
- source / target: kill and suspend faults as OpenChaos's (chaos/faults.py) on that
  cluster's processes; leader = the broker set's master; all-kill = every process of it;
- link: any partition fault cuts every proxy (open connections closed, new refused);
  random-delay adds 100 +- 50 ms each way; random-loss black-holes 30 % of streams;
- workers: kill = kill -9 and, at heal, start again; suspend = SIGSTOP / SIGCONT;
  random = one worker, fixed = the first, minor = n // 2, major and all-kill = a majority /
  all (workers have no leader: leader faults do not apply);
- source / target also take the disk faults (power-loss-node, power-loss-all, slow-disk,
  fsync-eio, disk-full: each node's data dir of both sites is then its own fault
  filesystem mount, chaos/disks.py) and corrupt-replica (a slave of that site's broker
  set; each site has one controller, so no follower controller to corrupt) and
  clock-jump (the site's controller's wall clock; each site's controller then reads an
  offset file); slow-replica is refused (a site has no proxies between its nodes);
- noop anywhere.

After the last heal the producers go on until a send to a succeeds, stop, and the
consumers get a bounded catch-up (at most max(drain_s, CATCH_UP_MIN_S)) to deliver every
acknowledged value. Then a fresh group reads all of b once more (the copies), every
process stops, and the checkers judge: lost (acknowledged at a, never at b), duplicated
(one origin key and offset at two positions of b), per-key order at b, origin order per
target queue, records at b without an origin. The X1 audit gets both clusters' dirs and
the rules file (see `ReplicationAuditFunction`).
"""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

from mqmeta.chaos import checkers
from mqmeta.chaos.clocks import NodeClocks
from mqmeta.chaos.disks import DISK_FAULTS, NodeDisks
from mqmeta.chaos.faults import (
    DELAY_JITTER_MS,
    DELAY_MS,
    FAULT_NAMES,
    LOSS_TIMEOUT_MS,
    LOSS_TOXICITY,
    FaultContext,
    make_fault,
)
from mqmeta.chaos.history import FaultEvent, FaultPhase, HistoryRecorder
from mqmeta.chaos.net import ProxiedNetwork
from mqmeta.chaos.workloads import (
    SEND_TIMEOUT_S,
    TOPIC,
    WorkloadConfig,
    _QueueProducer,
    record_dequeue,
    stop_producers_after_recovery,
)
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.supervisor import Supervisor
from toxiproxy import Toxiproxy

from mqmeta.broker_client import Consumer
from mqmeta.errors import InvalidArgument, MqmetaError
from mqmeta.formats import origin as origin_format
from mqmeta.pb import controller_pb2 as pb

log = logging.getLogger(__name__)

PLACES = ("source", "target", "link", "workers")
SITE_FLAGS = ["--ha-max-time-slave-not-catchup-ms", "1500", "--send-timeout-ms", "3000"]
QUEUE_COUNT = 4
GROUP = "chaos-replication"
SCAN_GROUP = "chaos-replication-scan"
RULE = "chaos-a-to-b"
DISCOVERY_INTERVAL_MS = 500
CATCH_UP_MIN_S = 60.0  # a target all-kill costs a restart, a failover and the worker's resume
SCAN_TIMEOUT_S = 30.0
SCAN_EMPTY_POLLS = 3  # a read of b is complete after this many empty polls in a row
HEAL_SETTLE_S = 2.0
AUDIT_TIMEOUT_S = 600.0
AUDIT_NOT_RUN_EXIT = 2  # `mqmeta audit` refusing the arguments: X1 is not there to run

# The X1 hook: (source cluster dir, target cluster dir, rules file, report dir) -> exit code
# (0 passed). mqmeta/cli.py lends one to chaos.cli.run (SharedAudits.replication_audit); without
# it a run calls `mqmeta audit SRC TARGET --rules FILE --report DIR` in a subprocess.
ReplicationAuditFunction = Callable[[Path, Path, Path, Path], int]


class ReplicationRunConfig(Protocol):
    """What a replication run reads of chaos.runner.RunConfig."""

    fault: str
    fault_target: str
    output_dir: Path
    concurrency: int
    rate_per_s: float
    consumers: int
    time_limit_s: float
    interval_s: float
    seed: int
    drain_s: float
    audit: bool
    workers: int


# Which places a fault applies to --------------------------------------------------------
# The faults of one cluster's disks, replicas and clock (chaos/faults.py), placed at source
# or target.
SITE_FAULTS = (*DISK_FAULTS, "corrupt-replica", "clock-jump")
# Refused: a site has no proxies between its own nodes (slow-replica delays a slave's link to
# its master; the run's proxy server is the link's, which resets all of its proxies).
SITE_FAULTS_REFUSED = ("slow-replica",)


def _kind(fault: str) -> str:
    if fault == "noop":
        return "noop"
    if fault in SITE_FAULTS:
        return "site"
    if fault.endswith(("-kill", "-suspend")):
        return "process"
    return "network"  # partitions, ring, bridge, delay, loss


def applies(fault: str, place: str) -> bool:
    kind = _kind(fault)
    if kind == "noop":
        return True
    if kind == "network":
        return place == "link"
    if kind == "site":
        return place in ("source", "target")
    if place == "workers":
        return not fault.startswith("leader-")
    return place in ("source", "target")


def parse_plan(fault: str, target: str) -> tuple[list[str], list[str]]:
    """The faults and places of a replication run; one sentence when one cannot apply."""
    faults = [f.strip() for f in fault.split(",") if f.strip()]
    places = list(PLACES) if target == "all" else [p.strip() for p in target.split(",") if p.strip()]
    unknown = [f for f in faults if f not in FAULT_NAMES]
    if not faults or unknown:
        raise InvalidArgument(
            f"unknown fault {','.join(unknown) or '(none)'}; choose from {', '.join(FAULT_NAMES)}"
        )
    refused = [f for f in faults if f in SITE_FAULTS_REFUSED]
    if refused:  # they would be taken for network faults and cut the link instead
        raise InvalidArgument(
            f"the replication workload does not take {','.join(refused)} (a site has no proxies "
            "between its nodes; run it with --workload queue or metadata)"
        )
    wrong = [p for p in places if p not in PLACES]
    if not places or wrong:
        raise InvalidArgument(
            f"--fault-target for the replication workload: all or a list of {', '.join(PLACES)}"
        )
    for name in faults:
        if not any(applies(name, p) for p in places):
            raise InvalidArgument(
                f"fault {name} applies to none of {','.join(places)} (kill and suspend: source, target, "
                "workers (not leader-*); disk faults and corrupt-replica: source, target; partition, "
                "delay and loss: link)"
            )
    return faults, places


# The two sites, the link, the workers ----------------------------------------------------
class Link:
    """One fault proxy per address of the target that a worker dials; the workers' dial map."""

    def __init__(self, target: Cluster, toxiproxy_url: str, root: Path) -> None:
        host, _, port = toxiproxy_url.removeprefix("http://").rstrip("/").rpartition(":")
        self.server = Toxiproxy()
        self.server.update_api_consumer(host, int(port))
        self.server.destroy_all()
        mapping = {}
        # b's controllers too: the workers hold their task leases there (cut with the link).
        upstreams = [
            *(n.grpc for n in target.layout.controllers),
            *target.layout.namesrv,
            *(b.grpc for b in target.layout.brokers),
        ]
        self.names = []
        for i, upstream in enumerate(upstreams):
            name = f"workers__b{i}"
            proxy = self.server.create(upstream=upstream, name=name, listen="127.0.0.1:0")
            mapping[upstream] = proxy.listen
            self.names.append(name)
        self.dial_map = root / "dial-workers.json"
        self.dial_map.write_text(json.dumps(mapping, indent=1, sort_keys=True))

    def _proxies(self) -> list[Any]:
        return [p for p in (self.server.get_proxy(n) for n in self.names) if p is not None]

    def cut(self) -> str:
        for proxy in self._proxies():
            proxy.disable()
        return f"cut the link to b ({len(self.names)} proxies)"

    def toxic(self, toxic_type: str, attributes: dict[str, int], toxicity: float = 1.0) -> None:
        for proxy in self._proxies():
            for stream in ("upstream", "downstream"):
                proxy.add_toxic(type=toxic_type, stream=stream, toxicity=toxicity, attributes=attributes)

    def heal(self) -> None:
        self.server.reset()


class Workers:
    """`count` replicator processes on one config, dialling b through the link."""

    def __init__(self, root: Path, config: Path, count: int, dial_map: Path) -> None:
        self.supervisor = Supervisor(root)
        self.names = [f"w{i + 1}" for i in range(count)]
        self.config = config
        self.env = {"MQMETA_DIAL_MAP": str(dial_map)}

    def start(self, name: str) -> None:
        command = [sys.executable, "-m", "mqmeta.cli", "replicator", "--config", str(self.config)]
        self.supervisor.start(name, [*command, "--worker-id", name], self.env)

    def is_running(self, name: str) -> bool:
        proc = self.supervisor.children.get(name)
        return proc is not None and proc.poll() is None

    def kill(self, name: str) -> None:
        proc = self.supervisor.children[name]
        proc.kill()
        proc.wait()

    def signal(self, name: str, signum: int) -> None:
        if self.is_running(name):
            self.supervisor.children[name].send_signal(signum)

    def stop(self) -> None:
        for name in self.names:
            self.signal(name, signal.SIGCONT)
        self.supervisor.stop_all()


def _site(root: Path, name: str) -> Cluster:
    return Cluster(
        root, count=1, embedded=True, broker_sets=1, replicas=2, broker_flags=[*SITE_FLAGS, "--cluster", name]
    )


def _write_rules(path: Path, a: Cluster, b: Cluster) -> Path:
    path.write_text(
        f"[replicator]\ndiscovery_interval_ms = {DISCOVERY_INTERVAL_MS}\n"
        f'controllers = "{b.addresses}"\n'
        f'[[rules]]\nname = "{RULE}"\nsource_namesrv = "{a.namesrv}"\ntarget_namesrv = "{b.namesrv}"\n'
        f'topic = "{TOPIC}"\nstart = "earliest"\n'
    )
    return path


# Faults ----------------------------------------------------------------------------------
class Places:
    """Everything a replication fault can hit."""

    def __init__(
        self,
        a: Cluster,
        b: Cluster,
        link: Link,
        workers: Workers,
        rng: random.Random,
        disks: dict[str, NodeDisks] | None = None,
        clocks: dict[str, NodeClocks] | None = None,
    ) -> None:
        self.sites = {"source": a, "target": b}
        self.disks = disks or {}  # by place, when the run has disk faults
        self.clocks = clocks or {}  # by place, when the run has clock-jump
        self.rounds: dict[str, int] = {}  # site faults injected so far, by place
        self.link = link
        self.workers = workers
        self.rng = rng


def inject(
    fault: str, place: str, places: Places, details: dict[str, Any] | None = None
) -> tuple[str, list[str], Callable[[], None]]:
    """Applies `fault` at `place`: (what it did, the processes or proxies hit, its heal).
    A site fault's record (pages lost, nodes not restarted, repairs) lands in `details`
    as it is injected and healed."""
    if fault == "noop":
        return "noop", [], lambda: None
    if place in places.sites:
        # a site has no proxies of its own: only kill, suspend, disk faults and corrupt-replica
        # reach here; corrupt-replica's follower controller does not exist (one per site)
        target = "brokers" if fault.startswith("leader-") or fault == "corrupt-replica" else "all"
        context = FaultContext(
            places.sites[place],
            cast(ProxiedNetwork, None),
            target,
            places.rng,
            disks=places.disks.get(place),
            clocks=places.clocks.get(place),
            rounds=places.rounds.get(place, 0),
        )
        site_fault = make_fault(fault, context)
        if details is not None:
            site_fault.details = details  # the same dict: filled by inject and by heal
        what = site_fault.inject()
        places.rounds[place] = context.rounds  # clock-jump alternates its direction per site
        return f"{place}: {what}", list(site_fault.affected), site_fault.heal
    if place == "link":
        return _link_fault(fault, places.link)
    return _worker_fault(fault, places.workers, places.rng)


def _link_fault(fault: str, link: Link) -> tuple[str, list[str], Callable[[], None]]:
    if fault == "random-delay":
        link.toxic("latency", {"latency": DELAY_MS, "jitter": DELAY_JITTER_MS})
        what = f"link: latency {DELAY_MS}+-{DELAY_JITTER_MS} ms each way"
    elif fault == "random-loss":
        link.toxic("timeout", {"timeout": LOSS_TIMEOUT_MS}, toxicity=LOSS_TOXICITY)
        what = f"link: black-holed {LOSS_TOXICITY:.0%} of streams"
    else:
        what = f"link: {link.cut()}"
    return what, list(link.names), link.heal


def _worker_fault(
    fault: str, workers: Workers, rng: random.Random
) -> tuple[str, list[str], Callable[[], None]]:
    names = workers.names
    prefix = fault.split("-", 1)[0]
    if fault == "all-kill":
        chosen = list(names)
    elif prefix == "minor":
        chosen = rng.sample(names, max(1, len(names) // 2))
    elif prefix == "major":
        chosen = rng.sample(names, len(names) // 2 + 1)
    elif prefix == "fixed":
        chosen = names[:1]
    else:
        chosen = rng.sample(names, 1)
    if fault.endswith("-kill"):
        for name in chosen:
            if workers.is_running(name):
                workers.kill(name)

        def restart() -> None:
            for name in chosen:
                if not workers.is_running(name):
                    workers.start(name)

        return f"workers: killed {','.join(chosen)}", chosen, restart
    for name in chosen:
        if workers.is_running(name):
            workers.supervisor.suspend(name)  # stopped for sure before anything else happens

    def resume() -> None:
        for name in chosen:
            workers.signal(name, signal.SIGCONT)

    return f"workers: suspended {','.join(chosen)}", chosen, resume


def _fault_loop(
    config: ReplicationRunConfig, places: Places, recorder: HistoryRecorder, faults: list[dict[str, Any]]
) -> None:
    """wait -> inject -> wait -> heal until the time limit; round k: fault k mod n at the next
    place of the target list that takes it."""
    names, targets = parse_plan(config.fault, config.fault_target)
    rounds: dict[str, int] = {}
    end = time.monotonic() + config.time_limit_s
    k = 0
    while time.monotonic() + config.interval_s <= end:
        time.sleep(config.interval_s)
        fault = names[k % len(names)]
        candidates = [p for p in targets if applies(fault, p)]
        place = candidates[rounds.get(fault, 0) % len(candidates)]
        rounds[fault] = rounds.get(fault, 0) + 1
        k += 1
        label = f"{fault}@{place}"
        start_ms = int(time.time() * 1000)
        heal: Callable[[], None] = lambda: None  # noqa: E731
        affected: list[str] = []
        details: dict[str, Any] = {}
        try:
            what, affected, heal = inject(fault, place, places, details)
        except MqmetaError as error:  # e.g. no writable master to pick right now: skipped
            what = f"not injected: {error.message}"
        recorder.record(FaultEvent(label, FaultPhase.START, start_ms, what))
        time.sleep(min(config.interval_s, max(0.0, end - time.monotonic())))
        heal()
        end_ms = int(time.time() * 1000)
        recorder.record(FaultEvent(label, FaultPhase.END, end_ms))
        faults.append(
            {
                "fault": fault,
                "place": place,
                "start_ms": start_ms,
                "end_ms": end_ms,
                "what": what,
                "affected": affected,
                **details,
            }
        )
    time.sleep(min(HEAL_SETTLE_S, max(0.0, end - time.monotonic())))


# The workload -----------------------------------------------------------------------------
def as_copy(message: Any) -> checkers.Copy:
    """A record read at b as the replication checker sees it."""
    props = message.properties
    value = message.body.decode(errors="replace").split("|", 1)[0]
    if origin_format.CLUSTER not in props:
        return checkers.Copy(message.queue_id, message.queue_offset, None, -1, value)
    origin = (
        props[origin_format.CLUSTER],
        props[origin_format.BROKER],
        props[origin_format.TOPIC],
        int(props[origin_format.QUEUE]),
    )
    return checkers.Copy(
        message.queue_id, message.queue_offset, origin, int(props[origin_format.OFFSET]), value
    )


def _refresh(consumer: Consumer) -> None:
    """Asks b's nameserver for the topic's route again; while b is down (all-kill) it does
    not answer, and the next poll tries again."""
    try:
        consumer.refresh()
    except MqmetaError:
        pass


class _TargetConsumer(threading.Thread):
    """Member `index` of `count` of one group at b: records each target position once."""

    def __init__(self, namesrv: str, recorder: HistoryRecorder, index: int, count: int) -> None:
        super().__init__(name=f"b-consumer-{index}", daemon=True)
        self.recorder = recorder
        self.client_id = -index
        self.consumer = Consumer(namesrv, TOPIC, GROUP, timeout_s=SEND_TIMEOUT_S, share=(index, count))
        self.stopping = threading.Event()
        self.positions: set[tuple[int, int]] = set()
        self.delivered: set[str] = set()
        self.reread = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                messages = self.consumer.poll()
            except MqmetaError:
                _refresh(self.consumer)
                self.stopping.wait(0.2)
                continue
            for message in messages:
                position = (message.queue_id, message.queue_offset)
                if position in self.positions:
                    self.reread += 1  # the same record read again: not a copy
                    continue
                self.positions.add(position)
                self.delivered.add(record_dequeue(self.recorder, self.client_id, message.body))
            if not messages:
                self.stopping.wait(0.05)
        self.consumer.close()


class ReplicationWorkload:
    def __init__(self, a: Cluster, b: Cluster, recorder: HistoryRecorder, config: WorkloadConfig) -> None:
        interval_s = config.concurrency / max(config.rate_per_s, 0.1)
        self.producers = [
            _QueueProducer(i + 1, a.namesrv, recorder, interval_s, ["broker-a"])
            for i in range(config.concurrency)
        ]
        self.consumers = [
            _TargetConsumer(b.namesrv, recorder, i, config.consumers) for i in range(config.consumers)
        ]
        self.catch_up_ms: int | None = None

    def acknowledged(self) -> set[str]:
        return set().union(*(p.acknowledged for p in self.producers))

    def delivered(self) -> set[str]:
        return set().union(*(c.delivered for c in self.consumers))

    def start(self) -> None:
        for thread in [*self.consumers, *self.producers]:
            thread.start()

    def stop(self, catch_up_s: float, healed_ms: int) -> None:
        """Produces until a send succeeds after the last heal (at most catch_up_s), stops the
        producers, then lets b catch up until every acknowledged value was delivered there
        (at most catch_up_s; `catch_up_ms` is how long it took, None if it never did)."""
        deadline = time.monotonic() + catch_up_s
        stop_producers_after_recovery(self.producers, healed_ms, deadline)
        acknowledged = self.acknowledged()
        started = time.monotonic()
        deadline = started + catch_up_s
        while time.monotonic() < deadline and not acknowledged <= self.delivered():
            time.sleep(0.1)
        if acknowledged <= self.delivered():
            self.catch_up_ms = int((time.monotonic() - started) * 1000)
        time.sleep(1.0)  # stragglers: a copy stored twice would show up here
        for consumer in self.consumers:
            consumer.stopping.set()
        for consumer in self.consumers:
            consumer.join(timeout=SEND_TIMEOUT_S * 2)


def read_target(b: Cluster, expected: set[str], timeout_s: float = SCAN_TIMEOUT_S) -> list[checkers.Copy]:
    """Every record of the topic at b, read by a fresh group to the end of every queue (after
    `expected` is all seen or `timeout_s`, the read ends at SCAN_EMPTY_POLLS empty polls)."""
    consumer = Consumer(b.namesrv, TOPIC, SCAN_GROUP, timeout_s=SEND_TIMEOUT_S)
    copies: list[checkers.Copy] = []
    missing = set(expected)
    empty = 0
    deadline = time.monotonic() + timeout_s
    try:
        while empty < SCAN_EMPTY_POLLS and time.monotonic() < deadline + timeout_s:
            try:
                batch = consumer.poll()
            except MqmetaError:
                _refresh(consumer)
                time.sleep(0.2)
                continue
            for message in batch:
                copy = as_copy(message)
                copies.append(copy)
                missing.discard(copy.value)
            empty = empty + 1 if not batch and (not missing or time.monotonic() > deadline) else 0
            if not batch:
                time.sleep(0.1)
    finally:
        consumer.close()
    return copies


# One run ----------------------------------------------------------------------------------
def run_replication(
    config: ReplicationRunConfig, toxiproxy_url: str, audit: ReplicationAuditFunction | None
) -> tuple[dict[str, Any], list[str]]:
    """Builds both sites, the link and the workers, runs the workload and the faults, stops
    every process; returns the checkers' result and the failures."""
    out = config.output_dir
    recorder = HistoryRecorder()
    faults: list[dict[str, Any]] = []
    a, b = _site(out / "cluster-a", "a"), _site(out / "cluster-b", "b")
    rules = _write_rules(out / "replicator.toml", a, b)
    workers: Workers | None = None
    link: Link | None = None
    copies: list[checkers.Copy] = []
    names, _ = parse_plan(config.fault, config.fault_target)
    disks: dict[str, NodeDisks] = {}
    if set(names) & set(DISK_FAULTS):  # every node of both sites on its own mount
        disks = {"source": NodeDisks(a, out / "disks-a"), "target": NodeDisks(b, out / "disks-b")}
    clocks: dict[str, NodeClocks] = {}
    if "clock-jump" in names:  # each site's controller reads its wall clock's offset from a file
        clocks = {"source": NodeClocks(a), "target": NodeClocks(b)}
        clocks["source"].install(a)
        clocks["target"].install(b)
    disk_counters: dict[str, Any] = {}
    try:
        for site_disks in disks.values():
            site_disks.mount()
        for name, site in (("a", a), ("b", b)):
            site.start()
            with site.client() as client:
                client.create_topic(pb.TopicSpec(name=TOPIC, cluster=name, queue_count=QUEUE_COUNT))
        link = Link(b, toxiproxy_url, out)
        workers = Workers(out / "workers", rules, config.workers, link.dial_map)
        for name in workers.names:
            workers.start(name)
        workload = ReplicationWorkload(
            a, b, recorder, WorkloadConfig(config.concurrency, config.rate_per_s, config.consumers)
        )
        places = Places(a, b, link, workers, random.Random(config.seed), disks, clocks)
        workload.start()
        try:
            _fault_loop(config, places, recorder, faults)
        finally:
            healed_ms = faults[-1]["end_ms"] if faults else 0
            workload.stop(max(config.drain_s, CATCH_UP_MIN_S), healed_ms)
        copies = read_target(b, workload.acknowledged())
        extra: dict[str, Any] = {
            "catchUpMs": workload.catch_up_ms,
            "rereadCount": sum(c.reread for c in workload.consumers),
        }
        acknowledged = workload.acknowledged()
    finally:
        not_running = [
            f"{place}:{name}"
            for place, site in places_of(a, b)
            for name in _processes(site)
            if not site.is_running(name)
        ]
        _stop_all(workers, link, (a, b))
        for place, site_disks in disks.items():  # after the stop: each backing tree goes back for the audit
            disk_counters.update({f"{place}:{node}": c for node, c in site_disks.counters().items()})
            site_disks.unmount()
    extra["notRunningAtEnd"] = not_running
    if disk_counters:
        extra["faultfs"] = disk_counters
    return _conclude(config, recorder, faults, copies, acknowledged, extra, (a.root, b.root, rules), audit)


def places_of(a: Cluster, b: Cluster) -> list[tuple[str, Cluster]]:
    return [("source", a), ("target", b)]


def _processes(site: Cluster) -> list[str]:
    """The site's controller (its nameserver embedded) and brokers, by process name."""
    return [n.id for n in site.layout.controllers] + [b.name for b in site.layout.brokers]


def _stop_all(workers: Workers | None, link: Link | None, sites: tuple[Cluster, ...]) -> None:
    if workers is not None:
        workers.stop()
    if link is not None:
        try:
            link.heal()
        except Exception:  # the proxy may be gone; the clusters still have to stop
            log.exception("could not heal the link")
    for site in sites:
        site.stop()


def _conclude(
    config: ReplicationRunConfig,
    recorder: HistoryRecorder,
    faults: list[dict[str, Any]],
    copies: list[checkers.Copy],
    acknowledged: set[str],
    extra: dict[str, Any],
    dirs: tuple[Path, Path, Path],
    audit: ReplicationAuditFunction | None,
) -> tuple[dict[str, Any], list[str]]:
    from mqmeta.chaos.plot import latency_png

    out = config.output_dir
    history = recorder.events()
    recorder.write(out / "history.tsv")
    latency_png(history, out / "latency.png")
    site_state: dict[str, Any] = {k: extra.pop(k) for k in ("notRunningAtEnd", "faultfs") if k in extra}
    replication = checkers.check_replication(copies, acknowledged)
    replication.update(extra)
    result: dict[str, Any] = {
        "faults": faults,
        "queue": checkers.check_queue(history),
        "order": checkers.check_order(history),
        "replication": replication,
        "latency_buckets": checkers.latency_buckets(history),
        "linearizable": None,
    }
    for name, checked in (
        ("recovery", checkers.check_recovery(history)),
        ("rto", checkers.check_rto(history)),
    ):
        result[name] = checked["results"]
        result[f"{name}Summary"] = {k: v for k, v in checked.items() if k != "results"}
    failures = _failures(result)
    failures += _site_fault_failures(result, faults, site_state)
    result["audit"] = _audit(config, dirs, audit)
    if result["audit"]["passed"] is False:
        failures.append(f"X1 audit failed (see {result['audit']['report']})")
    return result, failures


def _failures(result: dict[str, Any]) -> list[str]:
    queue, order, replication = result["queue"], result["order"], result["replication"]
    failures = []
    if not queue["isValid"]:
        failures.append(
            f"delivered at b: {queue['lostMessageCount']} acknowledged lost, "
            f"{queue.get('unexpectedMessageCount', 0)} unexpected"
        )
    if not order["isOrder"]:
        failures.append(f"per-key order at b broken for key {order.get('wrongShardingKey')}")
    if not replication["isValid"]:
        failures.append(
            f"stored at b: {replication['lostCount']} lost, {replication['duplicatedByOrigin']} duplicated "
            f"by origin, {replication['originOrderViolations']} out of origin order, "
            f"{replication['unexpectedCount']} without origin"
        )
    if queue["enqueueSuccessCount"] == 0:
        failures.append("no send to a succeeded: the run proves nothing")
    never = [r for r in result["rto"] if r["isUnavailableInFaultInterval"] and not r["recovered"]]
    if never:
        failures.append(f"{len(never)} fault interval(s) never recovered")
    return failures


def _site_fault_failures(
    result: dict[str, Any], faults: list[dict[str, Any]], site_state: dict[str, Any]
) -> list[str]:
    """A node a site fault stopped that did not come back, or did not repair its
    corrupted data; a site process not running at the end."""
    failures = []
    not_restarted = sorted({n for f in faults for n in f.get("notRestarted", [])})
    not_running = list(site_state.get("notRunningAtEnd", []))
    unrepaired = sorted({n for f in faults for n, count in f.get("repaired", {}).items() if not count})
    result["notRestarted"], result["unrepaired"] = not_restarted, unrepaired
    if not_restarted or not_running:
        failures.append(f"{', '.join(not_restarted + not_running)} did not start again (see the logs)")
    if unrepaired:
        failures.append(f"{', '.join(unrepaired)} did not repair its corrupted data (see the logs)")
    if "faultfs" in site_state:
        result["faultfs"] = site_state["faultfs"]
    return failures


def _audit(
    config: ReplicationRunConfig, dirs: tuple[Path, Path, Path], audit: ReplicationAuditFunction | None
) -> dict[str, Any]:
    """X1 over (source dir, target dir, rules). Without a hook, `mqmeta audit SRC TARGET
    --rules FILE --report DIR`; an exit 2 there means that command cannot run X1 (yet):
    the audit is reported as not run (passed null), not as passed."""
    report = config.output_dir / "audit"
    if not config.audit:
        return {"passed": None, "report": None, "exit_code": None}
    source, target, rules = dirs
    if audit is not None:
        code = audit(source, target, rules, report)
    else:
        command = ["audit", str(source), str(target), "--rules", str(rules), "--report", str(report)]
        code = subprocess.run(
            [sys.executable, "-m", "mqmeta.cli", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=AUDIT_TIMEOUT_S,
        ).returncode
        if code == AUDIT_NOT_RUN_EXIT:
            return {"passed": None, "report": None, "exit_code": code, "note": "X1 not available"}
    return {"passed": code == 0, "report": str(report / "report.json"), "exit_code": code}
