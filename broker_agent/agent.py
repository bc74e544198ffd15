"""The broker agent: obeys the controller, owns the store, replicates master -> slaves.

Threads and what each owns:
- controller loop: registration, heartbeats (lease), role refresh, elections it
  triggers, SyncStateSet changes it proposes as master;
- watch loop: role / SyncStateSet changes pushed by the controller;
- fetcher (slave only): long-polls the master (replication.py);
- gRPC workers: the data plane (service.py) and the master side of replication.
All role state lives under one lock; waiting sends and fetches wait on conditions of it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_agent.confirm_log import ConfirmLog
from broker_agent.ha import Lease, Role, SyncStateTracker, confirm_offset
from broker_agent.store import MessageStore
from mqmeta.client import ControllerClient
from mqmeta.clock import now_ms, wall_ms
from mqmeta.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MqmetaError,
    NotFound,
    NotMaster,
)
from mqmeta.formats.atomic import write_json_atomically
from mqmeta.formats.records import Message
from mqmeta.pb import controller_pb2 as cpb

log = logging.getLogger(__name__)

SEND_BATCH_MAX = 1024
PENDING_GRACE_MS = 7000  # longer than the controller's proposal timeout (5 s)
CONTROLLER_CALL_TIMEOUT_S = 1.0


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
    segment_bytes: int = 64 << 20
    fsync: bool = True
    tiered_url: str = ""  # empty = no tiered storage
    tiered_upload_bytes: int = 4 << 20
    tiered_upload_interval_ms: int = 2000
    local_retention_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not 1 <= self.in_sync_replicas <= 16 or not 1 <= self.min_in_sync_replicas <= 16:
            raise InvalidArgument("in_sync_replicas and min_in_sync_replicas must be 1 to 16")
        if self.send_timeout_ms < 100 or self.fetch_wait_ms < 1:
            raise InvalidArgument("send_timeout_ms must be >= 100 and fetch_wait_ms >= 1")
        if self.ha_max_time_slave_not_catchup_ms < 100:
            raise InvalidArgument("ha_max_time_slave_not_catchup_ms must be >= 100")


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


class BrokerAgent:
    def __init__(self, config: BrokerConfig) -> None:
        config.validate()
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.store = MessageStore(
            config.data_dir / "store",
            segment_bytes=config.segment_bytes,
            fsync=config.fsync,
            broker_name=config.broker_name,
        )
        self.controller = ControllerClient(config.controllers, timeout_s=CONTROLLER_CALL_TIMEOUT_S)
        self.identity = Identity(config.data_dir)
        self.confirm_log = ConfirmLog(config.data_dir / "confirm.log", config.broker_name)
        self.broker_id = 0
        self.lock = threading.Condition()
        self.role = Role.FENCED
        self.master_epoch = 0
        self.master_broker_id = 0
        self.master_address = ""
        self.sync_state_set: list[int] = []
        self.sync_state_set_epoch = 0
        self.pending_sync_state_set: list[int] | None = None
        self.pending_base_epoch = 0
        self.pending_failed_ms = 0
        self.registered_ids: set[int] = set()
        self.confirm = 0
        self.lease = Lease(lease_ms=2000)
        self.heartbeat_interval_ms = 1000
        self.tracker = SyncStateTracker(config.ha_max_time_slave_not_catchup_ms)
        self.fetch_session = 0
        self.stopping = threading.Event()
        self.tiered: Any = None
        self.refresh_needed = threading.Event()
        self._threads: list[threading.Thread] = []

    # Lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self.config.tiered_url:
            from broker_agent.tiered import TieredConfig, TieredUploader

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
        for target, name in ((self._controller_loop, "controller"), (self._watch_loop, "watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            self.role = Role.FENCED
            self.fetch_session += 1
            self.lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=3)
        self.controller.close()
        with self.lock:
            self.confirm_log.close()
        self.store.close()

    # Controller interaction --------------------------------------------------------------
    def _register(self) -> cpb.ReplicaInfo:
        identity = self.identity.load()
        reply = self.controller.call(
            "RegisterBroker",
            cpb.RegisterBrokerRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                broker_id=identity.get("broker_id", 0),
                check_code=identity["check_code"],
                address=self.config.listen,
                election_priority=self.config.election_priority,
            ),
        )
        if identity.get("broker_id") != reply.broker_id:
            identity = dict(
                identity,
                broker_id=reply.broker_id,
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
            )
            self.identity.save(identity)
        elif not self.identity.path.exists():
            self.identity.save(identity)
        self.broker_id = reply.broker_id
        config = self.controller.call("GetConfig", cpb.GetConfigRequest()).values
        self.heartbeat_interval_ms = int(config.get("broker_heartbeat_interval_ms", 1000))
        self.lease.lease_ms = int(config.get("lease_ms", 2000))
        log.info(
            "registered %s/%s as broker %d", self.config.cluster, self.config.broker_name, self.broker_id
        )
        return reply.replica_info

    def _controller_loop(self) -> None:
        registered = False
        next_heartbeat = 0.0
        while not self.stopping.is_set():
            try:
                if not registered:
                    info = self._register()
                    registered = True
                    self._apply_or_elect(info)
                if self.refresh_needed.is_set():
                    self.refresh_needed.clear()
                    self._apply_or_elect(self._replica_info())
                if time.monotonic() >= next_heartbeat:
                    next_heartbeat = time.monotonic() + self.heartbeat_interval_ms / 1000
                    self._heartbeat()
                self._manage_sync_state_set()
                with self.lock:
                    self.confirm_log.flush_due(wall_ms())
            except NotFound:
                registered = False  # cleaned from the metadata: register again
            except MqmetaError as exc:
                log.info("controller: %s", exc)
            self.stopping.wait(min(0.05, self.heartbeat_interval_ms / 4000))

    def _replica_info(self) -> cpb.ReplicaInfo:
        return self.controller.call(
            "GetReplicaInfo",
            cpb.BrokerSetRef(cluster=self.config.cluster, broker_name=self.config.broker_name),
        )

    def _apply_or_elect(self, info: cpb.ReplicaInfo) -> None:
        if info.master_broker_id == 0:
            info = self.controller.call(
                "ElectMaster",
                cpb.ElectMasterRequest(
                    cluster=self.config.cluster,
                    broker_name=self.config.broker_name,
                    trigger=cpb.ELECT_TRIGGER_BROKER,
                    requester_broker_id=self.broker_id,
                ),
            )
        self.apply_replica_info(info)

    def _heartbeat(self) -> None:
        sent_ms = now_ms()
        with self.lock:
            epoch, confirm = self.master_epoch, self.confirm
        reply = self.controller.call(
            "Heartbeat",
            cpb.HeartbeatRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                broker_id=self.broker_id,
                epoch=self.store.epochs.last_epoch or epoch,
                max_offset=self.store.max_offset,
                confirm_offset=confirm,
                election_priority=self.config.election_priority,
            ),
        )
        with self.lock:
            stale = (
                reply.master_broker_id != self.master_broker_id
                or reply.master_epoch != self.master_epoch
                or reply.sync_state_set_epoch != self.sync_state_set_epoch
            )
            if self.role == Role.MASTER and (
                reply.master_broker_id != self.broker_id or reply.master_epoch != self.master_epoch
            ):
                self.lease.revoke()  # the controller names another master: stop writing now
            else:
                self.lease.renew(sent_ms, reply.lease_ms or None)
            self.lock.notify_all()
        if stale:
            self.refresh_needed.set()

    def _watch_loop(self) -> None:
        while not self.stopping.is_set():
            stream = None
            try:
                stream = self.controller.watch(self.config.cluster, self.config.broker_name)
                for event in stream:
                    if self.stopping.is_set():
                        break
                    if event.HasField("replica_info") and self.broker_id:
                        self.apply_replica_info(event.replica_info)
            except Exception as exc:  # grpc errors, and whatever else a broken stream throws
                log.debug("watch stream ended: %s", exc)
            finally:
                if stream is not None:
                    stream.cancel()
            self.stopping.wait(0.5)

    # Roles ---------------------------------------------------------------------------------
    def apply_replica_info(self, info: cpb.ReplicaInfo) -> None:
        """Adopts what the controller decided; stale epochs are ignored."""
        from broker_agent import replication

        with self.lock:
            if info.master_epoch < self.master_epoch:
                return
            self.registered_ids = {r.broker_id for r in info.replicas}
            if (
                self.pending_sync_state_set is not None
                and info.sync_state_set_epoch > self.pending_base_epoch
            ):
                self.pending_sync_state_set = None  # the set moved on: count what it is now
            if info.sync_state_set_epoch >= self.sync_state_set_epoch:
                self.sync_state_set = sorted(info.sync_state_set)
                self.sync_state_set_epoch = info.sync_state_set_epoch
            same = info.master_epoch == self.master_epoch and info.master_broker_id == self.master_broker_id
            if same and self.role != Role.FENCED:
                self._recompute_confirm()
                return
            self.master_epoch = info.master_epoch
            self.master_broker_id = info.master_broker_id
            self.master_address = info.master_address
            self.fetch_session += 1  # any running fetcher stops
            if info.master_broker_id == self.broker_id and self.broker_id:
                self._become_master()
            elif info.master_broker_id:
                self.role = Role.SLAVE
                session = self.fetch_session
                threading.Thread(
                    target=replication.follow, args=(self, session), name="fetcher", daemon=True
                ).start()
                log.info(
                    "slave of broker %d (%s) at epoch %d",
                    info.master_broker_id,
                    info.master_address,
                    info.master_epoch,
                )
            else:
                self.role = Role.FENCED
            self.lock.notify_all()

    def _become_master(self) -> None:
        """Called with the lock held: new epoch entry, fresh confirm offset, unfence."""
        max_offset = self.store.max_offset
        if self.store.epochs.last_epoch < self.master_epoch:
            self.store.begin_epoch(self.master_epoch)
        others = [i for i in self.sync_state_set if i != self.broker_id]
        self.tracker.reset(now_ms(), others)
        self.pending_sync_state_set = None
        self.confirm = max_offset if not others else min(self.confirm, max_offset)
        self.role = Role.MASTER
        self.note_confirm(force=True)
        log.info("master at epoch %d from offset %d", self.master_epoch, max_offset)

    def request_refresh(self) -> None:
        self.refresh_needed.set()

    # Confirm offset and the SyncStateSet (master) -------------------------------------------
    def _counted_set(self) -> set[int]:
        counted = set(self.sync_state_set) | {self.broker_id}
        if self.pending_sync_state_set is not None:
            counted |= set(self.pending_sync_state_set)
        return counted

    def _recompute_confirm(self) -> None:
        """With the lock held. Never moves backwards within a role."""
        if self.role != Role.MASTER:
            return
        computed = confirm_offset(
            self.broker_id, self.store.max_offset, self.tracker.acked(), self._counted_set()
        )
        if computed > self.confirm:
            self.confirm = computed
            self.note_confirm()
            self.lock.notify_all()

    def note_confirm(self, force: bool = False) -> None:
        """With the lock held: the confirm log's view of this broker (see confirm_log.py)."""
        acked = self.tracker.acked() if self.role == Role.MASTER else {}
        self.confirm_log.note(
            wall_ms(),
            self.broker_id,
            self.role.value,
            self.master_epoch,
            self.confirm,
            self.store.max_offset,
            acked,
            force,
        )

    def on_slave_fetch(self, broker_id: int, fetch_offset: int) -> None:
        with self.lock:
            self.tracker.on_fetch(broker_id, fetch_offset, self.store.max_offset, now_ms())
            self._recompute_confirm()

    def _manage_sync_state_set(self) -> None:
        with self.lock:
            if (
                self.pending_sync_state_set is not None
                and self.pending_failed_ms
                and now_ms() - self.pending_failed_ms > PENDING_GRACE_MS
            ):
                self.pending_sync_state_set = None  # it never committed
            if self.role != Role.MASTER or self.pending_sync_state_set is not None:
                return
            epoch_start = self.store.epochs.entries[-1][1] if self.store.epochs.entries else 0
            plan = self.tracker.plan(
                now_ms(), self.broker_id, self.sync_state_set, self.confirm, epoch_start, self.registered_ids
            )
            if plan is None:
                return
            self.pending_sync_state_set = plan
            self.pending_base_epoch = self.sync_state_set_epoch
            self.pending_failed_ms = 0
            request = cpb.AlterSyncStateSetRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                master_broker_id=self.broker_id,
                master_epoch=self.master_epoch,
                sync_state_set_epoch=self.sync_state_set_epoch,
                new_sync_state_set=plan,
            )
        try:
            info = self.controller.call("AlterSyncStateSet", request)
            log.info("SyncStateSet %s -> %s", request.new_sync_state_set, list(info.sync_state_set))
            with self.lock:  # adopt, then stop counting the union: no window in between
                self.apply_replica_info(info)
                self.pending_sync_state_set = None
        except MqmetaError as exc:
            # The change may still commit (a timed-out proposal): keep counting the union
            # until a refresh shows the set moved on, or for at most PENDING_GRACE_MS.
            log.info("SyncStateSet change %s not confirmed: %s", list(plan), exc)
            with self.lock:
                self.pending_failed_ms = now_ms()
            self.request_refresh()

    # Data plane ------------------------------------------------------------------------------
    def writable(self, now: int | None = None) -> bool:
        return self.role == Role.MASTER and self.lease.valid(now or now_ms())

    def _require_writable(self) -> None:
        """With the lock held."""
        if self.role != Role.MASTER:
            raise NotMaster(
                f"broker {self.broker_id} of {self.config.broker_name} is {self.role.value}, not the master",
                leader=self.master_address,
            )
        if not self.lease.valid(now_ms()):
            raise NotMaster(
                f"master {self.broker_id} of {self.config.broker_name} has no valid "
                "lease from the controller; it refuses writes until it renews",
                leader="",
            )
        if len(set(self.sync_state_set) | {self.broker_id}) < self.config.min_in_sync_replicas:
            raise FailedPrecondition(
                f"SyncStateSet {self.sync_state_set} is smaller than min_in_sync_replicas "
                f"{self.config.min_in_sync_replicas}",
                code="IN_SYNC_REPLICAS_NOT_ENOUGH",
            )

    def send(self, messages: list[Message]) -> tuple[list[Any], int]:
        if not 1 <= len(messages) <= SEND_BATCH_MAX:
            raise InvalidArgument(f"a send carries 1 to {SEND_BATCH_MAX} messages")
        return self._write(lambda epoch: self.store.put_messages(messages, epoch, wall_ms()))

    def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Consumer offsets are commit-log records: they replicate and fail over with the data."""
        self._write(
            lambda epoch: self.store.commit_consumer_offset(group, topic, queue_id, offset, epoch, wall_ms())
        )

    def _write(self, put) -> tuple[Any, int]:
        """Appends as master, then waits for the ack policy; the only write path."""
        with self.lock:
            self._require_writable()
            epoch = self.master_epoch
            results = put(epoch)
            end = self.store.max_offset
            self._recompute_confirm()
            self.lock.notify_all()  # wakes the slaves' long-polling fetches
        self.wait_acknowledged(end, epoch)
        return results, epoch

    def wait_acknowledged(self, end: int, epoch: int) -> None:
        """Blocks until the ack policy holds for everything before `end`."""
        deadline = time.monotonic() + self.config.send_timeout_ms / 1000
        with self.lock:
            while not self._acknowledged(end):
                if self.role != Role.MASTER or self.master_epoch != epoch:
                    raise NotMaster(
                        "this broker stopped being the master before the write "
                        "was replicated; its outcome is unknown",
                        leader=self.master_address,
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded(
                        "the SyncStateSet did not acknowledge the write in time; its outcome is unknown",
                        code="FLUSH_SLAVE_TIMEOUT",
                    )
                self.lock.wait(timeout=min(remaining, 0.1))

    def _acknowledged(self, end: int) -> bool:
        if self.config.all_ack_in_sync_state_set:
            return self.confirm >= end
        acked = self.tracker.acked()
        holders = 1 + sum(1 for i in self._counted_set() - {self.broker_id} if acked.get(i, 0) >= end)
        return holders >= self.config.in_sync_replicas

    def require_master(self) -> None:
        with self.lock:
            if self.role != Role.MASTER:
                raise NotMaster(
                    f"broker {self.broker_id} is {self.role.value}, not the master",
                    leader=self.master_address,
                )
