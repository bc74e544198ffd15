"""A seeded deterministic simulation of one broker set, driven through the REAL pure core.

Three brokers, each a real broker_agent.core.BrokerCore with an in-memory log
(checksummed records and (epoch, start) entries, with MessageStore's rules); a
controller deciding elections and SyncStateSet changes with the real
controller.state_machine.apply and controller/operations.py's liveness rules; producers; and
a network that delays, reorders, drops and partitions messages (dropped, or held like
TCP and delivered at the heal; the watch stream is a connection of its own). The
simulated shell does with the core's effects what broker_agent/agent.py and
ha_fetch.py do. Faults, per seed at an intensity of its own: crashes (a write in
flight is torn, an epoch entry may lead its records; recovery cuts the torn tail and
drops entries past the end), restarts with a fresh core, partitions of one link or of
every link of one broker, and each clock running at its own rate within what the lease
margin absorbs (broker_agent/ha.py), and group commit with power loss: a master's
append is only written, made durable later by a sync (agent.wait_acknowledged) that the
core hears of as Synced, and a crash may be a power loss that takes every byte the
master wrote but did not sync yet (its slaves are served those bytes before the sync).
Graceful departures too: the master hands off
(HandoffStart, then HandoffTick until the core names its successor, then an election
with the handoff trigger, whose reply may be lost: HandoffFailed), and a slave starts
leaving the SyncStateSet; test_the_seeds_hand_off checks that handoffs did elect.

Properties checked after every step, and at the end after healing everything and
letting the set converge:
- B1: every member of the controller's SyncStateSet holds the master's bytes below the
  master's confirm offset (that is what the confirm offset means); a handshake's
  answer leaves the slave only bytes the master holds too (the consistent point); a
  slave answered in its session holds a prefix of its master's log; at the end every
  replica equals the master;
- B2, B3, B4: records tile each log without gaps or overlaps, every checksum holds,
  and the epoch entries agree with the records' epochs (checked every 500 steps);
- no acknowledged write is lost: each new master holds every acknowledged record at its
  offset when it takes over, and so does every replica at the end; a master never
  confirms bytes a power loss could take (its confirm offset is at most its durable
  offset);
- never two masters at one instant: at most one broker may write (MASTER with a valid
  lease) at any moment of true time, checked at every step, write and acknowledgement,
  and that broker is the controller's master of its epoch.

The same simulation acknowledging at 2 of 3 copies (`--no-all-ack --in-sync-replicas 2`)
checks instead, at each acknowledgement, that the write is durable on two members of the
SyncStateSet the controller holds; a new master need not hold every acknowledged write
there (the controller elects by the offsets brokers last reported: docs/concepts.md).

A failure names the seed, the step, the last events and the test id that replays it.
Planted bugs put back through a fixture (the confirm offset without the pending
SyncStateSet union, RocketMQ #5663; truncation above the consistent point; no lease,
RocketMQ #4800; a confirm offset counting the master's unsynced bytes; a master that
re-adopts its epoch after a power loss trusting slaves that hold bytes it lost; at 2 of 3
copies, copies counted over the union of the set and a proposed one, or in the set alone)
must each be caught within PLANTED_BUG_SEEDS_MAX seeds.
MQMETA_SIM_SEEDS and MQMETA_SIM_STEPS run more (e.g. 1000 seeds before a release).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
import random
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from mqmeta.broker_agent import core as core_module
from mqmeta.broker_agent.core import (
    AckPolicy,
    AnswerFetch,
    Appended,
    AppendReplicated,
    BeginEpoch,
    BrokerCore,
    Departure,
    Effect,
    ElectSuccessor,
    Event,
    FetchAnswered,
    FetchStillWaiting,
    HandoffFailed,
    HandoffStart,
    HandoffTick,
    HeartbeatAnswered,
    Leave,
    LogView,
    MasterAnswered,
    ProposalOutcome,
    ProposeSyncStateSet,
    Refuse,
    Registered,
    ReplicaInfo,
    Replicated,
    RequestRefresh,
    SlaveFetch,
    StartFetching,
    StopFetching,
    Synced,
    SyncStateSetChanged,
    SyncStateSetFailed,
    Tick,
    Truncate,
    WriteOutcome,
)
from mqmeta.broker_agent.ha import Lease, Role
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.state_machine import ControllerState, apply, replica_view

from mqmeta.errors import FencedEpoch, MqmetaError, NotMaster
from mqmeta.formats.epochs import EpochEntry, epoch_covering

pytestmark = pytest.mark.timeout(120)

Json = dict[str, Any]
Node = int | str  # a broker slot, or CONTROLLER, WATCH, CLIENT

SIM_SEEDS = range(int(os.environ.get("MQMETA_SIM_SEEDS", "40")))
SIM_STEPS = int(os.environ.get("MQMETA_SIM_STEPS", "3000"))
SETTLE_STEPS_MAX = 4000
PLANTED_BUG_SEEDS_MAX = 30  # each planted bug must be caught within this many seeds
# Seeds that left a slave diverged inside one epoch while a restarted master re-adopted it
# (B1 at a later handshake): a slave away for the whole re-adopted run kept bytes a power
# loss took from the master, and a later epoch's master could not tell.
READOPTION_DIVERGENCE_SEEDS = (271, 279, 298)
# --no-all-ack --in-sync-replicas 2
AT_2_OF_3 = AckPolicy(all_ack_in_sync_state_set=False, in_sync_replicas=2)

# Time: the defaults scaled down 10x, their relations kept -------------------------------
HEARTBEAT_INTERVAL_MS = 100
DEAD_AFTER_MS = 300
LEASE_MS = 200
LEASE_MARGIN_MS = 50
CLOCK_SKEW = 0.1  # each clock runs at a rate in [1 - skew, 1 + skew] of true time
SCAN_INTERVAL_MS = 50
CALL_TIMEOUT_MS = 100
TICK_INTERVAL_MS = 20
NOT_CATCHUP_MS = 150
PENDING_GRACE_MS = 700
FETCH_WAIT_MS = 20
FETCH_TIMEOUT_MS = 200
RETRY_PAUSE_MS = 10
SEND_TIMEOUT_MS = 300
RESTART_AFTER_MS = 100
STEP_MS_MAX = 8  # true time between steps: uniform in [0.5, STEP_MS_MAX]

# The network and the load ------------------------------------------------------------------
DELAY_MS_MAX = 20
SLOW_DELAY_MS_MAX = 80  # 5% of messages
DROP_RATE = 0.02  # of messages between the brokers and the controller
HOLD_MS_MAX = 400  # a partition longer than this resets the connection: held messages drop
CUT_MS_MAX = 1000
ISOLATE_MS_MAX = 1500
FETCH_RECORDS_MAX = 32
LOAD_PHASE_MS_MAX = 300  # bursts of writes and quiet gaps (the set grows in a gap)
WRITE_RATE = 0.3  # per step during a burst, 1 to 3 records each
SYNC_RATE = 0.3  # per step, a master with unsynced bytes syncs them (group commit)

# Faults per step, before the seed's intensity (0.5x to 4x)
CRASH_RATE = 0.0015
RESTART_RATE = 0.02
CUT_RATE = 0.0015
ISOLATE_RATE = 0.0005
HANDOFF_RATE = 0.002  # the master hands off (SIGTERM, admin handoff)
LEAVE_RATE = 0.0005  # a slave starts leaving (a fresh core after a restart stays)
HANDOFF_DRAIN_MS = 300
LEAVE_EXIT_MS = 200  # agent.depart: a leaving broker stops after LEAVE_TIMEOUT_MS (2 s), in the set or not
INTENSITIES = (0.5, 1.0, 2.0, 4.0)

# The lease argument (broker_agent/ha.py) with drifting clocks: an isolated master's
# lease, counted on its clock at the slowest rate, ends before the controller, counting
# on its clock at the fastest rate, may declare it dead.
assert LEASE_MS * (1 + CLOCK_SKEW) / (1 - CLOCK_SKEW) <= LEASE_MS + LEASE_MARGIN_MS < DEAD_AFTER_MS
assert DEAD_AFTER_MS >= 3 * HEARTBEAT_INTERVAL_MS
# A handoff's election reaches the controller within the grace after it failed, or never.
# A SyncStateSet proposal has no such bound: LATE_RATE of them commit up to LATE_MS_MAX
# after the master gave up waiting (a Raft entry committed by a later leader).
assert PENDING_GRACE_MS * (1 - CLOCK_SKEW) > HOLD_MS_MAX + SLOW_DELAY_MS_MAX
LATE_RATE = 0.05  # of AlterSyncStateSet calls: applied late, the answer lost
LATE_MS_MAX = 3 * PENDING_GRACE_MS
assert FETCH_TIMEOUT_MS > FETCH_WAIT_MS + 2 * SLOW_DELAY_MS_MAX

CLUSTER, NAME = "SIM", "b"
SLOTS = (0, 1, 2)
CONTROLLER = "ctl"
WATCH = "watch"  # the watch stream: its own connection (maybe to another controller node)
CLIENT = "client"  # producers; their links are never cut


class Violation(AssertionError):
    """A property broke; the message names the seed and the step."""


# Records and the log --------------------------------------------------------------------------
HEADER = struct.Struct("<IIQI")  # size, epoch, write id, crc32 of (epoch, write id, payload)


def encode_record(epoch: int, write_id: int, payload: bytes) -> bytes:
    checked = struct.pack("<IQ", epoch, write_id) + payload
    return HEADER.pack(HEADER.size + len(payload), epoch, write_id, zlib.crc32(checked)) + payload


@dataclass(frozen=True)
class Record:
    offset: int
    size: int
    epoch: int


def parse_records(data: bytes | bytearray, base: int) -> tuple[list[Record], int]:
    """The valid records from the start of `data`, and where that valid run ends."""
    records, position = [], 0
    while position + HEADER.size <= len(data):
        size, epoch, write_id, crc = HEADER.unpack_from(data, position)
        if size < HEADER.size or position + size > len(data) or epoch == 0:
            break
        checked = struct.pack("<IQ", epoch, write_id) + data[position + HEADER.size : position + size]
        if zlib.crc32(checked) != crc:
            break
        records.append(Record(base + position, size, epoch))
        position += size
    return records, base + position


class StoreError(MqmetaError):
    """What the real store raises on a bad append, truncation or read."""


@dataclass
class SimLog:
    """One replica's log in memory, with MessageStore's rules: bytes, record starts and
    (epoch, start) entries; an append is durable once it returns."""

    data: bytearray = field(default_factory=bytearray)
    starts: list[int] = field(default_factory=list)
    epochs: list[EpochEntry] = field(default_factory=list)
    durable: int = 0  # what a power loss leaves (CommitLog.durable_offset)

    @property
    def end(self) -> int:
        return len(self.data)

    def view(self) -> LogView:
        return LogView(self.end, tuple(self.epochs), 0, self.durable)

    def sync(self) -> None:
        """CommitLog.sync: one fdatasync makes everything written so far durable."""
        self.durable = self.end

    def lose_unsynced(self) -> None:
        """A power loss: the page cache, and with it every byte past `durable`, is gone."""
        del self.data[self.durable :]
        del self.starts[bisect.bisect_left(self.starts, self.durable) :]

    def is_boundary(self, offset: int) -> bool:
        i = bisect.bisect_left(self.starts, offset)
        return offset == self.end or (i < len(self.starts) and self.starts[i] == offset)

    def begin_epoch(self, epoch: int) -> None:
        """EpochFile.append: a newer epoch; an entry at the same start replaces the last."""
        if self.epochs and epoch <= self.epochs[-1][0]:
            raise StoreError(f"epoch {epoch} is not newer than {self.epochs[-1][0]}")
        self.sync()  # MessageStore.begin_epoch syncs the log before the epoch file
        if self.epochs and self.epochs[-1][1] == self.end:
            self.epochs.pop()
        self.epochs.append((epoch, self.end))

    def put(self, epoch: int, records: list[bytes]) -> list[tuple[int, bytes]]:
        if not self.epochs or self.epochs[-1][0] != epoch:
            raise StoreError(f"epoch {epoch} has not begun here")
        placed = []
        for record in records:
            placed.append((self.end, record))
            self.starts.append(self.end)
            self.data += record
        return placed

    def append_replicated(self, offset: int, data: bytes) -> None:
        """Whole valid records at the end, epochs never going back; new entries first."""
        if offset != self.end:
            raise StoreError(f"replicated data starts at {offset} but this log ends at {self.end}")
        records, valid_end = parse_records(data, offset)
        if valid_end != offset + len(data):
            raise StoreError(f"replicated data at {offset} holds a bad record")
        last = self.epochs[-1][0] if self.epochs else 0
        for record in records:
            if record.epoch < last:
                raise StoreError(f"a record of epoch {record.epoch} after epoch {last}: truncate first")
            if record.epoch > last:
                self.epochs.append((record.epoch, record.offset))
                last = record.epoch
        self.starts += [r.offset for r in records]
        self.data += data
        self.durable = self.end  # a slave's append is synced before it acknowledges

    def truncate(self, offset: int) -> None:
        if not self.is_boundary(offset):
            raise StoreError(f"offset {offset} is not a record start in [0, {self.end}]")
        self.epochs = [e for e in self.epochs if e[1] < offset]
        del self.starts[bisect.bisect_left(self.starts, offset) :]
        del self.data[offset:]
        self.durable = min(self.durable, offset)

    def read(self, offset: int, records_max: int) -> bytes:
        """Up to `records_max` records from `offset`, synced or not (ha_fetch.serve_fetch):
        a power loss may take from the master bytes a slave holds (core._untrusted_cut)."""
        if not self.is_boundary(offset):
            raise StoreError(f"offset {offset} is not a record start")
        i = bisect.bisect_left(self.starts, offset) + records_max
        return bytes(self.data[offset : self.starts[i] if i < len(self.starts) else self.end])

    def recover(self) -> None:
        """Opening after a crash: the torn tail goes, and the entries past the end."""
        records, valid_end = parse_records(self.data, 0)
        del self.data[valid_end:]
        self.starts = [r.offset for r in records]
        self.epochs = [e for e in self.epochs if e[1] <= valid_end]
        self.durable = self.end  # CommitLog syncs the last segment when it opens

    def check(self, where: str) -> None:
        """B2 (records tile the log), B3 (checksums), B4 (entries agree with records)."""
        records, valid_end = parse_records(self.data, 0)
        if valid_end != self.end or [r.offset for r in records] != self.starts:
            raise Violation(f"B2/B3: {where}: the valid records end at {valid_end} of {self.end}")
        for (epoch, start), (next_epoch, next_start) in itertools.pairwise(self.epochs):
            if next_epoch <= epoch or next_start < start:
                raise Violation(f"B4: {where}: epoch entries out of order: {self.epochs}")
        if any(not self.is_boundary(start) for _, start in self.epochs):
            raise Violation(f"B4: {where}: an epoch entry does not start at a record: {self.epochs}")
        for record in records:
            if epoch_covering(self.epochs, record.offset) != record.epoch:
                raise Violation(f"B4: {where}: the record at {record.offset} has epoch {record.epoch}")


# The network -------------------------------------------------------------------------------
@dataclass(order=True)
class Message:
    deliver_ms: float
    seq: int
    src: Node = field(compare=False)
    dst: Node = field(compare=False)
    kind: str = field(compare=False)
    body: Json = field(compare=False)


@dataclass
class Cut:
    until_ms: float
    hold: bool  # True: messages wait for the heal (TCP); False: they are lost
    held: list[Message] = field(default_factory=list)


class Network:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.queue: list[Message] = []
        self.cuts: dict[frozenset[Node], Cut] = {}
        self.seq = itertools.count()
        self.drop_rate = DROP_RATE

    def send(self, now: float, src: Node, dst: Node, kind: str, body: Json) -> None:
        slow = self.rng.random() < 0.05
        delay = self.rng.uniform(1, SLOW_DELAY_MS_MAX if slow else DELAY_MS_MAX)
        message = Message(now + delay, next(self.seq), src, dst, kind, body)
        cut = self.cuts.get(frozenset((src, dst)))
        if cut is not None:
            if cut.hold:
                cut.held.append(message)
        elif CLIENT in (src, dst) or self.rng.random() >= self.drop_rate:
            heapq.heappush(self.queue, message)

    def cut(self, now: float, a: Node, b: Node, duration_ms: float, hold: bool) -> None:
        self.cuts.setdefault(frozenset((a, b)), Cut(now + duration_ms, hold and duration_ms <= HOLD_MS_MAX))

    def heal(self, now: float, everything: bool = False) -> None:
        for key, cut in list(self.cuts.items()):
            if everything or now >= cut.until_ms:
                del self.cuts[key]
                for message in cut.held:
                    message.deliver_ms = now + self.rng.uniform(1, DELAY_MS_MAX)
                    heapq.heappush(self.queue, message)

    def due(self, now: float) -> Iterator[Message]:
        while self.queue and self.queue[0].deliver_ms <= now:
            message = heapq.heappop(self.queue)
            cut = self.cuts.get(frozenset((message.src, message.dst)))
            if cut is None:
                yield message
            elif cut.hold:
                cut.held.append(message)  # cut while in flight


# The controller ------------------------------------------------------------------------------
class SimController:
    """The controller leader: the real state machine; liveness in memory, as in
    controller/operations.py (a broker is alive for DEAD_AFTER_MS after its last heartbeat)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.rate = 1 + sim.rng.uniform(-CLOCK_SKEW, CLOCK_SKEW)
        self.state = ControllerState()
        self.index = 0
        self.seen: dict[int, tuple[int, int, int]] = {}  # broker id -> (seen ms, epoch, max offset)
        self.next_scan_ms = 0
        self.late: list[tuple[float, Message]] = []  # proposals that commit late, answers lost
        self.late_rng = random.Random(sim.seed + 1_000_003)  # its own stream: the seeds' other faults stay
        timing = {
            "broker_heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            "broker_dead_after_ms": DEAD_AFTER_MS,
            "lease_ms": LEASE_MS,
            "lease_margin_ms": LEASE_MARGIN_MS,
        }
        configured = self.apply({"type": "update_config", "values": {k: str(v) for k, v in timing.items()}})
        assert configured["ok"], configured

    def now(self) -> int:
        return int(self.sim.t * self.rate)

    def apply(self, command: Json) -> Json:
        self.index += 1
        result, _events, changes = apply(self.state, command_from_json(command), self.index)
        if any(key.startswith("brokerset/") for key in changes):
            self.sim.trace(f"controller {command['type']}: {self.summary()}")
            self.sim.watch_event()
        return result

    def broker_set(self) -> Json | None:
        return self.state.broker_set(CLUSTER, NAME)

    def summary(self) -> str:
        bs = self.broker_set()
        if bs is None:
            return "no broker set"
        return (
            f"master {bs['master_broker_id']} at epoch {bs['master_epoch']}, "
            f"set {bs['sync_state_set']} at epoch {bs['sync_state_set_epoch']}"
        )

    def alive(self) -> Json:
        now = self.now()
        return {
            str(i): {"epoch": epoch, "max_offset": max_offset, "priority": 0}
            for i, (seen, epoch, max_offset) in self.seen.items()
            if now - seen < DEAD_AFTER_MS
        }

    def receive(self, message: Message) -> None:
        body = message.body
        if message.kind == "alter" and self.sim.faults and self.late_rng.random() < LATE_RATE:
            apply_ms = self.sim.t + self.late_rng.uniform(CALL_TIMEOUT_MS, LATE_MS_MAX)
            self.late.append((apply_ms, message))
            self.sim.trace(
                f"controller holds {message.src}'s {body['new_sync_state_set']} until {apply_ms:.0f}"
            )
            return
        handler = {
            "register": self._register,
            "heartbeat": self._heartbeat,
            "replica_info": self._replica_info,
            "elect": self._decide,
            "handoff": self._decide,
            "alter": self._decide,
        }[message.kind]
        reply = handler(message.src, body)
        self.sim.network.send(
            self.sim.t, CONTROLLER, message.src, message.kind + "_reply", dict(reply, call=body["call"])
        )

    def _register(self, slot: Node, body: Json) -> Json:
        command = {
            "type": "register_broker",
            "cluster": CLUSTER,
            "broker_name": NAME,
            "address": f"10.0.0.{slot}:10911",
            "check_code": f"slot-{slot}",
            "broker_id": body["broker_id"],
        }
        if self.sim.new_epoch_on_restart and body["new_process"]:
            command["new_process"] = True  # controller/service.py register_command
        before = self.broker_set()
        epoch_before = before["master_epoch"] if before is not None else 0
        result = self.apply(command)
        after = self.broker_set()
        if after is not None and after["master_epoch"] > epoch_before:
            self.sim.renewals += 1
            self.sim.trace(
                f"controller: master {after['master_broker_id']} restarted, epoch {after['master_epoch']}"
            )
        _, epoch, max_offset = self.seen.get(result["broker_id"], (0, 0, 0))
        self.seen[result["broker_id"]] = (self.now(), epoch, max_offset)
        return {"broker_id": result["broker_id"], "info": result["replica_info"], "lease_ms": LEASE_MS}

    def _heartbeat(self, slot: Node, body: Json) -> Json:
        bs = self.broker_set()
        if bs is None or str(body["broker_id"]) not in bs["replicas"]:
            return {"error": "NOT_FOUND"}
        self.seen[body["broker_id"]] = (self.now(), body["epoch"], body["max_offset"])
        return {
            "master_broker_id": bs["master_broker_id"],
            "master_epoch": bs["master_epoch"],
            "sync_state_set_epoch": bs["sync_state_set_epoch"],
            "lease_ms": LEASE_MS,
        }

    def _replica_info(self, slot: Node, body: Json) -> Json:
        bs = self.broker_set()
        return {"info": replica_view(bs)} if bs else {"error": "NOT_FOUND"}

    def _decide(self, slot: Node, body: Json) -> Json:
        """ElectMaster or AlterSyncStateSet, with the leader's view of who is alive."""
        command = {k: v for k, v in body.items() if k != "call"}
        result = self.apply(dict(command, cluster=CLUSTER, broker_name=NAME, alive=self.alive()))
        return {"info": result["replica_info"]} if result["ok"] else {"error": result["code"]}

    def apply_late(self) -> None:
        """Late proposals commit now; their answers are lost (the caller timed out)."""
        due = [(t, m) for t, m in self.late if t <= self.sim.t or not self.sim.faults]
        self.late = [(t, m) for t, m in self.late if (t, m) not in due]
        for _, message in due:
            result = self._decide(message.src, message.body)
            self.sim.trace(f"controller applies {message.src}'s late proposal: {result}")

    def forget_late(self, slot: int) -> None:
        """Not simulated: a late commit of a proposal from a broker's previous life (a
        fresh core cannot know what its previous life proposed)."""
        self.late = [(t, m) for t, m in self.late if m.src != slot]

    def scan(self) -> None:
        """The leader's liveness scan (controller/operations.py _scan_once): elect when the
        master is dead and someone in the SyncStateSet may still take over."""
        if self.now() < self.next_scan_ms:
            return
        self.next_scan_ms = self.now() + SCAN_INTERVAL_MS
        bs = self.broker_set()
        if bs is None or bs["master_epoch"] == 0:
            return
        alive = self.alive()
        master = bs["master_broker_id"]
        if (master and str(master) in alive) or (
            not master and not any(str(i) in alive for i in bs["sync_state_set"])
        ):
            return
        command = {"type": "elect_master", "cluster": CLUSTER, "broker_name": NAME, "trigger": "controller"}
        self.apply(dict(command, alive=alive))


# A broker: the shell around the real core --------------------------------------------------
@dataclass
class FetchState:
    """The slave's fetch loop of one session (ha_fetch.follow)."""

    session: int
    master_id: int
    handshake: bool = True
    call: int | None = None  # the fetch in flight
    deadline_ms: int = 0
    next_ms: int = 0
    answered: bool = False  # an answer of this session was applied: the log is a prefix


@dataclass
class PendingWrite:
    end: int
    epoch: int
    records: list[tuple[int, bytes]]
    deadline_ms: int


class SimBroker:
    """What agent.py and ha_fetch.py do around the core, over simulated messages."""

    def __init__(self, sim: Simulation, slot: int) -> None:
        self.sim = sim
        self.slot = slot
        self.rate = 1 + sim.rng.uniform(-CLOCK_SKEW, CLOCK_SKEW)
        self.offset_ms = sim.rng.randint(0, 10**6)  # monotonic clocks start anywhere
        self.log = SimLog()
        self.broker_id = 0  # the identity file: it survives restarts
        self.core: BrokerCore | None = None
        self.down_since_ms = 0.0
        self.start()

    # Lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.log.recover()
        self.core = BrokerCore(NAME, self.sim.policy, NOT_CATCHUP_MS, PENDING_GRACE_MS)
        self.registered = False
        self.registered_once = False  # agent.py: new_process until a registration is answered
        self.refresh_needed = False
        self.calls: dict[str, tuple[int, int]] = {}  # kind -> (call id, deadline) of controller calls
        self.next_heartbeat_ms = 0
        self.heartbeat_sent_ms = 0
        self.next_tick_ms = 0
        self.fetch: FetchState | None = None
        self.parked: list[tuple[Message, int]] = []  # long-polling fetches and their deadlines
        self.writes: list[PendingWrite] = []
        self.leaving_since_ms: float | None = None

    def exit(self) -> None:
        """A leaving broker's process stops (agent.depart's bound): a clean exit."""
        self.core = None
        self.down_since_ms = self.sim.t
        self.sim.controller.forget_late(self.slot)
        self.sim.trace(f"{self.slot} stops after leaving (log end {self.log.end})")

    def crash(self) -> None:
        """kill -9: the core and everything in flight go; a write in progress is torn.
        Half of them are power losses: what the master wrote but did not sync goes too."""
        rng = self.sim.rng
        if rng.random() < 0.5:
            lost = self.log.end - self.log.durable
            self.log.lose_unsynced()
            self.sim.trace(f"power loss at {self.slot}: {lost} unsynced bytes gone")
        if rng.random() < 0.5:
            if self.fetch is not None and self.fetch.answered and rng.random() < 0.5:
                self._tear_epoch_entry(self.fetch.master_id)
            torn = encode_record(max(1, self.log.view().last_epoch), self.sim.next_id(), b"torn" * 3)
            self.log.data += torn[: rng.randint(1, len(torn) - 1)]
        self.core = None
        self.down_since_ms = self.sim.t
        self.sim.controller.forget_late(self.slot)
        self.sim.trace(f"crash {self.slot} (log end {self.log.end})")

    def _tear_epoch_entry(self, master_id: int) -> None:
        """A replicated append of a new epoch's first records dies after the epoch file
        (which leads the log) was written and before the records were."""
        master = self.sim.broker_with_id(master_id)
        last = self.log.epochs[-1][0] if self.log.epochs else 0
        for epoch, start in master.log.epochs if master is not None else []:
            if start == self.log.end and epoch > last and master is not None and master.log.end > start:
                self.log.epochs.append((epoch, start))
                return

    @property
    def alive(self) -> bool:
        return self.core is not None

    def now(self) -> int:
        return self.offset_ms + int(self.sim.t * self.rate)

    def send(self, dst: Node, kind: str, body: Json) -> None:
        self.sim.network.send(self.sim.t, self.slot, dst, kind, body)

    # Feeding the core and carrying out its effects (agent.py _carry_out) -----------------
    def feed(self, event: Event) -> list[Effect]:
        assert self.core is not None
        effects = self.core.handle(event)
        for effect in effects:
            self._carry_out(effect)
        return effects

    def _carry_out(self, effect: Effect) -> None:
        match effect:
            case BeginEpoch(epoch=epoch):
                self.log.begin_epoch(epoch)
            case Truncate(offset=offset):
                self.sim.trace(f"{self.slot} truncates {self.log.end} -> {offset}")
                self.log.truncate(offset)
            case AppendReplicated(offset=offset, data=data):
                self.log.append_replicated(offset, data)
            case RequestRefresh():
                self.refresh_needed = True
            case StartFetching(session=session, master_broker_id=master_id):
                self.fetch = FetchState(session, master_id)
            case StopFetching():
                self.fetch = None
            case Refuse(error=error):
                raise error

    def apply_info(self, info: Json, committed_proposal: bool = False) -> None:
        assert self.core is not None
        was_master = self.core.role == Role.MASTER
        event = ReplicaInfo(
            self.now(),
            info["master_broker_id"],
            info["master_address"],
            info["master_epoch"],
            tuple(info["sync_state_set"]),
            info["sync_state_set_epoch"],
            frozenset(int(i) for i in info["replicas"]),
            self.log.view(),
        )
        self.feed(SyncStateSetChanged(event) if committed_proposal else event)
        if self.core.role == Role.MASTER and not was_master:
            self.sim.trace(
                f"{self.slot} (broker {self.broker_id}) is master at epoch {self.core.master_epoch}"
            )
            self.sim.masters += 1
            self.sim.check_nothing_acknowledged_is_lost(self, "the new master")

    # The controller loop (agent.py) ----------------------------------------------------------
    def call(self, kind: str, body: Json) -> None:
        call = self.sim.next_id()
        self.calls[kind] = (call, self.now() + CALL_TIMEOUT_MS)
        self.send(CONTROLLER, kind, dict(body, call=call))

    def controller_loop(self) -> None:
        assert self.core is not None
        now = self.now()
        for kind, (_, deadline_ms) in list(self.calls.items()):
            if now > deadline_ms:
                del self.calls[kind]
                self._call_failed(kind)
        if not self.registered:
            if "register" not in self.calls:
                self.call("register", {"broker_id": self.broker_id, "new_process": not self.registered_once})
            return
        if self.refresh_needed and not self.calls.keys() & {"replica_info", "elect"}:
            self.refresh_needed = False
            self.call("replica_info", {})
        if now >= self.next_heartbeat_ms and "heartbeat" not in self.calls:
            self.next_heartbeat_ms, self.heartbeat_sent_ms = now + HEARTBEAT_INTERVAL_MS, now
            epoch = self.log.view().last_epoch or self.core.master_epoch
            self.call("heartbeat", {"broker_id": self.broker_id, "epoch": epoch, "max_offset": self.log.end})
        if self.core.view().departure is Departure.HANDING_OFF and "handoff" not in self.calls:
            self._handoff_tick(now)
        if now >= self.next_tick_ms and "alter" not in self.calls:
            self.next_tick_ms = now + TICK_INTERVAL_MS
            for effect in self.feed(Tick(now, self.log.view())):
                if isinstance(effect, ProposeSyncStateSet):
                    self._propose(effect)

    def start_handoff(self) -> None:
        """What BrokerAgent.handoff does first: refuse writes, then drain (below)."""
        assert self.core is not None
        now, others = self.now(), [b.broker_id for b in self.sim.brokers if b is not self and b.broker_id]
        preferred = self.sim.rng.choice([0, *others])
        try:
            self.feed(HandoffStart(now, now + HANDOFF_DRAIN_MS, preferred))
        except MqmetaError as error:
            self.sim.trace(f"{self.slot} cannot hand off: {error}")
            return
        self.sim.handoffs_started += 1
        self.sim.trace(f"{self.slot} hands off (preferred {preferred})")

    def _handoff_tick(self, now: int) -> None:
        try:
            effects = self.feed(HandoffTick(now, self.log.view()))
        except MqmetaError as error:
            self.sim.trace(f"{self.slot} gives the handoff up: {error}")
            return
        for effect in effects:
            if isinstance(effect, ElectSuccessor):
                self.sim.trace(f"{self.slot} asks to elect {effect.successor_broker_id}")
                body = {
                    "type": "elect_master",
                    "trigger": "handoff",
                    "requester_broker_id": self.broker_id,
                    "preferred_broker_id": effect.successor_broker_id,
                    "master_epoch": effect.master_epoch,
                }
                self.call("handoff", body)

    def _propose(self, proposal: ProposeSyncStateSet) -> None:
        body = {
            "type": "alter_sync_state_set",
            "master_broker_id": proposal.master_broker_id,
            "master_epoch": proposal.master_epoch,
            "sync_state_set_epoch": proposal.sync_state_set_epoch,
            "new_sync_state_set": list(proposal.new_sync_state_set),
        }
        self.call("alter", body)

    def _call_failed(self, kind: str, code: str = "") -> None:
        if kind == "handoff":
            self.feed(HandoffFailed(self.now(), "no answer or refused"))
        elif kind == "alter":
            self.feed(SyncStateSetFailed(self.now(), ProposalOutcome.of_code(code)))
        elif kind in ("replica_info", "elect"):
            self.refresh_needed = True

    def controller_reply(self, message: Message) -> None:
        kind, body = message.kind.removesuffix("_reply"), message.body
        if self.calls.get(kind, (None,))[0] != body["call"]:
            return  # it timed out already: the client gave up on it
        del self.calls[kind]
        if "error" in body:
            if kind == "heartbeat" and body["error"] == "NOT_FOUND":
                self.registered = False
            self._call_failed(kind, body["error"])
        elif kind == "register":
            self.broker_id, self.registered, self.registered_once = body["broker_id"], True, True
            self.feed(Registered(self.broker_id, body["lease_ms"]))
            self._apply_or_elect(body["info"])
        elif kind == "replica_info":
            self._apply_or_elect(body["info"])
        elif kind in ("elect", "handoff"):
            if kind == "handoff":
                self.sim.handoffs_elected += 1
            self.apply_info(body["info"])
        elif kind == "alter":
            self.apply_info(body["info"], committed_proposal=True)
        elif kind == "heartbeat":
            reply = HeartbeatAnswered(
                self.heartbeat_sent_ms,
                body["master_broker_id"],
                body["master_epoch"],
                body["sync_state_set_epoch"],
                body["lease_ms"],
            )
            self.feed(reply)

    def _apply_or_elect(self, info: Json) -> None:
        if info["master_broker_id"]:
            self.apply_info(info)
        else:
            self.call(
                "elect", {"type": "elect_master", "trigger": "broker", "requester_broker_id": self.broker_id}
            )

    # Replication, the slave's side (ha_fetch.follow) -----------------------------------
    def fetch_loop(self) -> None:
        assert self.core is not None
        fetch, now = self.fetch, self.now()
        if fetch is None or not self.core.follows(fetch.session):
            return
        if fetch.call is not None and now > fetch.deadline_ms:
            fetch.call, fetch.handshake, fetch.next_ms = None, True, now + RETRY_PAUSE_MS
        master = self.sim.slot_of(fetch.master_id)
        if fetch.call is not None or now < fetch.next_ms or master is None:
            return
        fetch.call, fetch.deadline_ms = self.sim.next_id(), now + FETCH_TIMEOUT_MS
        body = {
            "call": fetch.call,
            "broker_id": self.broker_id,
            "master_epoch": self.core.master_epoch,
            "fetch_offset": self.log.end,
            "handshake": fetch.handshake,
            "entries": tuple(self.log.epochs) if fetch.handshake else (),
            "leaving": self.core.view().departure is Departure.LEAVING,
        }
        self.send(master, "fetch", body)

    def fetch_reply(self, message: Message) -> None:
        fetch, body = self.fetch, message.body
        if fetch is None or fetch.call != body["call"]:
            return  # an answer this session gave up on, or of an older session
        fetch.call, now = None, self.now()
        fetch.handshake, fetch.next_ms = True, now + RETRY_PAUSE_MS  # unless the answer is applied
        if "error" in body:
            self.refresh_needed |= body["error"] in ("NOT_MASTER", "FENCED_MASTER_EPOCH")
            return
        answer = MasterAnswered(
            fetch.session,
            body["master_epoch"],
            body["truncate_to"],
            body["data_offset"],
            body["data"],
            self.log.view(),
        )
        try:
            if not any(isinstance(effect, Truncate) for effect in self.feed(answer)):
                self.feed(Replicated(fetch.session, body["confirm_offset"], self.log.view()))
        except StoreError as error:
            self.sim.trace(f"{self.slot} replication: {error}")
            return
        fetch.handshake, fetch.answered = False, True
        if body["data"]:
            fetch.next_ms = now

    # Replication, the master's side (ha_fetch.serve_fetch) -----------------------------
    def fetch_request(self, message: Message) -> None:
        body = message.body
        fetch = SlaveFetch(
            self.now(),
            body["broker_id"],
            body["master_epoch"],
            body["fetch_offset"],
            body["handshake"],
            body["entries"],
            self.log.view(),
            body["leaving"],
        )
        try:
            effects = self.feed(fetch)
        except (NotMaster, FencedEpoch) as error:
            self.send(message.src, "fetch_reply", {"call": body["call"], "error": error.code})
            return
        answer = next(effect for effect in effects if isinstance(effect, AnswerFetch))
        if body["handshake"]:
            self.sim.check_consistent_point(self, message, answer)
        if answer.truncate_to >= 0:
            self._answer(message, truncate_to=answer.truncate_to)
        elif self.log.end > body["fetch_offset"]:
            self._serve(message)
        else:
            self.parked.append((message, self.now() + FETCH_WAIT_MS))

    def serve_parked(self) -> None:
        """Long polls: answered once data arrives or the wait ends, after a re-check."""
        waiting = []
        for message, deadline_ms in self.parked:
            if self.log.end <= message.body["fetch_offset"] and self.now() < deadline_ms:
                waiting.append((message, deadline_ms))
                continue
            try:
                self.feed(FetchStillWaiting(message.body["master_epoch"]))
            except (NotMaster, FencedEpoch) as error:
                self.send(message.src, "fetch_reply", {"call": message.body["call"], "error": error.code})
                continue
            self._serve(message)
        self.parked = waiting

    def _serve(self, message: Message) -> None:
        try:
            data = self.log.read(message.body["fetch_offset"], self.sim.rng.randint(1, FETCH_RECORDS_MAX))
        except StoreError:
            self.send(message.src, "fetch_reply", {"call": message.body["call"], "error": "INVALID_ARGUMENT"})
            return
        self.feed(FetchAnswered(self.now(), message.body["broker_id"], self.log.view()))
        self._answer(message, data_offset=message.body["fetch_offset"], data=data)

    def _answer(
        self, message: Message, truncate_to: int = -1, data_offset: int = 0, data: bytes = b""
    ) -> None:
        assert self.core is not None
        view = self.core.view()
        body = {
            "call": message.body["call"],
            "master_epoch": view.master_epoch,
            "confirm_offset": view.confirm_offset,
            "truncate_to": truncate_to,
            "data_offset": data_offset,
            "data": data,
        }
        self.send(message.src, "fetch_reply", body)

    # The data plane (agent.py _write, wait_acknowledged) -------------------------------------
    def write(self, message: Message) -> None:
        assert self.core is not None
        try:
            self.core.check_writable(self.now())
        except MqmetaError:
            return
        self.sim.check_one_writer(f"slot {self.slot} accepts a write")
        epoch, rng = self.core.master_epoch, self.sim.rng
        records = [encode_record(epoch, i, rng.randbytes(rng.randint(0, 24))) for i in message.body["ids"]]
        placed = self.log.put(epoch, records)  # written, not synced (group commit)
        self.feed(Appended(self.log.view()))
        self.writes.append(PendingWrite(self.log.end, epoch, placed, self.now() + SEND_TIMEOUT_MS))

    def group_commit(self) -> None:
        """agent.wait_acknowledged's sync: some steps after the append, one sync for all."""
        assert self.core is not None
        if self.log.durable < self.log.end and self.sim.rng.random() < SYNC_RATE:
            self.log.sync()
            self.feed(Synced(self.log.view()))

    def resolve_writes(self) -> None:
        assert self.core is not None
        waiting = []
        for write in self.writes:
            if write.end > self.log.durable:  # agent.wait_acknowledged: its own sync first, then acks
                if self.now() < write.deadline_ms:
                    waiting.append(write)
                continue
            outcome = self.core.write_outcome(write.end, write.epoch)
            if outcome is WriteOutcome.ACKNOWLEDGED:
                self.sim.acknowledge(self, write)
            elif outcome is WriteOutcome.WAITING and self.now() < write.deadline_ms:
                waiting.append(write)
        self.writes = waiting

    # One step ---------------------------------------------------------------------------------
    def receive(self, message: Message) -> None:
        assert self.core is not None
        if message.src == CONTROLLER:
            self.controller_reply(message)
        elif message.kind == "watch" and self.core.broker_id:
            self.apply_info(message.body["info"])
        elif message.kind == "fetch":
            self.fetch_request(message)
        elif message.kind == "fetch_reply":
            self.fetch_reply(message)
        elif message.kind == "write":
            self.write(message)

    def step(self) -> None:
        self.controller_loop()
        self.fetch_loop()
        self.serve_parked()
        self.group_commit()
        self.resolve_writes()


# The simulation ------------------------------------------------------------------------------
class Simulation:
    def __init__(
        self,
        seed: int,
        steps: int = SIM_STEPS,
        policy: AckPolicy | None = None,
        new_epoch_on_restart: bool = True,
    ) -> None:
        """`new_epoch_on_restart`: a broker's first registration says it is a new process,
        so a master that restarts before another is elected begins a new epoch
        (controller/state_machine.py _register_broker); False: controllers or brokers of a
        version before that, where it re-adopts its epoch (core._untrusted_cut's case)."""
        self.seed = seed
        self.policy = policy or AckPolicy()
        self.new_epoch_on_restart = new_epoch_on_restart
        self.steps = steps
        self.rng = random.Random(seed)
        self.intensity = self.rng.choice(INTENSITIES)
        self.t = 0.0  # true time, ms
        self.step_index = 0
        self.events: list[str] = []
        self.ids = itertools.count(1)
        self.network = Network(self.rng)
        self.controller = SimController(self)
        self.brokers = [SimBroker(self, slot) for slot in SLOTS]
        self.acknowledged: dict[int, bytes] = {}  # offset -> the acknowledged record there
        self.acks = 0
        self.masters = 0
        self.renewals = 0  # a restarted master given a new epoch at its registration
        self.handoffs_started = 0
        self.handoffs_elected = 0
        self.faults = True
        self.load_on = False
        self.load_until_ms = 0.0

    # Bookkeeping ------------------------------------------------------------------------------
    def next_id(self) -> int:
        return next(self.ids)

    def trace(self, line: str) -> None:
        self.events.append(f"[step {self.step_index}, {self.t:.0f} ms] {line}")
        del self.events[:-40]

    def fail(self, what: str) -> None:
        recent = "\n  ".join(self.events[-25:])
        test = (
            "test_simulated_broker_set_keeps_its_invariants"
            if self.policy.all_ack_in_sync_state_set
            else "test_simulated_broker_set_acknowledging_at_2_of_3_copies_keeps_its_invariants"
        )
        raise Violation(
            f"{what}\nseed={self.seed} step={self.step_index} (fault intensity {self.intensity}); replay: "
            f"MQMETA_SIM_SEEDS={self.seed + 1} pytest 'tests/test_broker_simulation.py::{test}[{self.seed}]'"
            f"\nlast events:\n  {recent}"
        )

    def slot_of(self, broker_id: int) -> int | None:
        return next((b.slot for b in self.brokers if broker_id and b.broker_id == broker_id), None)

    def broker_with_id(self, broker_id: int) -> SimBroker | None:
        slot = self.slot_of(broker_id)
        return self.brokers[slot] if slot is not None else None

    def watch_event(self) -> None:
        """The watch stream pushes each change of the broker set to its brokers."""
        bs = self.controller.broker_set()
        assert bs is not None
        for broker_id in bs["replicas"]:
            slot = self.slot_of(int(broker_id))
            if slot is not None:
                self.network.send(self.t, WATCH, slot, "watch", {"info": replica_view(bs)})

    def acknowledge(self, broker: SimBroker, write: PendingWrite) -> None:
        self.check_one_writer(f"slot {broker.slot} acknowledges a write")
        if not self.policy.all_ack_in_sync_state_set:
            self.check_enough_copies_in_the_controller_set(broker, write)
        for offset, record in write.records:
            self.acknowledged[offset] = record
        self.acks += 1

    def master(self) -> SimBroker | None:
        """The controller's master, if it is up and acting as master of that epoch."""
        bs = self.controller.broker_set()
        master = self.broker_with_id(bs["master_broker_id"]) if bs else None
        if bs is None or master is None or master.core is None:
            return None
        if master.core.role != Role.MASTER or master.core.master_epoch != bs["master_epoch"]:
            return None
        return master

    # Checks -----------------------------------------------------------------------------------
    def check_one_writer(self, when: str) -> None:
        writers = [b for b in self.brokers if b.core is not None and b.core.writable(b.now())]
        if len(writers) > 1:
            self.fail(f"two masters may write at once ({when}): slots {[b.slot for b in writers]}")
        bs = self.controller.broker_set()
        for writer in writers:
            assert writer.core is not None and bs is not None
            if (bs["master_broker_id"], bs["master_epoch"]) != (writer.broker_id, writer.core.master_epoch):
                self.fail(
                    f"slot {writer.slot} may write as master of epoch {writer.core.master_epoch} "
                    f"but the controller says {self.controller.summary()} ({when})"
                )

    def check_enough_copies_in_the_controller_set(self, master: SimBroker, write: PendingWrite) -> None:
        """Acks from in_sync_replicas copies: an acknowledged write is durable on that many
        members of the SyncStateSet the controller holds, the set it elects from."""
        bs = self.controller.broker_set()
        if bs is None or (bs["master_broker_id"], bs["master_epoch"]) != (master.broker_id, write.epoch):
            return  # deposed meanwhile: no longer the controller's master of the write's epoch
        holders = []
        for member in bs["sync_state_set"]:
            replica = self.broker_with_id(member)
            if replica is None or replica.log.durable < write.end:
                continue
            if all(replica.log.data[o : o + len(r)] == r for o, r in write.records):
                holders.append(member)
        if len(holders) < self.policy.in_sync_replicas:
            self.fail(
                f"slot {master.slot} acknowledged a write ending at {write.end} held by {holders} only "
                f"of the controller's SyncStateSet {bs['sync_state_set']} "
                f"({self.policy.in_sync_replicas} needed)"
            )

    def check_nothing_acknowledged_is_lost(self, broker: SimBroker, who: str) -> None:
        if not self.policy.all_ack_in_sync_state_set:
            return  # the controller elects by reported offsets, maybe not a holder (the docstring)
        data = broker.log.data
        for offset, record in self.acknowledged.items():
            if data[offset : offset + len(record)] != record:
                self.fail(
                    f"acknowledged record at {offset} lost: {who} (slot {broker.slot}) does not hold it"
                )

    def check_confirmed_bytes_are_durable(self) -> None:
        """Group commit: no master confirms bytes a power loss could take from it."""
        for broker in self.brokers:
            core = broker.core
            if core is not None and core.role == Role.MASTER and core.confirm_offset > broker.log.durable:
                self.fail(
                    f"slot {broker.slot} confirms up to {core.confirm_offset} but its log is durable "
                    f"only up to {broker.log.durable} (log end {broker.log.end})"
                )

    def check_sync_state_set_holds_the_confirmed_bytes(self) -> None:
        """The confirm offset is what the SyncStateSet durably holds: every member the
        controller could elect next, up or down, holds the master's bytes below it."""
        bs, master = self.controller.broker_set(), self.master()
        if bs is None or master is None or master.core is None:
            return
        confirm = master.core.confirm_offset
        for member in bs["sync_state_set"]:
            replica = self.broker_with_id(member)
            if (
                replica is not None
                and replica is not master
                and replica.log.data[:confirm] != master.log.data[:confirm]
            ):
                self.fail(
                    f"B1: SyncStateSet member slot {replica.slot} (log end {replica.log.end}) does not hold "
                    f"what master slot {master.slot} confirmed (below {confirm})"
                )

    def check_master_counts_the_controller_set(self) -> None:
        """No acknowledged write depends on a union the controller never saw: every member
        of the controller's SyncStateSet is in the master's set or in its proposal in
        flight, so the confirm offset waits for it (a proposal that commits late included)."""
        bs, master = self.controller.broker_set(), self.master()
        if bs is None or master is None or master.core is None:
            return
        view, pending = master.core.view(), master.core.pending_sync_state_set or ()
        counted = {*view.sync_state_set, *pending, master.broker_id}
        missing = set(bs["sync_state_set"]) - counted
        if missing:
            self.fail(
                f"master slot {master.slot} does not count SyncStateSet members {sorted(missing)} that the "
                f"controller holds ({self.controller.summary()}; its set {list(view.sync_state_set)}, "
                f"in flight {list(pending)})"
            )

    def check_consistent_point(self, master: SimBroker, message: Message, answer: AnswerFetch) -> None:
        """A handshake's answer: the slave keeps only bytes the master holds too."""
        slave = self.brokers[int(message.src)]
        if not slave.alive or slave.log.end != message.body["fetch_offset"]:
            return  # the slave moved on since it asked
        keep = answer.truncate_to if answer.truncate_to >= 0 else slave.log.end
        if slave.log.data[:keep] != master.log.data[:keep]:
            self.fail(
                f"B1: master slot {master.slot} lets slot {slave.slot} keep its log up to {keep}, "
                "above the consistent point (the logs differ below it)"
            )

    def check_slaves_are_prefixes(self) -> None:
        """A slave answered in its session holds a prefix of that master's log."""
        for slave in self.brokers:
            if slave.core is None or slave.fetch is None or not slave.fetch.answered:
                continue
            master = self.broker_with_id(slave.fetch.master_id)
            if master is None or master.core is None or master.core.role != Role.MASTER:
                continue
            if not master.core.trusts(slave.core.broker_id):
                continue  # it may hold bytes a power loss took from the master: cut at its next fetch
            if (
                master.core.master_epoch == slave.core.master_epoch
                and slave.log.data != master.log.data[: slave.log.end]
            ):
                self.fail(
                    f"B1: slot {slave.slot} (log end {slave.log.end}) follows master slot {master.slot} "
                    f"(log end {master.log.end}) but is not a prefix of its log"
                )

    def check_logs(self, where: str = "") -> None:
        for broker in self.brokers:
            if broker.alive:
                broker.log.check(f"slot {broker.slot}{where}")

    # Faults and load ------------------------------------------------------------------------
    def inject(self) -> None:
        rng, scale = self.rng, self.intensity
        alive = [b for b in self.brokers if b.alive]
        dead = [b for b in self.brokers if not b.alive and self.t - b.down_since_ms > RESTART_AFTER_MS]
        if alive and rng.random() < CRASH_RATE * scale:
            rng.choice(alive).crash()
        if dead and rng.random() < RESTART_RATE:
            broker = rng.choice(dead)
            broker.start()
            self.trace(f"restart {broker.slot} (log end {broker.log.end})")
        if rng.random() < CUT_RATE * scale:
            a = rng.choice(SLOTS)
            b = rng.choice([CONTROLLER, WATCH, *(s for s in SLOTS if s != a)])
            duration, hold = rng.uniform(50, CUT_MS_MAX), rng.random() < 0.5
            self.network.cut(self.t, a, b, duration, hold)
            self.trace(f"cut {a}-{b} for {duration:.0f} ms ({'held' if hold else 'lost'} messages)")
        if rng.random() < ISOLATE_RATE * scale:
            a = rng.choice(SLOTS)
            duration = rng.uniform(100, ISOLATE_MS_MAX)
            for b in [CONTROLLER, WATCH, *(s for s in SLOTS if s != a)]:
                self.network.cut(self.t, a, b, duration, hold=False)
            self.trace(f"isolate {a} for {duration:.0f} ms")

    def depart(self) -> None:
        """Graceful departures: the controller's master hands off; a slave starts leaving."""
        rng, master = self.rng, self.master()
        if master is not None and rng.random() < HANDOFF_RATE * self.intensity:
            master.start_handoff()
        slaves = [b for b in self.brokers if b.core is not None and b.core.role == Role.SLAVE]
        if slaves and rng.random() < LEAVE_RATE * self.intensity:
            slave = rng.choice(slaves)
            slave.feed(Leave())
            slave.leaving_since_ms = self.t
            self.trace(f"{slave.slot} starts leaving")
        for broker in self.brokers:  # each stops LEAVE_EXIT_MS later (maybe elected meanwhile)
            if broker.core is not None and broker.leaving_since_ms is not None:
                if self.t - broker.leaving_since_ms > LEAVE_EXIT_MS:
                    broker.exit()

    def produce(self) -> None:
        """Bursts of writes and quiet gaps, mostly to the controller's master."""
        if self.t >= self.load_until_ms:
            self.load_on = not self.load_on
            self.load_until_ms = self.t + self.rng.uniform(20, LOAD_PHASE_MS_MAX)
        if not self.load_on or self.rng.random() >= WRITE_RATE:
            return
        bs = self.controller.broker_set()
        target = self.slot_of(bs["master_broker_id"]) if bs else None
        if target is None or self.rng.random() < 0.1:
            target = self.rng.choice(SLOTS)
        ids = [self.next_id() for _ in range(self.rng.randint(1, 3))]
        self.network.send(self.t, CLIENT, target, "write", {"ids": ids})

    # Running ---------------------------------------------------------------------------------
    def tick(self, load: bool) -> None:
        self.step_index += 1
        self.t += self.rng.uniform(0.5, STEP_MS_MAX)
        self.network.heal(self.t)
        if self.faults:
            self.inject()
            self.depart()
        if load:
            self.produce()
        for message in self.network.due(self.t):
            self.deliver(message)
        self.controller.apply_late()
        self.controller.scan()
        for broker in self.brokers:
            if broker.alive:
                broker.step()
        self.check_one_writer("a step")
        self.check_confirmed_bytes_are_durable()
        self.check_sync_state_set_holds_the_confirmed_bytes()
        self.check_master_counts_the_controller_set()
        self.check_slaves_are_prefixes()
        if self.step_index % 500 == 0:
            self.check_logs()

    def deliver(self, message: Message) -> None:
        if message.dst == CONTROLLER:
            self.controller.receive(message)
            return
        broker = self.brokers[int(message.dst)]
        if broker.alive:
            broker.receive(message)

    def run(self) -> None:
        for _ in range(self.steps):
            self.tick(load=True)
        self.settle()

    def settle(self) -> None:
        """Heal everything, restart the dead, stop faults and load; the set must converge
        to one master with every replica equal to it."""
        self.faults = False
        self.network.heal(self.t, everything=True)
        self.network.drop_rate = 0.0
        for broker in self.brokers:
            leaving = broker.core is not None and broker.core.view().departure is Departure.LEAVING
            if not broker.alive or leaving:  # a leaving broker exits and comes back
                broker.start()
        for _ in range(SETTLE_STEPS_MAX):
            self.tick(load=False)
            if self.converged():
                break
        else:
            ends = [b.log.end for b in self.brokers]
            self.fail(f"the broker set did not converge: {self.controller.summary()}; log ends {ends}")
        master = self.master()
        assert master is not None
        self.check_logs(" at the end")
        for broker in self.brokers:
            self.check_nothing_acknowledged_is_lost(broker, "at the end, a replica")
            if broker.log.data != master.log.data:
                self.fail(f"B1: at the end slot {broker.slot} differs from the master slot {master.slot}")

    def converged(self) -> bool:
        master, bs = self.master(), self.controller.broker_set()
        if master is None or bs is None or not master.core or not master.core.writable(master.now()):
            return False
        return len(bs["sync_state_set"]) == len(SLOTS) and all(
            b.alive and b.log.data == master.log.data for b in self.brokers
        )


# Tests --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SIM_SEEDS)
def test_simulated_broker_set_acknowledging_at_2_of_3_copies_keeps_its_invariants(seed):
    """--no-all-ack --in-sync-replicas 2: each acknowledged write is on two members of the
    set the controller holds, checked at its acknowledgement; the other invariants of the
    module docstring but "a new master holds every acknowledged write" (the controller
    elects by the offsets brokers last reported). Counted over the union of the set and a
    proposal in flight (before 2026-12-04), every seed fails."""
    sim = Simulation(seed, policy=AT_2_OF_3)
    sim.run()
    assert sim.acks > 50, f"seed={seed}: only {sim.acks} writes were acknowledged"
    assert sim.masters >= 1, f"seed={seed}: no master was ever elected"


@pytest.mark.parametrize("seed", READOPTION_DIVERGENCE_SEEDS)
def test_a_restarted_master_begins_a_new_epoch_and_no_slave_keeps_bytes_it_lost(seed):
    """These seeds failed B1 while a master that restarted before another was elected
    re-adopted its epoch; registering as a new process ends that epoch. Each still fails
    when it re-adopts (so the seed still reaches the case under test)."""
    sim = Simulation(seed)
    sim.run()
    assert sim.acks > 50
    assert sim.renewals >= 1, f"seed={seed}: no master restarted before another was elected"
    with pytest.raises(Violation, match="above the consistent point"):
        Simulation(seed, new_epoch_on_restart=False).run()


@pytest.mark.parametrize("seed", SIM_SEEDS)
def test_simulated_broker_set_keeps_its_invariants(seed):
    sim = Simulation(seed)
    sim.run()
    assert sim.acks > 50, f"seed={seed}: only {sim.acks} writes were acknowledged"
    assert sim.masters >= 1, f"seed={seed}: no master was ever elected"
    HANDOFF_COUNTS.append((sim.handoffs_started, sim.handoffs_elected))


HANDOFF_COUNTS: list[tuple[int, int]] = []


def test_the_seeds_hand_off():
    """The seeds above exercised handoffs (this runs after them, in file order)."""
    if len(HANDOFF_COUNTS) < len(SIM_SEEDS):
        pytest.skip("needs every seed of test_simulated_broker_set_keeps_its_invariants in this run")
    elected = sum(e for _, e in HANDOFF_COUNTS)
    assert elected >= len(SIM_SEEDS), f"only {elected} handoffs elected a successor: {HANDOFF_COUNTS}"


def counted_members_without_the_pending_union(
    master_id: int, sync_state_set: tuple[int, ...], pending: tuple[int, ...] | None
) -> set[int]:
    """RocketMQ #5663: only the SyncStateSet this master holds counts, not the one in flight."""
    return set(sync_state_set) | {master_id}


def truncation_point_ignoring_the_master_end(
    slave_entries: tuple[EpochEntry, ...],
    slave_max_offset: int,
    master_entries: tuple[EpochEntry, ...],
    master_max_offset: int,
) -> int | None:
    """Finds the newest common epoch but keeps the slave's copy of it whole, even where the
    master's copy of that epoch ended earlier: truncation above the consistent point."""
    master_starts = dict(master_entries)
    for i in range(len(slave_entries) - 1, -1, -1):
        epoch, start = slave_entries[i]
        if master_starts.get(epoch) == start:
            point = slave_entries[i + 1][1] if i + 1 < len(slave_entries) else slave_max_offset
            return point if point < slave_max_offset else None
    return 0 if slave_max_offset else None


def lease_always_valid(self: Lease, now_ms: int) -> bool:
    """RocketMQ #4800: no lease, a master partitioned from the controller keeps writing."""
    return True


def confirm_counting_unsynced_bytes(self: LogView) -> int:
    """Group commit: the master counts what it wrote, not what it synced, as its own ack."""
    return self.max_offset


def untrusted_never_cut(s: Any, fetch: Any) -> int | None:
    """Slaves are served unsynced bytes, and a master that re-adopts its epoch after a power
    loss trusts every slave's log: one keeps bytes the master lost and wrote again."""
    return None


def copies_counted_in(members: Callable[[Any], set[int]]) -> Callable[[Any, int], bool]:
    """core._acknowledged with in_sync_replicas copies counted in `members(state)` alone."""

    def acknowledged(s: Any, end_offset: int) -> bool:
        if s.policy.all_ack_in_sync_state_set:
            return bool(s.confirm_offset >= end_offset)
        acked = s.tracker.acked()
        others = members(s) - {s.broker_id}
        return 1 + sum(1 for i in others if acked.get(i, 0) >= end_offset) >= s.policy.in_sync_replicas

    return acknowledged


# as before 2026-12-04: a proposal that never commits leaves a write on members the
# controller will not elect
copies_over_the_union = copies_counted_in(lambda s: core_module._counted(s))
# as if no change were in flight: a shrink the controller has committed may leave out a holder
copies_in_the_set_only = copies_counted_in(lambda s: set(s.sync_state_set))


# name -> (where, what, the buggy variant, what the simulation must report, and the
# Simulation options that make it reachable)
PLANTED_BUGS: dict[str, tuple[Any, str, Callable[..., Any], str, dict[str, Any]]] = {
    "confirm offset without the pending union": (
        core_module,
        "counted_members",
        counted_members_without_the_pending_union,
        "does not hold what master",
        {},
    ),
    "truncation above the consistent point": (
        core_module,
        "truncation_point",
        truncation_point_ignoring_the_master_end,
        "above the consistent point",
        {},
    ),
    "no master lease": (Lease, "valid", lease_always_valid, "may write", {}),
    "confirm counts unsynced bytes": (
        LogView,
        "durable",
        property(confirm_counting_unsynced_bytes),
        "its log is durable only up to",
        {},
    ),
    "a re-adopted epoch trusts every slave": (
        core_module,
        "_untrusted_cut",
        untrusted_never_cut,
        "above the consistent point",
        {"new_epoch_on_restart": False},  # only a re-adopting master needs the cut
    ),
    "copies counted over the union (2 of 3)": (
        core_module,
        "_acknowledged",
        copies_over_the_union,
        "acknowledged a write ending at",
        {"policy": AT_2_OF_3},
    ),
    "copies counted in the set only (2 of 3)": (
        core_module,
        "_acknowledged",
        copies_in_the_set_only,
        "acknowledged a write ending at",
        {"policy": AT_2_OF_3},
    ),
}


@pytest.fixture(params=list(PLANTED_BUGS))
def planted_bug(request, monkeypatch) -> tuple[str, str, dict[str, Any]]:
    """Puts one bug back into the core; returns its name, what must catch it, and the
    Simulation options it needs."""
    owner, attribute, buggy, expected, options = PLANTED_BUGS[request.param]
    monkeypatch.setattr(owner, attribute, buggy)
    return request.param, expected, options


def test_the_simulation_catches_a_planted_bug(planted_bug):
    name, expected, options = planted_bug
    for seed in range(PLANTED_BUG_SEEDS_MAX):
        sim = Simulation(seed, **options)
        try:
            sim.run()
        except Violation as violation:
            print(f"planted bug '{name}': caught with seed {seed} at step {sim.step_index}")
            assert expected in str(violation), violation
            return
    pytest.fail(f"planted bug '{name}' went unnoticed in {PLANTED_BUG_SEEDS_MAX} seeds")
