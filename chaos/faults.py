"""The OpenChaos fault set (docs/chaos.md, Faults), plus all-kill, on controllers and/or brokers.

minor = floor(n/2) nodes, major = a majority, random = one node, fixed = the first node,
leader = the controller leader (controllers), the broker set's master (brokers), or both
(all). Each fault has inject() and heal(); the runner loops wait -> inject -> wait -> heal.

- kill: kill -9, heal restarts the process; all-kill kills every process (nameserver
  included) and restarts all of them;
- suspend: SIGSTOP, heal SIGCONT;
- partition: every proxy between the sides disabled (see net.py); majorities-ring is
  Jepsen's (each node sees a majority, no two the same one; TCP links are two-way, so a
  link either side refuses is cut); bridge: two halves that only one node joins;
- delay: latency 100 ms +- 50 ms on both streams of every link of the target nodes;
- loss: Toxiproxy has no packet loss; each new connection of the target nodes' links is
  black-holed with probability 0.3 and closed after 500 ms (a timeout toxic with
  toxicity 0.3), which is what a lossy link looks like to TCP peers.
- power-loss-node / power-loss-all: every node's data dir is on its own fault filesystem
  mount (chaos/disks.py); one random node of the target (or every process) is killed -9,
  its mount loses power (every write not fsynced is gone, a torn tail kept), and heal
  restarts it and waits until it serves again (the time is the record's recover_ms);
- slow-disk: every fsync on the broker set's master's mount waits SLOW_FSYNC_MS;
- fsync-eio: the master's next fsyncs fail with EIO (the broker fences itself, asks for
  its in-sync successor and exits); heal restarts it if it exited;
- disk-full: the master's mount refuses writes, creates and mkdirs with ENOSPC; heal frees it;
- slow-replica: one slave's fetches answered SLOW_REPLICA_MS late (a latency toxic on the
  answers of its link to the master: apache/rocketmq #9897); the master must shrink it out of
  the SyncStateSet and acknowledge without it; heal removes the toxic;
- clock-jump: the controller leader's wall clock steps +CLOCK_JUMP_MS, or -CLOCK_JUMP_MS
  every other round (chaos/clocks.py); heal steps it back;
- corrupt-replica: one slave of the broker set (brokers) and/or one follower controller
  (controllers) is killed and a byte of its data flipped where a checksum guards it: the
  slave's commit log below the confirm offset, the follower's Raft journal (a record
  with valid ones after it) or else its snapshot; heal restarts it and waits until it
  serves, then reads the node's repair counter (details["repaired"]). It must have found
  the damage, discarded or cut it and re-fetched from the others.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqmeta.chaos.net import NAMESRV, ProxiedNetwork
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.ready import wait_brokers_ready, wait_ready
from mqmeta.cluster.supervisor import ChildExited
from mqmeta.cluster.wait import WaitTimeout

from mqmeta.errors import InvalidArgument, MqmetaError

if TYPE_CHECKING:
    from mqmeta.chaos.clocks import NodeClocks
    from mqmeta.chaos.disks import NodeDisks

FAULT_NAMES = (
    "noop",
    "minor-kill",
    "major-kill",
    "random-kill",
    "fixed-kill",
    "leader-kill",
    "random-partition",
    "fixed-partition",
    "leader-partition",
    "partition-majorities-ring",
    "bridge",
    "random-delay",
    "random-loss",
    "minor-suspend",
    "major-suspend",
    "random-suspend",
    "leader-suspend",
    "fixed-suspend",
    "all-kill",
    "power-loss-node",
    "power-loss-all",
    "slow-disk",
    "fsync-eio",
    "corrupt-replica",
    "disk-full",
    "slow-replica",
    "clock-jump",
)
TARGETS = ("controllers", "brokers", "all")
DELAY_MS, DELAY_JITTER_MS = 100, 50
LOSS_TOXICITY, LOSS_TIMEOUT_MS = 0.3, 500
LEADER_WAIT_S = 10.0
RESTART_READY_S = 60.0  # a node restarted after a power loss serves again within this
# Above the default lease (1200 ms): a master whose disk takes this long cannot renew in time
SLOW_FSYNC_MS = 2000
EIO_FSYNCS = 3
SLOW_REPLICA_MS = 60_000
CLOCK_JUMP_MS = 30_000


@dataclass
class FaultContext:
    cluster: Cluster
    network: ProxiedNetwork
    target: str
    rng: random.Random
    broker_set: str = "broker-a"
    disks: NodeDisks | None = None  # the disk faults' mounts, one per node
    clocks: NodeClocks | None = None  # clock-jump: each controller's wall clock offset
    rounds: int = 0  # faults injected so far (clock-jump alternates its direction)

    @property
    def nodes(self) -> list[str]:
        controllers = [n.id for n in self.cluster.layout.controllers]
        brokers = [b.name for b in self.cluster.layout.brokers]
        return {"controllers": controllers, "brokers": brokers, "all": controllers + brokers}[self.target]

    def leaders(self) -> list[str]:
        leaders = []
        if self.target in ("controllers", "all"):
            leaders.append(self.cluster.leader_id(timeout_s=LEADER_WAIT_S))
        if self.target in ("brokers", "all"):
            leaders.append(self.cluster.master_of(self.broker_set, timeout_s=LEADER_WAIT_S))
        return leaders

    def is_controller(self, node: str) -> bool:
        return any(n.id == node for n in self.cluster.layout.controllers)


@dataclass
class Fault:
    name: str
    context: FaultContext
    affected: list[str] = field(default_factory=list)
    cut: list[tuple[str, str]] = field(default_factory=list)  # the node pairs a partition cut
    _heal: Callable[[], None] | None = None
    details: dict[str, Any] = field(default_factory=dict)  # more for the fault's record in result.json

    def inject(self) -> str:
        """Applies the fault; returns what it did (for the history's extraInfo)."""
        try:
            return _ACTIONS[self.name](self)
        finally:
            self.context.rounds += 1

    def heal(self) -> None:
        if self._heal is not None:
            heal, self._heal = self._heal, None
            heal()


def _choose(fault: Fault) -> list[str]:
    nodes, rng, context = fault.context.nodes, fault.context.rng, fault.context
    prefix = fault.name.split("-", 1)[0]
    if prefix == "minor":
        return rng.sample(nodes, len(nodes) // 2)
    if prefix == "major":
        return rng.sample(nodes, len(nodes) // 2 + 1)
    if prefix == "fixed":
        return nodes[:1] if fault.name.endswith(("kill", "suspend")) else nodes[: len(nodes) // 2]
    if prefix == "leader":
        return context.leaders()
    if fault.name.endswith("partition"):  # random-partition: a random minority
        return rng.sample(nodes, len(nodes) // 2)
    return rng.sample(nodes, 1)


def _kill(fault: Fault) -> str:
    chosen = _choose(fault)
    cluster = fault.context.cluster
    for node in chosen:
        if cluster.is_running(node):
            cluster.kill(node)
    fault.affected = chosen
    fault._heal = lambda: _restart(fault.context, chosen)
    return f"killed {','.join(chosen)}"


def _restart(context: FaultContext, nodes: list[str]) -> None:
    cluster = context.cluster
    for node in nodes:
        if cluster.is_running(node):
            continue
        if node == NAMESRV:
            cluster.start_namesrv()
        elif context.is_controller(node):
            cluster.start_node(node)
        else:
            cluster.start_broker(node)


def _all_kill(fault: Fault) -> str:
    cluster = fault.context.cluster
    everything = [n.id for n in cluster.layout.controllers]
    if not cluster.layout.embedded:
        everything.append(NAMESRV)
    everything += [b.name for b in cluster.layout.brokers]
    for node in everything:
        if cluster.is_running(node):
            cluster.kill(node)
    fault.affected = everything
    fault._heal = lambda: _restart(fault.context, everything)
    return "killed every process"


def _suspend(fault: Fault) -> str:
    chosen = _choose(fault)
    for node in chosen:
        fault.context.cluster.pause(node)
    fault.affected = chosen

    def heal() -> None:
        for node in chosen:
            fault.context.cluster.resume(node)

    fault._heal = heal
    return f"suspended {','.join(chosen)}"


def _partition(fault: Fault) -> str:
    chosen = _choose(fault)
    rest = [n for n in fault.context.nodes if n not in chosen]
    fault.cut = [(a, b) for a in chosen for b in rest]
    fault.context.network.cut(fault.cut)
    fault.affected = chosen
    fault._heal = fault.context.network.heal
    return f"isolated {','.join(chosen)} from {','.join(rest)}"


def majorities_ring(nodes: list[str], rng: random.Random) -> set[frozenset[str]]:
    """Jepsen's majorities ring, made symmetric (a TCP link is either up or cut): nodes in a
    shuffled ring see the neighbours within distance d on both sides, with 2d + 1 a majority,
    so every node sees a majority and no two the same one. Under 4 nodes no symmetric ring
    exists: then, as in Jepsen's one-way version once made two-way, every link is cut."""
    ring = list(nodes)
    rng.shuffle(ring)
    n = len(ring)
    d = (n // 2 + 1) // 2
    if 2 * d + 1 >= n:
        return {frozenset((a, b)) for a in ring for b in ring if a != b}
    position = {node: i for i, node in enumerate(ring)}

    def ring_distance(a: str, b: str) -> int:
        k = abs(position[a] - position[b])
        return min(k, n - k)

    return {frozenset((a, b)) for a in ring for b in ring if a != b and ring_distance(a, b) > d}


def bridge(nodes: list[str], rng: random.Random) -> set[frozenset[str]]:
    """Two halves that cannot talk to each other; one node in between talks to both."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    middle = len(shuffled) // 2
    left, right = shuffled[:middle], shuffled[middle + 1 :]
    return {frozenset((a, b)) for a in left for b in right}


def _ring_or_bridge(fault: Fault) -> str:
    build = majorities_ring if fault.name == "partition-majorities-ring" else bridge
    pairs = build(fault.context.nodes, fault.context.rng)
    fault.cut = [_as_pair(p) for p in pairs]
    fault.context.network.cut(fault.cut)
    fault.affected = sorted({n for p in pairs for n in p})
    fault._heal = fault.context.network.heal
    return "cut " + ",".join("-".join(sorted(p)) for p in sorted(pairs, key=sorted))


def _delay(fault: Fault) -> str:
    nodes = fault.context.nodes
    fault.context.network.add_toxic(
        fault.context.network.touching(nodes), "latency", {"latency": DELAY_MS, "jitter": DELAY_JITTER_MS}
    )
    fault.affected = nodes
    fault._heal = fault.context.network.heal
    return f"latency {DELAY_MS}+-{DELAY_JITTER_MS} ms on {','.join(nodes)}"


def _loss(fault: Fault) -> str:
    nodes = fault.context.nodes
    fault.context.network.add_toxic(
        fault.context.network.touching(nodes), "timeout", {"timeout": LOSS_TIMEOUT_MS}, toxicity=LOSS_TOXICITY
    )
    fault.affected = nodes
    fault._heal = fault.context.network.heal
    return f"black-holed {LOSS_TOXICITY:.0%} of connections on {','.join(nodes)}"


def _as_pair(pair: frozenset[str]) -> tuple[str, str]:
    a, b = sorted(pair)
    return a, b


def _disks(fault: Fault) -> NodeDisks:
    if fault.context.disks is None:
        raise MqmetaError(f"{fault.name} needs the nodes' data dirs on the fault filesystem")
    return fault.context.disks


def _power_loss(fault: Fault) -> str:
    disks, cluster = _disks(fault), fault.context.cluster
    if fault.name == "power-loss-all":
        chosen = [n.id for n in cluster.layout.controllers]
        if not cluster.layout.embedded:
            chosen.append(NAMESRV)
        chosen += [b.name for b in cluster.layout.brokers]
    else:
        chosen = fault.context.rng.sample(fault.context.nodes, 1)
    for node in chosen:
        if cluster.is_running(node):
            cluster.kill(node)
    lost = {}
    for node in chosen:
        if node in disks.mounts:  # the nameserver keeps no data: a kill is all it loses
            seed = fault.context.rng.randrange(2**31)
            counters = disks.mounts[node].lose_power(writeback_fraction=0.5, seed=seed)["counters"]
            lost[node] = counters["pages_lost"]
    fault.affected = chosen
    fault.details["pagesLost"] = lost
    fault._heal = lambda: _restart_and_wait(fault, chosen)
    return f"power lost on {','.join(chosen)} ({sum(lost.values())} unsynced pages dropped)"


def _restart_and_wait(fault: Fault, nodes: list[str]) -> None:
    """Restarts the nodes and waits until they serve again: every controller knows a
    leader, the nameserver serves, every broker has a role and its set a writable master.
    A node that does not is named in details["notRestarted"] (the run fails on it)."""
    context, cluster = fault.context, fault.context.cluster
    started = time.monotonic()
    _restart(context, nodes)
    controllers = [cluster.node(n).grpc for n in nodes if context.is_controller(n)]
    namesrv = cluster.layout.namesrv if NAMESRV in nodes else []
    # a restarted slave is ready once its set has a writable master again: wait on the whole set
    brokers = (
        cluster.layout.brokers if any(n != NAMESRV and not context.is_controller(n) for n in nodes) else []
    )

    def check_running() -> None:
        cluster.supervisor.check_running(nodes)

    try:
        if controllers or namesrv:
            wait_ready(",".join(controllers) or cluster.addresses, namesrv, RESTART_READY_S, check_running)
        if brokers:
            wait_brokers_ready(brokers, RESTART_READY_S, check_running)
    except (WaitTimeout, MqmetaError, ChildExited) as error:
        fault.details["notRestarted"] = [n for n in nodes if not cluster.is_running(n)] or nodes
        fault.details["restartError"] = str(error)
    fault.details["recover_ms"] = int((time.monotonic() - started) * 1000)


def _master_disk(fault: Fault) -> tuple[str, Any]:
    disks = _disks(fault)
    master = fault.context.cluster.master_of(fault.context.broker_set, timeout_s=LEADER_WAIT_S)
    return master, disks.mounts[master]


def _slow_disk(fault: Fault) -> str:
    master, mount = _master_disk(fault)
    mount.delay(fsync_ms=SLOW_FSYNC_MS)
    fault.affected = [master]

    def heal() -> None:
        mount.delay(fsync_ms=0)

    fault._heal = heal
    return f"every fsync on {master}'s disk waits {SLOW_FSYNC_MS} ms"


def _fsync_eio(fault: Fault) -> str:
    master, mount = _master_disk(fault)
    mount.fail_next_fsync(count=EIO_FSYNCS)
    fault.affected = [master]

    def heal() -> None:  # the disk is replaced: failures still pending are dropped
        mount.fail_next_fsync(count=0)
        if not fault.context.cluster.is_running(master):
            _restart_and_wait(fault, [master])

    fault._heal = heal
    return f"the next {EIO_FSYNCS} fsyncs on {master}'s disk fail with EIO"


# controller/journal.py: an 8-byte magic, then records [length u32][crc u32][index][term][command]
JOURNAL_RECORD_HEADER_BYTES = 8 + 24  # the magic, then the first record's header
SEGMENT_BYTES_TO_FLIP_MIN = 4096  # a slave's log this short holds no record to flip below confirm


def _corrupt_replica(fault: Fault) -> str:
    context, cluster = fault.context, fault.context.cluster
    chosen: list[str] = []
    if context.target in ("brokers", "all"):
        master = cluster.master_of(context.broker_set, timeout_s=LEADER_WAIT_S)
        slaves = [
            b.name
            for b in cluster.layout.brokers
            if b.name != master and b.name.startswith(context.broker_set)
        ]
        chosen.append(context.rng.choice(slaves))
    if context.target in ("controllers", "all"):
        leader = cluster.leader_id(timeout_s=LEADER_WAIT_S)
        chosen.append(context.rng.choice([n.id for n in cluster.layout.controllers if n.id != leader]))
    flipped = {}
    for node in chosen:
        cluster.kill(node)
        where = _flip_guarded_byte(context, node)
        if where:
            flipped[node] = where
    fault.affected = chosen
    fault.details["flipped"] = flipped

    def heal() -> None:
        _restart_and_wait(fault, chosen)
        fault.details["repaired"] = {node: _repairs(context, node) for node in flipped}

    fault._heal = heal
    return "; ".join(f"{node}: flipped a byte of {where}" for node, where in flipped.items())


def _flip_guarded_byte(context: FaultContext, node: str) -> str:
    """Flips one byte that a checksum guards, in a stopped node's data; says where ("":
    nothing to flip)."""
    cluster = context.cluster
    if context.is_controller(node):
        data_dir = cluster.root / cluster.node(node).data_dir
        journal, snapshot = data_dir / "raft.journal", data_dir / "raft.snapshot"
        data = journal.read_bytes() if journal.exists() else b""
        if len(data) >= JOURNAL_RECORD_HEADER_BYTES:
            first_end = JOURNAL_RECORD_HEADER_BYTES + int.from_bytes(data[8:12], "little")
            # a record follows the first (its length is not zero; the zeros written ahead of
            # the next record are): then the flip is not a torn tail
            if any(data[first_end : first_end + 4]):
                _flip(journal, 12)  # the first record's checksum
                return f"{journal.name} (its first record's checksum)"
        _flip(snapshot, snapshot.stat().st_size // 2)
        return f"{snapshot.name} (its middle)"
    store = cluster.root / cluster.broker(node).data_dir / "store"
    segment = sorted(store.rglob("*.log"))[0]
    written = len(segment.read_bytes().rstrip(b"\0"))  # a last segment ends in zeros written ahead
    if written < SEGMENT_BYTES_TO_FLIP_MIN:  # nothing written yet (a metadata run)
        return ""
    position = context.rng.randrange(written // 4, written // 2)
    _flip(segment, position)
    return f"{segment.name} at byte {position} (below the confirm offset)"


def _flip(path: Any, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0xFF]))


def _repairs(context: FaultContext, node: str) -> float:
    """The restarted node's repair counter (0.0 when its metrics cannot be read)."""
    import urllib.request

    cluster = context.cluster
    if context.is_controller(node):
        address, name = cluster.node(node).metrics, "mqmeta_controller_raft_repairs_total"
    else:
        address, name = cluster.broker(node).metrics, "mqmeta_broker_corruption_repairs_total"
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else 0.0


def _disk_full(fault: Fault) -> str:
    master, mount = _master_disk(fault)
    mount.disk_full(True)
    fault.affected = [master]

    def heal() -> None:
        mount.disk_full(False)

    fault._heal = heal
    return f"{master}'s disk is full (ENOSPC)"


def _slow_replica(fault: Fault) -> str:
    context = fault.context
    master = context.cluster.master_of(context.broker_set, timeout_s=LEADER_WAIT_S)
    slaves = [b.name for b in context.cluster.layout.brokers if b.name != master]
    slave = context.rng.choice(slaves)
    links = [link for link in context.network.links if link.source == slave and link.destination == master]
    context.network.add_toxic(links, "latency", {"latency": SLOW_REPLICA_MS}, streams=("downstream",))
    fault.affected = [slave]
    fault._heal = context.network.heal
    return f"{slave}'s fetches from {master} answered {SLOW_REPLICA_MS // 1000} s late"


def _clock_jump(fault: Fault) -> str:
    context = fault.context
    if context.clocks is None:
        raise MqmetaError("clock-jump needs the controllers started with a clock offset file")
    leader = context.cluster.leader_id(timeout_s=LEADER_WAIT_S)
    step_ms = CLOCK_JUMP_MS if context.rounds % 2 == 0 else -CLOCK_JUMP_MS
    clocks = context.clocks
    clocks.step(leader, step_ms)
    fault.affected = [leader]
    fault.details["clockStepMs"] = step_ms

    def heal() -> None:
        clocks.step(leader, 0)

    fault._heal = heal
    return f"{leader}'s wall clock stepped {step_ms:+d} ms"


def _noop(fault: Fault) -> str:
    return "noop"


_CHOOSERS = ("minor", "major", "random", "fixed", "leader")
_ACTIONS: dict[str, Callable[[Fault], str]] = {
    "noop": _noop,
    "all-kill": _all_kill,
    "bridge": _ring_or_bridge,
    "partition-majorities-ring": _ring_or_bridge,
    "random-delay": _delay,
    "random-loss": _loss,
    "power-loss-node": _power_loss,
    "power-loss-all": _power_loss,
    "slow-disk": _slow_disk,
    "fsync-eio": _fsync_eio,
    "corrupt-replica": _corrupt_replica,
    "disk-full": _disk_full,
    "slow-replica": _slow_replica,
    "clock-jump": _clock_jump,
    **{f"{who}-kill": _kill for who in _CHOOSERS},
    **{f"{who}-suspend": _suspend for who in _CHOOSERS},
    **{f"{who}-partition": _partition for who in ("random", "fixed", "leader")},
}
assert set(_ACTIONS) == set(FAULT_NAMES)


def make_fault(name: str, context: FaultContext) -> Fault:
    if name not in FAULT_NAMES:
        raise InvalidArgument(f"unknown fault {name!r}; choose one of {', '.join(FAULT_NAMES)}")
    return Fault(name, context)
