"""The broker agent: obeys the controller, owns the store, replicates master -> slaves.

Threads and what each owns:
- controller loop: registration, heartbeats (lease), role refresh, elections it
  triggers, SyncStateSet changes it proposes as master;
- watch loop: role / SyncStateSet changes pushed by the controller;
- fetcher (slave only): long-polls the master (ha_fetch.py);
- gRPC workers: the data plane (service.py) and the master side of replication.
What the broker believes about its role lives in the pure core (core.py); this module
is its shell: it feeds the core events and carries out the effects, under one lock on
which waiting sends and long-polling fetches wait.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from mqmeta.broker_agent import ha_fetch, ha_stream
from mqmeta.broker_agent.confirm_log import ConfirmLog
from mqmeta.broker_agent.core import (
    AckPolicy,
    AnswerFetch,
    Appended,
    AppendReplicated,
    BeginEpoch,
    BrokerCore,
    CorruptionFound,
    Departure,
    DiskFailed,
    Effect,
    ElectSuccessor,
    Event,
    Fence,
    FetchAnswered,
    HandoffFailed,
    HandoffStart,
    HandoffTick,
    HeartbeatAnswered,
    LeaseRevoked,
    Leave,
    NoteConfirm,
    ProposalOutcome,
    ProposeSyncStateSet,
    Refuse,
    Registered,
    ReplicaInfo,
    ReportMasterUnreachable,
    RequestRefresh,
    RoleView,
    StartFetching,
    Stop,
    StopFetching,
    Synced,
    SyncStarting,
    SyncStateSetChanged,
    SyncStateSetFailed,
    Tick,
    Truncate,
    WakeWaiters,
    WriteOutcome,
)
from mqmeta.broker_agent.ha import Role
from mqmeta.broker_agent.ha_fetch import FetchSettings
from mqmeta.broker_agent.ha_stream import StreamServer
from mqmeta.broker_agent.rmq_writes import PlainWrites
from mqmeta.broker_agent.scrub import SCRUB_BYTES_PER_S_DEFAULT, Scrubber, ScrubStats
from mqmeta.broker_agent.seams import log_view
from mqmeta.broker_agent.store import MessageStore
from mqmeta.broker_agent.tiered import TieredConfig, TieredUploader

from mqmeta.client import ControllerClient
from mqmeta.clock import now_ms, wall_ms
from mqmeta.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MqmetaError,
    NotFound,
    NotMaster,
    ResourceExhausted,
    Unavailable,
)
from mqmeta.formats.atomic import make_directories, write_json_atomically
from mqmeta.formats.origin import KEY_PROPERTIES
from mqmeta.formats.records import MessageFields
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.rpc import exit_at_once
from mqmeta.timing import (
    BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT,
    LEASE_MS_DEFAULT,
    WATCH_KEEPALIVE_MS,
    WATCH_KEEPALIVE_TIMEOUT_MS,
)

log = logging.getLogger(__name__)

PUSH_UNDER_LOCK_BYTES = 64 << 10  # an append's answers to parked fetches up to this: pushed under the lock

SEND_BATCH_MAX = 1024
# Concurrent sends written together (send): one write in flight, the sends that arrive
# meanwhile go in the next; a send whose bodies alone pass the bound goes alone.
SENDS_IN_FLIGHT_MAX = 1
SENDS_TOGETHER_BODY_BYTES_MAX = 8 << 20
_ORIGIN_PROPERTIES = frozenset(KEY_PROPERTIES)  # a message carrying one is a replicated copy
CONTROLLER_CALL_TIMEOUT_S = 1.0
# Graceful departure (SIGTERM, admin handoff): how long a master waits for its successor to
# hold everything (then it gives up and writes again), how long the election call may take,
# and how long a slave waits to be taken out of the SyncStateSet before it exits anyway.
HANDOFF_DRAIN_TIMEOUT_MS = 2000
HANDOFF_ELECT_TIMEOUT_MS = 2000
HANDOFF_POLL_INTERVAL_S = 0.01  # acks wake the drain loop; this bounds a missed wake-up
ACK_POLL_INTERVAL_S = 0.1  # _wake_writers wakes a waiting writer; this bounds a missed wake-up
LEAVE_TIMEOUT_MS = 2000
LEAVE_REFRESH_INTERVAL_S = 0.25
BROKER_ID_INVALID = "BROKER_ID_INVALID"  # the controllers hold this broker id for another broker
EXIT_BAD_INPUT = 2
# A write or fsync of the store failed: the broker has asked for another master and exits, so
# that its supervisor restarts it on what its disk really holds (PostgreSQL's answer to a
# failed fsync: after one, the kernel may have dropped the pages it could not write).
EXIT_DISK_FAILED = 3
DISK_FULL = "DISK_FULL"


# A send's answer from the thread on which its last acknowledgement arrived: called with
# (its results, the epoch) without the lock; it must not block (call_stream.EarlyAnswer).
Acknowledged = Callable[[list[Any], int], None]


@dataclass(eq=False)
class _Writer:
    """A writer waiting in wait_acknowledged: the end offset and epoch of its write, and
    the answer to send once they are acknowledged (taken by _wake_writers)."""

    end: int
    epoch: int
    on_acknowledged: Callable[[], None] | None


def _told_apart(on_acknowledged: Acknowledged, placed: list[tuple[Any, int]]) -> None:
    """One caller's share of an acknowledged PlainWrites batch: its results and the epoch."""
    on_acknowledged([result for result, _ in placed], placed[0][1])


def _told_together(on_acknowledged: Callable[[list[Any]], None], results: list[Any], epoch: int) -> None:
    """A PlainWrites batch's acknowledgement: each message's result with the epoch."""
    on_acknowledged([(result, epoch) for result in results])


# RocketMQ's messageDelayLevel: level 1 first; a remoting consumer's retries wait level 3,
# then one level more each time (broker_agent/remoting.py).
DELAY_LEVELS_DEFAULT = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DELAY_LEVELS_MAX = 64
_DELAY_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's messageDelayLevel text ("1s 5s 10s 30s 1m ... 2h": a number and a unit,
    ms, s, m, h or d, per level) as milliseconds per level; InvalidArgument when malformed."""
    levels = []
    for word in text.split():
        number = word.rstrip("smhd")
        unit = word[len(number) :]
        if unit not in _DELAY_UNITS_MS or not number.isdigit() or int(number) == 0:
            raise InvalidArgument(
                f"delay level {word!r} is not a positive whole number with a unit (ms, s, m, h or d)"
            )
        levels.append(int(number) * _DELAY_UNITS_MS[unit])
    if not 1 <= len(levels) <= DELAY_LEVELS_MAX:
        raise InvalidArgument(
            f"message delay levels must be 1 to {DELAY_LEVELS_MAX} levels, not {len(levels)}"
        )
    if max(levels) > 7 * _DELAY_UNITS_MS["d"]:
        raise InvalidArgument("a message delay level must be at most 7d")
    return tuple(levels)


@dataclass
class BrokerConfig:
    cluster: str
    broker_name: str
    listen: str
    controllers: list[str]
    data_dir: Path
    election_priority: int = 0
    all_ack_in_sync_state_set: bool = True
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    ha_max_time_slave_not_catchup_ms: int = 15_000
    send_timeout_ms: int = 3000
    fetch_max_bytes: int = 4 << 20
    fetch_wait_ms: int = 100
    ha_stream: bool = True  # a master offers, a slave uses the HA stream (ha_stream.py)
    ha_stream_port: int = 0  # the HA stream's port on the listen host; 0 = one the kernel picks
    call_stream: bool = True  # offer our clients the call stream (mqmeta/call_stream.py)
    segment_bytes: int = 64 << 20
    fsync: bool = True
    tiered_url: str = ""  # empty = no tiered storage
    tiered_upload_bytes: int = 4 << 20
    tiered_upload_interval_ms: int = 2000
    local_retention_bytes: int = 0
    scrub_bytes_per_s: int = SCRUB_BYTES_PER_S_DEFAULT  # the background scrub's bound (P16)
    message_delay_levels_ms: tuple[int, ...] = parse_delay_levels(DELAY_LEVELS_DEFAULT)
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not 1 <= self.in_sync_replicas <= 16 or not 1 <= self.min_in_sync_replicas <= 16:
            raise InvalidArgument("in_sync_replicas and min_in_sync_replicas must be 1 to 16")
        if self.send_timeout_ms < 100 or self.fetch_wait_ms < 1:
            raise InvalidArgument("send_timeout_ms must be >= 100 and fetch_wait_ms >= 1")
        if self.ha_max_time_slave_not_catchup_ms < 100:
            raise InvalidArgument("ha_max_time_slave_not_catchup_ms must be >= 100")
        if not 0 <= self.ha_stream_port <= 65535:
            raise InvalidArgument("ha_stream_port must be 0 (one the kernel picks) to 65535")
        if self.ha_stream_port and not self.ha_stream:
            raise InvalidArgument(
                "--ha-stream-port names a port for the HA stream that --no-ha-stream turns off"
            )
        if not 1 <= self.scrub_bytes_per_s <= 1 << 40:
            raise InvalidArgument("scrub_bytes_per_s must be 1 to 2^40")


class Identity:
    """The broker id applied by compare-and-set, persisted crash-safely.

    A fresh broker writes a temporary identity holding a new check code first, then
    asks the controller for an id with that check code (idempotent for the same code),
    then writes the final identity. A crash anywhere in between reuses the check code.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "identity.json"
        self.tmp_path = data_dir / "identity.tmp.json"

    def load(self) -> dict[str, Any]:
        if self.path.exists():
            return json.loads(self.path.read_text())
        if self.tmp_path.exists():
            return json.loads(self.tmp_path.read_text())
        pending = {"check_code": uuid.uuid4().hex, "broker_id": 0}
        write_json_atomically(self.tmp_path, pending)
        return pending

    def save(self, identity: dict[str, Any]) -> None:
        write_json_atomically(self.path, identity)
        self.tmp_path.unlink(missing_ok=True)

    def check_belongs(self, cluster: str, broker_name: str) -> None:
        """A data dir knows its broker (identity.json, from its first registration): started
        as a broker of another cluster or broker set, it is refused at once (InvalidArgument:
        one sentence, exit 2). Registered there it would be refused its broker id forever,
        or, under a free id, join a broker set whose data it does not hold."""
        if not self.path.exists():
            return
        try:
            identity = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            raise InvalidArgument(f"cannot read {self.path}: {error}") from None
        recorded = (identity.get("cluster", cluster), identity.get("broker_name", broker_name))
        if recorded != (cluster, broker_name):
            raise InvalidArgument(
                f"{self.path.parent} holds broker {identity.get('broker_id')} of cluster {recorded[0]}, "
                f"broker set {recorded[1]} (its identity.json), not of cluster {cluster}, broker set "
                f"{broker_name}: give its --cluster and --broker-name, or another --data-dir"
            )


class BrokerAgent:
    """The shell around the pure core (core.py): threads, the lock, the store, the
    controller client and the confirm log. It turns what happens (a controller reply, a
    slave's fetch, an append) into core events and carries out the effects the core
    returns, in the core's order (`_carry_out`). Replication and the tiered uploader
    see it only as a seams.BrokerHost."""

    def __init__(self, config: BrokerConfig) -> None:
        config.validate()
        make_directories(config.data_dir)
        Identity(config.data_dir).check_belongs(config.cluster, config.broker_name)
        self.config = config
        self.store = MessageStore(
            config.data_dir / "store",
            segment_bytes=config.segment_bytes,
            fsync=config.fsync,
            broker_name=config.broker_name,
            group_commit=True,  # wait_acknowledged syncs: one fdatasync for all writers waiting
            cut_corruption=True,  # a corrupt record: cut there, fetch the rest again (scrub.py)
        )
        self.scrub_stats = ScrubStats()
        self._scrubber = Scrubber(self, config.scrub_bytes_per_s, self.scrub_stats)
        if self.store.log.corruption_cut_at is not None:
            self.scrub_stats.corruptions_found += 1
            self.scrub_stats.repairs += 1
            self._scrubber.must_hand_off = True
        self.controller = ControllerClient(config.controllers, timeout_s=CONTROLLER_CALL_TIMEOUT_S)
        self.identity = Identity(config.data_dir)
        self.confirm_log = ConfirmLog(config.data_dir / "confirm.log", config.broker_name)
        self.core = BrokerCore(
            config.broker_name,
            AckPolicy(config.all_ack_in_sync_state_set, config.in_sync_replicas, config.min_in_sync_replicas),
            max_not_catchup_ms=config.ha_max_time_slave_not_catchup_ms,
        )
        self._mutex = threading.RLock()
        self.lock = threading.Condition(self._mutex)  # guards the core; role-dependent store writes hold it
        # Writers waiting in wait_acknowledged, each on its own condition of the same lock
        # (-> the end offset it waits for): woken only when their outcome may have changed,
        # not by every append and every other writer's acknowledgement.
        self._writers: dict[threading.Condition, _Writer] = {}
        # On a thread serving a slave's fetch: the answers of the writes it acknowledged, for
        # it to send once it lets go of the lock, then wake their writers (_answer_acknowledged)
        self._answering = threading.local()
        self._registered_once = False  # RegisterBrokerRequest.new_process until a registration is answered
        self._writers_seen: tuple[Role, int, int] | None = None  # role, epoch, confirm last woken for
        # Slaves' fetches long-polling for data (ha_fetch.serve_fetch), each on its own
        # condition of the same lock: woken when the log grows or the role or epoch changes,
        # not by every acknowledgement and every sync (two wake-ups of each fetch per send).
        self._fetchers: set[threading.Condition] = set()
        self._fetchers_seen: tuple[Role, int, int] | None = None  # role, epoch, log end last woken for
        # Fetches over the HA stream with nothing to send yet (ha_fetch.ParkedFetch): the
        # append answers them from its own thread; a new role or epoch wakes their threads.
        self._parked: set[ha_fetch.ParkedFetch] = set()
        self.stopping = threading.Event()
        self.heartbeat_interval_ms = BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT  # until the controller's is read
        self.tiered: TieredUploader | None = None
        self._refresh_needed = threading.Event()
        self._refresh_retry_at = 0.0  # a failed refresh is asked again from then on
        self._wake = threading.Event()  # the controller loop has something to do now
        self._report: ReportMasterUnreachable | None = None  # for the controller loop to send
        self._threads: list[threading.Thread] = []
        self._fetch = FetchSettings(
            config.fetch_max_bytes, config.fetch_wait_ms, config.tiered_url, stream=config.ha_stream
        )
        self._stream_server: StreamServer | None = None
        self._sends = PlainWrites(
            self._send_together,
            SENDS_IN_FLIGHT_MAX,
            SEND_BATCH_MAX,
            SENDS_TOGETHER_BODY_BYTES_MAX,
            config.send_timeout_ms / 1000,
        )
        # How each slave's last fetch came (True: the HA stream), for its HA status.
        self.fetch_transports: dict[int, bool] = {}
        # Told of each fetch served over the HA stream (seconds, data bytes): the metrics.
        self.fetch_served: Callable[[float, int], None] | None = None

    # The host replication and the uploader see (seams.BrokerHost) ---------------------------
    @property
    def cluster(self) -> str:
        return self.config.cluster

    @property
    def broker_name(self) -> str:
        return self.config.broker_name

    def view(self) -> RoleView:
        with self.lock:
            return self.core.view()

    def feed(self, event: Event) -> list[Effect]:
        with self.lock:
            effects = self.core.handle(event)
            self._carry_out(effects)
            return effects

    @property
    def ha_stream_port(self) -> int:
        """The port of this broker's HA stream, offered to its slaves; 0 when it has none."""
        return self._stream_server.port if self._stream_server is not None else 0

    def _serve_streamed(
        self, request: bpb.HaFetchRequest, link: ha_stream.Link
    ) -> bpb.HaFetchResponse | ha_fetch.ParkedFetch:
        """A fetch that came over the HA stream: the HaFetch call's checks, then serve_fetch
        (which parks it when there is nothing to send yet)."""
        if request.broker_name != self.config.broker_name:
            raise NotFound(f"this broker serves {self.config.broker_name}, not {request.broker_name}")
        started = time.perf_counter()
        reply = self._answering_acknowledged(partial(ha_fetch.serve_fetch, self, request, link))
        self.fetch_transports[request.broker_id] = True  # after serve_fetch: a replica of this set
        if self.fetch_served is not None and isinstance(reply, bpb.HaFetchResponse):
            self.fetch_served(time.perf_counter() - started, len(reply.data))
        return reply

    def park(self, parked: ha_fetch.ParkedFetch) -> None:
        """With the lock held: holds a streamed fetch until an append answers it."""
        self._parked.add(parked)

    def unpark(self, parked: ha_fetch.ParkedFetch) -> bool:
        """With the lock held: takes `parked` back; whether it was still parked (its answer
        is then the caller's to send)."""
        if parked not in self._parked:
            return False
        self._parked.remove(parked)
        return True

    def serves(self, master_epoch: int) -> bool:
        """With the lock held: would a fetch of a slave following `master_epoch` be answered?"""
        return self.core.serves_fetch(master_epoch)

    def _answer_parked(self) -> list[tuple[ha_fetch.ParkedFetch, bpb.HaFetchResponse]]:
        """With the lock held, right after an append: the answers to the parked fetches the
        log has grown for (unparked), for this (the appending) thread to push (_push), so
        the slaves have the bytes without a hand-off to their connections' threads. Fetches
        alike (the same offset, size limit, handshake and epoch) get the same answer, one
        read for all.

        While other writers wait for their acknowledgements (concurrent producers), the
        connections' threads are woken instead: by the time one runs, it answers with those
        writers' appends too, one replication round for several sends, where a push would
        carry this one alone."""
        if self._writers:
            for parked in self._parked:
                if not parked.woken:
                    parked.woken = True
                    parked.link.wake()
            return []
        answers = []
        built: dict[tuple[int, int, bool, int], bpb.HaFetchResponse | None] = {}
        for parked in list(self._parked):
            request = parked.request
            key = (request.fetch_offset, parked.max_bytes, request.handshake, request.master_epoch)
            if key not in built:
                built[key] = ha_fetch.answer_parked(self, parked)
            elif built[key] is not None:  # the same fetch as one answered above: the same answer
                self.unpark(parked)
            if (answer := built[key]) is not None:
                answers.append((parked, answer))
        return answers

    @staticmethod
    def _push(answers: list[tuple[ha_fetch.ParkedFetch, bpb.HaFetchResponse]]) -> None:
        """Sends the answers (_answer_parked) without blocking (Link.push): one frame for the
        fetches answered alike, every frame built before the first is sent."""
        frames: dict[int, bytes] = {}  # by the answer's identity: the answers alike are one object
        for _, answer in answers:
            if id(answer) not in frames:
                frames[id(answer)] = ha_stream.response_frame(answer)
        for parked, answer in answers:
            parked.link.push(frames[id(answer)])

    def request_refresh(self) -> None:
        self._refresh_needed.set()
        self._wake.set()

    def call_controller(self, method: str, request: Any) -> Any:
        return self.controller.call(method, request)

    # Carrying out effects (with the lock held) ---------------------------------------------
    def _carry_out(self, effects: list[Effect]) -> None:
        """Persist, then note, then send, then start, then wake; a refusal is raised last.
        A ProposeSyncStateSet is sent by the controller loop once it has let go of the
        lock (the call blocks), and an AnswerFetch is the caller's to send. A disk that
        fails a persist step (not a full one) ends this broker (_disk_failed)."""
        try:
            self._carry_out_in_order(effects)
        except OSError as error:
            raise self._disk_error(error) from None

    def _carry_out_in_order(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case BeginEpoch(epoch=epoch):
                    self._begin_epoch(epoch)
                case Truncate(offset=offset, master_epoch=epoch):
                    log.warning(
                        "truncating from %d to the consistent point %d (master epoch %d)",
                        self.store.max_offset,
                        offset,
                        epoch,
                    )
                    self.store.truncate(offset)
                case AppendReplicated(offset=offset, data=data):
                    # Epoch entries follow from the records. Not yet durable: the fetch loop
                    # syncs (sync_replicated) right before its next fetch acknowledges them.
                    self.store.append_replicated(offset, data, sync=False)
                case NoteConfirm():
                    self._note_confirm(effect)
                case RequestRefresh():
                    self._refresh_needed.set()
                    self._wake.set()
                case ReportMasterUnreachable():
                    self._report = effect
                    self._wake.set()
                case StartFetching():
                    self._start_fetching(effect)
                case LeaseRevoked(master_broker_id=master, master_epoch=epoch):
                    log.warning(
                        "the controller names broker %d master at epoch %d: refusing writes", master, epoch
                    )
                case WakeWaiters():
                    self.lock.notify_all()
                    self._wake_writers()
                    self._wake_fetchers()
                case Refuse(error=error):
                    raise error
                case StopFetching() | ProposeSyncStateSet() | AnswerFetch() | ElectSuccessor():
                    pass  # a fetcher ends on its own; the others are sent by their callers

    def _wake_writers(self) -> None:
        """Wakes the writers whose write_outcome may have changed. With acks from the whole
        SyncStateSet it depends only on the role, the master epoch and the confirm offset:
        a new role or epoch wakes them all, a higher confirm offset those it covers. With
        acks from in_sync_replicas copies it also depends on each slave's ack: all wake."""
        core = self.core
        seen = (core.role, core.master_epoch, core.confirm_offset)
        everyone = not self.config.all_ack_in_sync_state_set or (
            self._writers_seen is None or seen[:2] != self._writers_seen[:2]
        )
        if not everyone and seen == self._writers_seen:
            return  # nothing moved (an append): a writer checks its outcome before it waits
        self._writers_seen = seen
        answers = getattr(self._answering, "due", None)
        for condition, writer in self._writers.items():
            if not everyone and writer.end > seen[2]:
                continue
            if (
                answers is not None
                and writer.on_acknowledged is not None
                and core.write_outcome(writer.end, writer.epoch) is WriteOutcome.ACKNOWLEDGED
            ):
                answers.append((writer.on_acknowledged, condition))  # woken once it is sent
                writer.on_acknowledged = None
            else:
                condition.notify()

    def _answering_acknowledged(self, serve: Callable[[], Any]) -> Any:
        """Runs `serve` (a slave's fetch, which may acknowledge writes) on this thread, then
        sends the answers of the writes it acknowledged that have one (a Send on the call
        stream), without the lock, and only then wakes their writers: the producer hears of
        its acknowledgement without a hand-off to its writer's thread first, and that thread
        does not contend for the GIL with this one until the answer is out."""
        due: list[tuple[Callable[[], None], threading.Condition]] = []
        self._answering.due = due
        try:
            return serve()
        finally:
            self._answering.due = None
            if due:
                self._answer_acknowledged(due)

    def _answer_acknowledged(self, due: list[tuple[Callable[[], None], threading.Condition]]) -> None:
        for answer, _ in due:
            try:
                answer()
            except Exception:  # its writer's own answer still goes
                log.exception("an early answer to an acknowledged write failed")
        with self.lock:
            for _, condition in due:
                condition.notify()  # a writer gone meanwhile (its deadline) no longer listens

    def _wake_fetchers(self) -> None:
        """With the lock held: wakes the long-polling fetches when what they wait for may
        have moved (the log end, the role, the epoch); the parked ones (the HA stream's)
        on a new role or epoch only: the append answers them itself (append)."""
        seen = (self.core.role, self.core.master_epoch, self.store.max_offset)
        if seen == self._fetchers_seen:
            return  # a fetch checks the log end before it waits, under this lock
        if self._fetchers_seen is None or seen[:2] != self._fetchers_seen[:2]:
            for parked in self._parked:
                parked.link.wake()
        self._fetchers_seen = seen
        for condition in self._fetchers:
            condition.notify()

    def sync_replicated(self) -> int:
        """With the lock held: makes the replicated appends durable (seams.BrokerHost)."""
        try:
            return self.store.sync_replicated()
        except OSError as error:
            raise self._disk_error(error) from None

    def wait_for_append(self, timeout_s: float) -> None:
        """With the lock held: waits (releasing it) until the log grows, the role or epoch
        changes, or `timeout_s` passes; a fetch with nothing to send waits here."""
        condition = threading.Condition(self._mutex)
        self._fetchers.add(condition)
        try:
            condition.wait(timeout=timeout_s)
        finally:
            self._fetchers.discard(condition)

    def _begin_epoch(self, epoch: int) -> None:
        try:
            self.store.begin_epoch(epoch)
        except BaseException as error:
            # Never write as master without the epoch entry: fence until the next role change.
            self._carry_out(self.core.handle(Fence(f"could not begin epoch {epoch}: {error}")))
            raise
        log.info("master at epoch %d from offset %d", epoch, self.store.max_offset)

    def _note_confirm(self, note: NoteConfirm) -> None:
        """The confirm log's view of this broker (see confirm_log.py)."""
        self.confirm_log.note(
            wall_ms(),
            self.core.broker_id,
            note.role.value,
            note.master_epoch,
            note.confirm_offset,
            self.store.max_offset,
            dict(note.acked),
            note.force,
        )
        if note.force and self.confirm_log.behind:  # e.g. T1's evidence before an upload
            raise OSError(errno.ENOSPC, f"{self.confirm_log.path}: no space for the confirm offset's line")

    # The background scrub's host (scrub.ScrubHost) --------------------------------------
    @property
    def role(self) -> Role:
        return self.core.role

    def scrub_step(self, offset: int, bytes_max: int) -> tuple[int, int | None, int, int]:
        """One scrub step from `offset`: (where the next starts, the first bad record or
        None, the log's start, its end); nothing is read when `offset` is outside the log."""
        start, end = self.store.log.min_offset, self.store.max_offset
        if not start <= offset < end:
            return offset, None, start, end
        next_offset, bad = self.store.scrub(offset, bytes_max)
        return next_offset, bad, start, end

    def repair_from_master(self, offset: int) -> bool:
        """A slave's repair: cut the log at the bad record, fetch the rest again."""
        try:
            with self.lock:
                if self.core.role is not Role.SLAVE:
                    return False
                self.feed(CorruptionFound(offset))
        except MqmetaError as error:
            log.error("could not cut the log at the corrupt record at %d: %s", offset, error)
            return False
        log.warning("cut the log at the corrupt record at %d; fetching the rest from the master", offset)
        return True

    def hand_off_corrupt_master(self) -> bool:
        """A master with a corrupt log hands its role to an in-sync slave (then repairs)."""
        try:
            self.handoff()
        except MqmetaError as error:
            log.error("a master with a corrupt log could not hand off (tried again later): %s", error)
            return False
        return True

    def _start_fetching(self, start: StartFetching) -> None:
        threading.Thread(
            target=ha_fetch.follow, args=(self, start.session, self._fetch), name="fetcher", daemon=True
        ).start()
        log.info(
            "slave of broker %d (%s) at epoch %d",
            start.master_broker_id,
            start.master_address,
            start.master_epoch,
        )

    # A failing disk ----------------------------------------------------------------------
    def _disk_error(self, error: OSError) -> MqmetaError:
        """The error a caller sees for a store write that failed (with the lock held). A full
        disk refuses the write (the commit log undid it: nothing torn, nothing kept) and
        the broker goes on; any other failure ends the broker (_disk_failed)."""
        if error.errno == errno.ENOSPC:
            return ResourceExhausted(
                f"the disk under {self.config.data_dir} is full: the write was refused and nothing "
                "of it kept; retry once space is freed",
                code=DISK_FULL,
            )
        return self._disk_failed(f"a store write failed: {error}")

    def _disk_failed(self, reason: str) -> MqmetaError:
        """With the lock held: fenced for good (core.DiskFailed); a master asks the controller
        to elect its in-sync successor at once, then the process exits (EXIT_DISK_FAILED) so
        that its supervisor restarts it on what the disk holds: it then rejoins as a slave,
        cut back to its new master's log. Returns the error for the caller to raise."""
        first = not self.core.disk_failed
        effects = self.core.handle(DiskFailed(reason))
        self._carry_out_in_order([e for e in effects if not isinstance(e, ElectSuccessor)])
        if first:
            log.error("%s: this broker is fenced, asks for another master and exits", reason)
            successor = next((e for e in effects if isinstance(e, ElectSuccessor)), None)
            threading.Thread(target=self._resign_and_exit, args=(successor,), name="disk-failed").start()
        return Unavailable(
            f"the disk of this broker failed ({reason}); it is fenced and restarts: retry on the new master"
        )

    def _resign_and_exit(self, successor: ElectSuccessor | None) -> None:
        if successor is not None:
            request = cpb.ElectMasterRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                trigger=cpb.ELECT_TRIGGER_HANDOFF,
                requester_broker_id=self.core.broker_id,
                preferred_broker_id=successor.successor_broker_id,
                master_epoch=successor.master_epoch,
            )
            try:
                info = self.controller.elect_master(request, timeout_s=HANDOFF_ELECT_TIMEOUT_MS / 1000)
                log.warning("broker %d elected in place of this one", info.master_broker_id)
            except MqmetaError as error:  # the controllers elect anyway once this process is gone
                log.warning("could not hand off to broker %d: %s", successor.successor_broker_id, error)
        message = (
            f"the disk under {self.config.data_dir} failed a write or fsync; this broker stopped "
            "being master and exits: restart it to recover from what its disk holds"
        )
        print(f"mqmeta: error: {message}", file=sys.stderr, flush=True)
        exit_at_once(EXIT_DISK_FAILED)

    # Lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.bind_stream_server()  # first: a taken fixed port ends the start
        if self._stream_server is not None:
            self._stream_server.start()
        if self.config.tiered_url:
            self.tiered = TieredUploader(
                self,
                TieredConfig(
                    self.config.tiered_url,
                    self.config.tiered_upload_bytes,
                    self.config.tiered_upload_interval_ms,
                    self.config.local_retention_bytes,
                ),
            )
            self.tiered.start()
        loops = (
            (self._controller_loop, "controller"),
            (self._watch_loop, "watch"),
            (self._scrubber.run, "scrub"),
        )
        for target, name in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def bind_stream_server(self) -> None:
        """Binds the HA stream's port (ha_stream.py), once; start() serves it. Without it the
        slaves fetch over gRPC calls. A fixed port (--ha-stream-port) that cannot be bound is
        an error: a firewall or a fault proxy was set up for it, and a slave would silently
        fetch over gRPC instead. The CLI binds it before its gRPC server serves."""
        if self._stream_server is not None or not self.config.ha_stream:
            return
        host, port = ha_stream.host_of(self.config.listen), self.config.ha_stream_port
        if not ha_stream.offered():
            if port:
                log.warning("no HA stream on port %d: it is offered only without TLS and auth", port)
            return
        try:
            server = StreamServer(host, self._serve_streamed, port)
        except OSError as error:
            if port:
                raise InvalidArgument(
                    f"cannot listen on {ha_stream.stream_address(self.config.listen, port)} for the HA "
                    f"stream (--ha-stream-port): {os.strerror(error.errno) if error.errno else error}"
                ) from None
            log.warning("no HA stream on %s (%s): slaves fetch over gRPC calls", self.config.listen, error)
            return
        self._stream_server = server

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        self.feed(Stop())
        for thread in self._threads:
            thread.join(timeout=3)
        if self._stream_server is not None:
            self._stream_server.stop()
        self.controller.close()
        with self.lock:
            self.confirm_log.close()
        self.store.close()

    # Controller interaction --------------------------------------------------------------
    def _register(self) -> cpb.ReplicaInfo:
        identity = self.identity.load()
        reply = self.controller.register_broker(
            cpb.RegisterBrokerRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                broker_id=identity.get("broker_id", 0),
                check_code=identity["check_code"],
                address=self.config.listen,
                election_priority=self.config.election_priority,
                new_process=not self._registered_once,
            ),
        )
        self._registered_once = True  # a restarted master's new epoch, once per process
        if identity.get("broker_id") != reply.broker_id or "cluster" not in identity:
            identity = dict(
                identity,
                broker_id=reply.broker_id,
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
            )
            self.identity.save(identity)
        elif not self.identity.path.exists():
            self.identity.save(identity)
        config = self.controller.get_config(cpb.GetConfigRequest()).values
        self.heartbeat_interval_ms = int(
            config.get("broker_heartbeat_interval_ms", BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT)
        )
        with self.lock:  # the watch thread applies events once the core has an id: none older
            self.feed(Registered(reply.broker_id, int(config.get("lease_ms", LEASE_MS_DEFAULT))))
            self.feed(self._replica_info_event(reply.replica_info))  # than this, which would re-adopt
        log.info(
            "registered %s/%s as broker %d", self.config.cluster, self.config.broker_name, reply.broker_id
        )
        return reply.replica_info

    def _controller_loop(self) -> None:
        registered = False
        next_heartbeat = 0.0
        while not self.stopping.is_set():
            try:
                if not registered:
                    first = self._register()
                    registered = True
                    self._adopt(first)
                if self._refresh_needed.is_set() and time.monotonic() >= self._refresh_retry_at:
                    self._refresh_needed.clear()
                    self._adopt()
                self._send_report()
                if time.monotonic() >= next_heartbeat:
                    next_heartbeat = time.monotonic() + self.heartbeat_interval_ms / 1000
                    self._heartbeat()
                self._manage_sync_state_set()
                with self.lock:
                    try:
                        self.confirm_log.flush_due(wall_ms())
                    except OSError as error:
                        raise self._disk_error(error) from None
            except NotFound:
                registered = False  # cleaned from the metadata: register again
            except MqmetaError as exc:
                if exc.code == BROKER_ID_INVALID and not registered:
                    self._refused(exc)
                log.info("controller: %s", exc)
            self._wake.wait(min(0.05, self.heartbeat_interval_ms / 4000))
            self._wake.clear()

    def _adopt(self, info: cpb.ReplicaInfo | None = None) -> None:
        """Adopts `info` (read from the controller when None), electing a master when the set has none.
        A failure asks for the same again one heartbeat interval later: the controller may
        refuse an election it cannot hold yet (a broker that registered under load is not
        alive by the leader's liveness until its first heartbeat arrives), and nothing else
        would ask again while the set has no master (the heartbeat replies match this
        broker's view, so they never call for a refresh)."""
        try:
            self._apply_or_elect(info if info is not None else self._replica_info())
        except MqmetaError:
            self._refresh_retry_at = time.monotonic() + self.heartbeat_interval_ms / 1000
            self._refresh_needed.set()
            raise

    def _refused(self, error: MqmetaError) -> None:
        """The controllers hold this data dir's broker id for another broker (its check code
        differs): a data dir of another cluster whose name is the same. No retry can change
        that; the process ends with one sentence (exit 2) rather than retrying forever."""
        message = f"the controllers refuse the broker in {self.config.data_dir}: {error.message}"
        log.error("%s", message)
        print(f"mqmeta: error: {message}", file=sys.stderr, flush=True)
        exit_at_once(EXIT_BAD_INPUT)

    def _send_report(self) -> None:
        """A slave's fetch found its master unreachable: ask the controller to elect. It
        elects only if the master is dead by its rules (silent for dead-after, or its port
        refusing connections); otherwise it answers the current replica info."""
        report, self._report = self._report, None
        if report is None:
            return
        info = self.controller.elect_master(
            cpb.ElectMasterRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                trigger=cpb.ELECT_TRIGGER_BROKER,
                requester_broker_id=self.core.broker_id,
                master_unreachable=True,
            ),
        )
        self.apply_replica_info(info)

    def _replica_info(self) -> cpb.ReplicaInfo:
        return self.controller.get_replica_info(
            cpb.BrokerSetRef(cluster=self.config.cluster, broker_name=self.config.broker_name),
        )

    def _apply_or_elect(self, info: cpb.ReplicaInfo) -> None:
        if info.master_broker_id == 0:
            info = self.controller.elect_master(
                cpb.ElectMasterRequest(
                    cluster=self.config.cluster,
                    broker_name=self.config.broker_name,
                    trigger=cpb.ELECT_TRIGGER_BROKER,
                    requester_broker_id=self.core.broker_id,
                ),
            )
        self.apply_replica_info(info)

    def _heartbeat(self) -> None:
        sent_ms = now_ms()
        with self.lock:
            stalled = self.core.disk_stalled(sent_ms)
        if stalled:  # its lease runs out and the controller elects another (core.SyncStarting)
            log.warning("the disk has not finished an fdatasync within the lease: no heartbeat")
            return
        view = self.view()
        reply = self.controller.heartbeat(
            cpb.HeartbeatRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                broker_id=view.broker_id,
                epoch=self.store.epochs.last_epoch or view.master_epoch,
                max_offset=self.store.max_offset,
                confirm_offset=view.confirm_offset,
                election_priority=self.config.election_priority,
            ),
        )
        self.feed(
            HeartbeatAnswered(
                sent_ms,
                reply.master_broker_id,
                reply.master_epoch,
                reply.sync_state_set_epoch,
                reply.lease_ms,
            )
        )

    def _watch_loop(self) -> None:
        while not self.stopping.is_set():
            stream = None
            try:
                # keepalive: a master learns of new replicas (and so grows its SyncStateSet)
                # from this stream; one cut silently must end, not wait forever
                stream = self.controller.watch(
                    self.config.cluster,
                    self.config.broker_name,
                    keepalive_ms=(WATCH_KEEPALIVE_MS, WATCH_KEEPALIVE_TIMEOUT_MS),
                )
                for event in stream:
                    if self.stopping.is_set():
                        break
                    if event.HasField("replica_info") and self.core.broker_id:
                        self.apply_replica_info(event.replica_info)
            except Exception as exc:  # grpc errors, and whatever else a broken stream throws
                log.debug("watch stream ended: %s", exc)
            finally:
                if stream is not None:
                    stream.cancel()
            self.stopping.wait(0.5)

    # Roles ---------------------------------------------------------------------------------
    def _replica_info_event(self, info: cpb.ReplicaInfo) -> ReplicaInfo:
        """With the lock held (the log view must not move before the core sees it)."""
        return ReplicaInfo(
            now_ms(),
            info.master_broker_id,
            info.master_address,
            info.master_epoch,
            tuple(info.sync_state_set),
            info.sync_state_set_epoch,
            frozenset(r.broker_id for r in info.replicas),
            log_view(self.store),
        )

    def apply_replica_info(self, info: cpb.ReplicaInfo) -> None:
        """Adopts what the controller decided; stale epochs are ignored (by the core)."""
        with self.lock:
            self.feed(self._replica_info_event(info))

    def _manage_sync_state_set(self) -> None:
        if not self.store.log_closed and not self.core.disk_failed:
            self._sync_written()
        with self.lock:
            effects = self.feed(Tick(now_ms(), log_view(self.store)))
        for effect in effects:
            if isinstance(effect, ProposeSyncStateSet):
                self._propose(effect)

    def _propose(self, proposal: ProposeSyncStateSet) -> None:
        request = cpb.AlterSyncStateSetRequest(
            cluster=self.config.cluster,
            broker_name=self.config.broker_name,
            master_broker_id=proposal.master_broker_id,
            master_epoch=proposal.master_epoch,
            sync_state_set_epoch=proposal.sync_state_set_epoch,
            new_sync_state_set=list(proposal.new_sync_state_set),
        )
        try:
            info = self.controller.alter_sync_state_set(request)
        except MqmetaError as exc:
            # Unless refused outright it may still commit: the core keeps counting the union
            # and sends the same proposal again until its outcome is definitive.
            outcome = ProposalOutcome.of_code(exc.code)
            log.info(
                "SyncStateSet change %s not confirmed (%s): %s",
                list(proposal.new_sync_state_set),
                outcome.value,
                exc,
            )
            self.feed(SyncStateSetFailed(now_ms(), outcome))
            return
        log.info("SyncStateSet %s -> %s", list(request.new_sync_state_set), list(info.sync_state_set))
        with self.lock:
            self.feed(SyncStateSetChanged(self._replica_info_event(info)))

    # Graceful departure ---------------------------------------------------------------------
    def handoff(self, preferred_broker_id: int = 0, then_leave: bool = False) -> tuple[RoleView, int]:
        """Hands the master role to an in-sync slave: refuses new writes at once, waits
        until the successor holds everything (the writes in flight acknowledged), has the
        controller elect it, and stays as a slave (leaving at once with `then_leave`).
        Returns the role it ends in and how long writes were refused (ms). With no
        in-sync slave, FailedPrecondition is raised before anything was asked and writes
        resume at once; a failed election call is raised too (see core.HandoffFailed)."""
        started = now_ms()
        self.feed(HandoffStart(started, started + HANDOFF_DRAIN_TIMEOUT_MS, preferred_broker_id, then_leave))
        elect = self._drain_for_handoff(started + HANDOFF_DRAIN_TIMEOUT_MS + HANDOFF_ELECT_TIMEOUT_MS)
        if elect is not None:
            self._elect_successor(elect)
        unavailable_ms = now_ms() - started
        view = self.view()
        log.info(
            "handed off to broker %d at epoch %d; writes refused for %d ms",
            view.master_broker_id,
            view.master_epoch,
            unavailable_ms,
        )
        return view, unavailable_ms

    def _drain_for_handoff(self, deadline_ms: int) -> ElectSuccessor | None:
        """Waits (woken by every ack) until the core names the successor to elect (returned),
        or, when another caller's handoff is under way, until this broker is no longer the
        master (None). The core gives up by itself at the handoff's deadline (raised here)."""
        with self.lock:
            while now_ms() < deadline_ms:
                for effect in self.feed(HandoffTick(now_ms(), log_view(self.store))):
                    if isinstance(effect, ElectSuccessor):
                        return effect
                if self.core.role is not Role.MASTER:
                    return None
                if self.core.departure is not Departure.HANDING_OFF:
                    raise FailedPrecondition("the handoff was given up before a successor was elected")
                self.lock.wait(timeout=HANDOFF_POLL_INTERVAL_S)
        raise Unavailable("the handoff under way did not finish in time; it may still complete")

    def _elect_successor(self, elect: ElectSuccessor) -> None:
        """One call (the client retries unreachable nodes): on success the successor's
        replica info makes this broker a slave at once. On any failure writes stay
        refused for the core's grace (the election may commit late) and it is raised."""
        request = cpb.ElectMasterRequest(
            cluster=self.config.cluster,
            broker_name=self.config.broker_name,
            trigger=cpb.ELECT_TRIGGER_HANDOFF,
            requester_broker_id=self.core.broker_id,
            preferred_broker_id=elect.successor_broker_id,
            master_epoch=elect.master_epoch,
        )
        try:
            info = self.controller.elect_master(request, timeout_s=HANDOFF_ELECT_TIMEOUT_MS / 1000)
        except MqmetaError as error:
            self.feed(HandoffFailed(now_ms(), str(error)))
            log.warning("handoff to broker %d failed: %s", elect.successor_broker_id, error)
            raise
        self.apply_replica_info(info)

    def depart(self, timeout_ms: int = LEAVE_TIMEOUT_MS) -> None:
        """Before shutting down (SIGTERM): a master hands off to an in-sync slave; a slave
        (the old master too, after its handoff) leaves the SyncStateSet and waits, bounded,
        until the controller shows it out, so that no acknowledgement waits for a replica
        that is gone. Failures are logged: the broker stops anyway, and the controller's
        failover takes over."""
        view = self.view()
        if view.role is Role.MASTER:
            try:
                self.handoff(then_leave=True)
            except MqmetaError as error:
                log.warning("handoff before stopping failed (%s); stopping as master", error)
                return
        try:
            self.feed(Leave())
        except MqmetaError as error:
            log.warning("cannot leave the SyncStateSet: %s", error)
            return
        deadline = time.monotonic() + timeout_ms / 1000
        next_refresh = 0.0
        with self.lock:
            while self.core.broker_id in self.core.sync_state_set and time.monotonic() < deadline:
                if time.monotonic() >= next_refresh:  # the watch stream may be down
                    next_refresh = time.monotonic() + LEAVE_REFRESH_INTERVAL_S
                    self.request_refresh()
                self.lock.wait(timeout=0.05)
            if self.core.broker_id in self.core.sync_state_set:
                log.warning("still in the SyncStateSet %s after %d ms", self.core.sync_state_set, timeout_ms)

    # Data plane ------------------------------------------------------------------------------
    def writable(self, now: int | None = None) -> bool:
        with self.lock:
            return self.core.writable(now or now_ms())

    def send(
        self, messages: Sequence[MessageFields], on_acknowledged: Acknowledged | None = None
    ) -> tuple[list[Any], int]:
        """Appends `messages` and waits for the ack policy: (their results, the epoch).
        Concurrent sends are written together (rmq_writes.PlainWrites: one append, one
        group commit, one replication round, one wait for several producers' sends);
        replicated copies, which must keep their origin's order, are written alone.
        `on_acknowledged(results, epoch)`, when given, may be called first, by the thread
        on which the last acknowledgement arrived (without the lock): the caller's answer,
        sent from there (call_stream.EarlyAnswer); it must not block."""
        if not 1 <= len(messages) <= SEND_BATCH_MAX:
            raise InvalidArgument(f"a send carries 1 to {SEND_BATCH_MAX} messages")
        if any(m.properties and not _ORIGIN_PROPERTIES.isdisjoint(m.properties) for m in messages):
            return self._send_alone(messages, on_acknowledged)
        try:
            told = None if on_acknowledged is None else partial(_told_apart, on_acknowledged)
            placed = self._sends.write(messages, told)
        except NotMaster:
            raise  # every message's outcome alike; after the append (deposed) it is unknown
        except (InvalidArgument, FailedPrecondition):
            # Refused before anything was written, maybe for another producer's messages
            # written with these: alone, this send gets its own outcome.
            return self._send_alone(messages, on_acknowledged)
        return [result for result, _ in placed], placed[0][1]

    def _send_alone(
        self, messages: Sequence[MessageFields], on_acknowledged: Acknowledged | None = None
    ) -> tuple[list[Any], int]:
        return self._write(lambda epoch: self.store.put_messages(messages, epoch, wall_ms()), on_acknowledged)

    def _send_together(
        self, messages: list[Any], on_acknowledged: Callable[[list[Any]], None] | None = None
    ) -> list[tuple[Any, int]]:
        """The write of a PlainWrites batch: each message's result with the epoch."""
        told = None if on_acknowledged is None else partial(_told_together, on_acknowledged)
        results, epoch = self._send_alone(messages, told)
        return [(result, epoch) for result in results]

    def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Consumer offsets are commit-log records: they replicate and fail over with the data."""
        self._write(
            lambda epoch: self.store.commit_consumer_offset(group, topic, queue_id, offset, epoch, wall_ms())
        )

    def commit_consumer_progress(self, entries: list[tuple[str, str, int, int, tuple]]) -> None:
        """Several groups' progress (consumed offset and acknowledged ranges above it) in one
        replicated write; see MessageStore.commit_consumer_progress."""
        self._write(lambda epoch: self.store.commit_consumer_progress(entries, epoch, wall_ms()))

    def _write(
        self, put: Callable[[int], Any], on_acknowledged: Acknowledged | None = None
    ) -> tuple[Any, int]:
        """Appends as master, then waits for the ack policy; the only write path."""
        results, end, epoch = self.append(put)
        self.wait_acknowledged(
            end, epoch, None if on_acknowledged is None else partial(on_acknowledged, results, epoch)
        )
        return results, epoch

    def append(self, put: Callable[[int], Any]) -> tuple[Any, int, int]:
        """The first half of a write: appends as master and returns (results, end offset,
        epoch) for wait_acknowledged. A caller that must order its writes (the RocketMQ 5
        service writing a group's progress) appends under its own lock and waits outside it."""
        with self.lock:
            self.core.check_writable(now_ms())
            epoch = self.core.master_epoch
            try:
                results = put(epoch)
            except OSError as error:
                raise self._disk_error(error) from None
            end = self.store.max_offset
            answers: list[tuple[ha_fetch.ParkedFetch, bpb.HaFetchResponse]] = []
            early = True
            try:
                answers = self._answer_parked() if self._parked else []
                # Small answers leave now, before this broker's bookkeeping of the append
                # (their confirm offset is the one before Appended: at most one answer
                # behind); larger ones are framed and sent once the lock is let go (their
                # CRC and copy would hold it), as every answer was before.
                early = sum(len(a.data) for _, a in answers) <= PUSH_UNDER_LOCK_BYTES
                if answers and early:
                    self._push(answers)
            finally:
                view = log_view(self.store)
                self.feed(Appended(view))  # also wakes the slaves' long-polling fetches (over gRPC)
            now = now_ms()
            for parked, _ in answers:
                self.feed(FetchAnswered(now, parked.request.broker_id, view))
        if answers and not early:
            self._push(answers)
        if answers and self.fetch_served is not None:
            for parked, answer in answers:
                self.fetch_served(time.perf_counter() - parked.started, len(answer.data))
        return results, end, epoch

    def _sync_written(self, end: int | None = None) -> None:
        """The group commit (MessageStore.sync), outside the agent lock, then the core
        hears how far the log is durable. Every writer calls it before it waits; the
        controller loop also calls it, so bytes whose writer went away are synced too."""
        if self.store.durable_offset < (self.store.max_offset if end is None else end):
            self.feed(SyncStarting(now_ms()))
            try:
                self.store.sync(end)
            except OSError as error:  # the commit log closed itself: never master again here
                with self.lock:
                    raise self._disk_failed(f"fdatasync of the commit log failed: {error}") from None
            with self.lock:
                self.feed(Synced(log_view(self.store)))

    def wait_acknowledged(
        self, end: int, epoch: int, on_acknowledged: Callable[[], None] | None = None
    ) -> None:
        """Blocks until the ack policy holds for everything before `end`: first the
        group commit makes this broker's own bytes durable (outside the agent lock, so
        appends and fetches go on; one fdatasync covers every writer waiting), then the
        SyncStateSet's acks. `on_acknowledged` may be called, once, by the thread on which
        the last acknowledgement arrives, before this returns (_answering_acknowledged)."""
        deadline = time.monotonic() + self.config.send_timeout_ms / 1000
        self._sync_written(end)
        self._await_acks(_Writer(end, epoch, on_acknowledged), deadline)

    def _await_acks(self, writer: _Writer, deadline: float) -> None:
        with self.lock:
            condition = threading.Condition(self._mutex)  # woken by _wake_writers
            self._writers[condition] = writer
            try:
                while True:
                    outcome = self.core.write_outcome(writer.end, writer.epoch)
                    if outcome is WriteOutcome.ACKNOWLEDGED:
                        return
                    if outcome is WriteOutcome.DEPOSED:
                        raise NotMaster(
                            "this broker stopped being the master before the write "
                            "was replicated; its outcome is unknown",
                            leader=self.core.master_address,
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeadlineExceeded(
                            "the SyncStateSet did not acknowledge the write in time; its outcome is unknown",
                            code="FLUSH_SLAVE_TIMEOUT",
                        )
                    condition.wait(timeout=min(remaining, ACK_POLL_INTERVAL_S))
            finally:
                del self._writers[condition]

    def require_master(self) -> None:
        with self.lock:
            self.core.check_master()
