"""The broker's role core: what a broker believes about its role, and what to do next.

Pure, like controller/state_machine.py: no clock, sockets, files, threads or
randomness. `BrokerCore.handle(event)` takes one event (time arrives inside it as
`now_ms`, the log's shape as a `LogView`) and returns the effects the shell
(agent.py) carries out, always in EFFECT_ORDER: stop the old fetcher, persist
(truncate, begin an epoch, append replicated bytes), note the confirm offset for the
audit, send (propose a SyncStateSet, ask for fresh replica info), start a fetcher,
report a revoked lease, wake waiters, answer or refuse a slave's fetch. etcd raft's
`Ready` is the model: the core says what to do, the application does the I/O.

What it holds: the role (Role), the master epoch and who the master is, the
SyncStateSet and its epoch, a SyncStateSet change in flight (the confirm offset waits
for the union with the current set until its outcome is definitive, RocketMQ #5663, and
acks from in_sync_replicas copies need that many in each; sent again while unknown,
never dropped on a timer), the confirm offset,
the master lease (ha.Lease: why it makes a dual master impossible is written there)
and the slaves' progress (ha.SyncStateTracker: when to shrink or expand the set).

Leaving gracefully (SIGTERM, `mqmeta admin handoff`): a master hands off (HandoffStart):
it refuses new writes at once, lets the ones in flight be acknowledged, and once its
successor (the in-sync slave that holds the most, or the preferred one) holds every
byte it appended, asks the controller to elect it (ElectSuccessor). Before it asks,
giving up is safe (writes resume at once). Once it has asked, a failed call may still
commit (a proposal that timed out), so it never writes again in that epoch before
pending_grace_ms has passed (HandoffFailed): the controller's master lease argument
(ha.py) does not cover an election the master itself requested. A slave leaves
(Leave): its fetches say so and its master takes it out of the SyncStateSet (and does
not add it back), so acknowledgements never wait for a replica that is shutting down.

A slave whose fetch cannot reach its master reports it (ReportMasterUnreachable, at
most once per REPORT_INTERVAL_MS): the controller leader then elects at once if the
master's port refuses connections (its process is gone), not after dead-after.

What it answers without effects: may this broker write now (check_writable), is a
write acknowledged yet (write_outcome), and read-only snapshots (view).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mqmeta.broker_agent.ha import Lease, Role, SlaveProgress, SyncStateTracker, confirm_offset

from mqmeta.errors import FailedPrecondition, FencedEpoch, MqmetaError, NotMaster
from mqmeta.formats.epochs import EpochEntry, consistent_point
from mqmeta.timing import LEASE_MS_DEFAULT, PENDING_GRACE_MS

# A slave reports an unreachable master at most this often (each report costs the
# controller leader a TCP connect to the master's address).
REPORT_INTERVAL_MS = 200
# A SyncStateSet proposal whose outcome is unknown is sent again this long after it failed.
PROPOSAL_RETRY_INTERVAL_MS = 500


class ProposalOutcome(enum.Enum):
    """How a SyncStateSet proposal that was not confirmed failed (SyncStateSetFailed)."""

    UNCERTAIN = "UNCERTAIN"  # no answer: it may still commit; sent again until definitive
    FENCED = "FENCED"  # a newer master or SyncStateSet epoch: the refresh shows the outcome
    REFUSED = "REFUSED"  # the state machine refused it at its base epoch: it never applies
    # A member was not alive by the liveness the leader put in THIS copy: an earlier copy
    # whose answer never came carries its own liveness and may still apply. Definitive
    # only when there was no earlier copy (_on_sync_state_set_failed).
    NOT_ALIVE = "NOT_ALIVE"

    @classmethod
    def of_code(cls, code: str) -> ProposalOutcome:
        """The outcome a failed AlterSyncStateSet's error code means."""
        if code in ("FENCED_MASTER_EPOCH", "FENCED_SYNC_STATE_SET_EPOCH"):
            return cls.FENCED
        if code == "MASTER_NOT_AVAILABLE":
            return cls.NOT_ALIVE
        if code in ("INVALID_ARGUMENT", "NOT_FOUND"):
            return cls.REFUSED
        return cls.UNCERTAIN


class Departure(enum.Enum):
    """Whether this broker is on its way out, and how."""

    STAYING = "STAYING"
    HANDING_OFF = "HANDING_OFF"  # master: refuses new writes until a successor is elected
    LEAVING = "LEAVING"  # slave: its fetches ask the master to drop it from the SyncStateSet


# The log as the core needs to see it ---------------------------------------------------
@dataclass(frozen=True)
class LogView:
    """The shape of the local log at the moment of an event (the shell reads it)."""

    max_offset: int
    epochs: tuple[EpochEntry, ...] = ()
    min_offset: int = 0
    # How far the log is on disk (fdatasync'd). A master appends without waiting for the
    # disk and syncs once for every append waiting (group commit), so it may lag
    # max_offset; None: the whole log (a slave syncs before it acknowledges).
    durable_offset: int | None = None

    @property
    def durable(self) -> int:
        """What the master counts as its own ack: never bytes a power loss could take."""
        return self.max_offset if self.durable_offset is None else self.durable_offset

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0

    @property
    def epoch_start(self) -> int:
        """Where the newest epoch begins (0 for an empty epoch list)."""
        return self.epochs[-1][1] if self.epochs else 0


# Policy --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AckPolicy:
    """When a write counts as acknowledged, and when writes are refused outright."""

    all_ack_in_sync_state_set: bool = True  # else: in_sync_replicas copies
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1


class WriteOutcome(enum.Enum):
    ACKNOWLEDGED = "ACKNOWLEDGED"
    WAITING = "WAITING"
    DEPOSED = "DEPOSED"  # no longer master of the write's epoch: its outcome is unknown


# Events (inputs) -----------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    """The controller gave this broker its id; `lease_ms` is the controller's config."""

    broker_id: int
    lease_ms: int


@dataclass(frozen=True)
class ReplicaInfo:
    """What the controller decided for this broker set (register, refresh, watch, elect)."""

    now_ms: int
    master_broker_id: int
    master_address: str
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    registered_ids: frozenset[int]
    log: LogView


@dataclass(frozen=True)
class SyncStateSetChanged:
    """The controller committed this master's proposal; `info` is its answer."""

    info: ReplicaInfo


@dataclass(frozen=True)
class SyncStateSetFailed:
    """The proposal was not confirmed. UNCERTAIN (no answer, a timeout, no leader): it may
    still commit, so the same proposal is sent again; FENCED: the set or the master moved
    on (the refresh shows where); REFUSED: the state machine refused it at its base
    epoch, so no copy of it can ever apply."""

    now_ms: int
    outcome: ProposalOutcome = ProposalOutcome.UNCERTAIN


@dataclass(frozen=True)
class HeartbeatAnswered:
    """The controller leader acknowledged a heartbeat sent at `sent_ms`."""

    sent_ms: int
    master_broker_id: int
    master_epoch: int
    sync_state_set_epoch: int
    lease_ms: int  # 0 = keep the current lease length


@dataclass(frozen=True)
class Tick:
    """Time passed (the shell's controller loop): time out a failed change, plan one."""

    now_ms: int
    log: LogView


@dataclass(frozen=True)
class Appended:
    """The master appended records; `log` ends after them."""

    log: LogView


@dataclass(frozen=True)
class SyncStarting:
    """The master's group commit is about to fdatasync its log (Synced ends it). A master
    whose disk takes longer than its lease to answer is stalled: it refuses writes and
    stops renewing its lease (the shell skips heartbeats), so the controller elects an
    in-sync slave in its place (apache/rocketmq #6468: an IO stall on the master)."""

    now_ms: int


@dataclass(frozen=True)
class Synced:
    """The master's group commit made its log durable up to `log.durable`."""

    log: LogView


@dataclass(frozen=True)
class SlaveFetch:
    """A slave asks this master for bytes from `fetch_offset` (which acknowledges them);
    `leaving`: the slave is shutting down."""

    now_ms: int
    broker_id: int
    master_epoch: int
    fetch_offset: int
    handshake: bool
    epoch_entries: tuple[EpochEntry, ...]
    log: LogView
    leaving: bool = False


@dataclass(frozen=True)
class FetchStillWaiting:
    """A long-polling fetch woke up with nothing new: is this still the master it asked?"""

    master_epoch: int


@dataclass(frozen=True)
class FetchAnswered:
    """The master answered `broker_id` while its log ended at `log.max_offset`."""

    now_ms: int
    broker_id: int
    log: LogView


@dataclass(frozen=True)
class MasterAnswered:
    """The master answered this slave's fetch of session `session`."""

    session: int
    master_epoch: int
    truncate_to: int  # -1: no truncation
    data_offset: int
    data: bytes
    log: LogView


@dataclass(frozen=True)
class Replicated:
    """The slave appended what the master sent; the master's confirm offset was this."""

    session: int
    confirm_offset: int
    log: LogView


@dataclass(frozen=True)
class UploadStarting:
    """The tiered uploader is about to upload up to `end_offset` (T1)."""

    end_offset: int


@dataclass(frozen=True)
class Fence:
    """The shell could not carry out a role change (e.g. the epoch file failed)."""

    reason: str


@dataclass(frozen=True)
class CorruptionFound:
    """A read or the background scrub found a bad record at `offset` in the local log
    (P16). A slave cuts its log there and fetches the rest from its master again (a new
    session, whose handshake starts at the cut); on a master or a fenced broker the core
    changes nothing (the shell hands a master's role off: its log cannot be repaired
    from anyone while it leads)."""

    offset: int


@dataclass(frozen=True)
class DiskFailed:
    """A write or fsync of this broker's store failed (EIO): what it holds in memory may no
    longer match its disk. It never serves or writes again in this process (the shell
    exits once it has asked the controller to elect another master)."""

    reason: str


@dataclass(frozen=True)
class MasterUnreachable:
    """This slave's fetch of session `session` could not reach its master."""

    now_ms: int
    session: int


@dataclass(frozen=True)
class HandoffStart:
    """Hand the master role to an in-sync slave: refuse new writes from now on; give up
    (HandoffTick refuses) if no successor holds everything by `deadline_ms`."""

    now_ms: int
    deadline_ms: int
    preferred_broker_id: int = 0  # 0 = the slave that holds the most
    then_leave: bool = False  # shutting down: once a slave, leave at once (never rejoin the set)


@dataclass(frozen=True)
class HandoffTick:
    """The shell asks whether the successor can be elected now (acks moved, time passed)."""

    now_ms: int
    log: LogView


@dataclass(frozen=True)
class HandoffFailed:
    """Asking the controller to elect the successor failed (refused, or no answer): the
    election may still commit, so writes stay refused for pending_grace_ms from now."""

    now_ms: int
    reason: str


@dataclass(frozen=True)
class Leave:
    """This slave is shutting down: ask the master to take it out of the SyncStateSet."""


@dataclass(frozen=True)
class Stop:
    """The broker is shutting down: refuse everything from now on."""


Event = (
    Registered
    | ReplicaInfo
    | SyncStateSetChanged
    | SyncStateSetFailed
    | HeartbeatAnswered
    | Tick
    | Appended
    | SyncStarting
    | Synced
    | SlaveFetch
    | FetchStillWaiting
    | FetchAnswered
    | MasterAnswered
    | Replicated
    | UploadStarting
    | MasterUnreachable
    | CorruptionFound
    | HandoffStart
    | HandoffTick
    | HandoffFailed
    | Leave
    | Fence
    | DiskFailed
    | Stop
)


# Effects (outputs), in the order the shell carries them out ----------------------------
@dataclass(frozen=True)
class StopFetching:
    ORDER: ClassVar[int] = 0
    session: int


@dataclass(frozen=True)
class Truncate:
    """Cut the local log at `offset` (the consistent point), crash-safely."""

    ORDER: ClassVar[int] = 1
    offset: int
    master_epoch: int


@dataclass(frozen=True)
class BeginEpoch:
    """Append (epoch, log end) to the epoch file before any write of this epoch."""

    ORDER: ClassVar[int] = 1
    epoch: int


@dataclass(frozen=True)
class AppendReplicated:
    ORDER: ClassVar[int] = 1
    offset: int
    data: bytes


@dataclass(frozen=True)
class NoteConfirm:
    """The audit's confirm log line (confirm_log.py); `force` writes it at once."""

    ORDER: ClassVar[int] = 2
    role: Role
    master_epoch: int
    confirm_offset: int
    acked: tuple[tuple[int, int], ...]
    force: bool = False


@dataclass(frozen=True)
class ProposeSyncStateSet:
    ORDER: ClassVar[int] = 3
    master_broker_id: int
    master_epoch: int
    sync_state_set_epoch: int
    new_sync_state_set: tuple[int, ...]


@dataclass(frozen=True)
class RequestRefresh:
    """Ask the controller for the replica info again (this view may be stale)."""

    ORDER: ClassVar[int] = 3


@dataclass(frozen=True)
class ReportMasterUnreachable:
    """Tell the controller that this slave cannot reach the master of `master_epoch`."""

    ORDER: ClassVar[int] = 3
    master_broker_id: int
    master_epoch: int


@dataclass(frozen=True)
class ElectSuccessor:
    """Ask the controller to elect `successor_broker_id` in place of this master, which
    holds `master_epoch` and has stopped taking writes (ELECT_TRIGGER_HANDOFF)."""

    ORDER: ClassVar[int] = 3
    successor_broker_id: int
    master_epoch: int


@dataclass(frozen=True)
class StartFetching:
    ORDER: ClassVar[int] = 4
    session: int
    master_broker_id: int
    master_address: str
    master_epoch: int


@dataclass(frozen=True)
class LeaseRevoked:
    """The controller names another master: this one stopped accepting writes."""

    ORDER: ClassVar[int] = 5
    master_broker_id: int
    master_epoch: int


@dataclass(frozen=True)
class WakeWaiters:
    """Writers waiting for acknowledgement and long-polling fetches re-check."""

    ORDER: ClassVar[int] = 6


@dataclass(frozen=True)
class AnswerFetch:
    """What to send a fetching slave: a truncation point, a pointer to the tiered
    store, or the bytes from `from_offset` (the shell reads them up to its log end,
    synced or not, so that the slaves' append and fsync overlap the master's own; a
    write is still acknowledged only once the master's fsync covers it too. A power loss
    may take from the master bytes a slave holds: a master that then re-adopts the epoch
    cuts such a slave back to its durable end first, _untrusted_cut)."""

    ORDER: ClassVar[int] = 7
    truncate_to: int = -1
    moved_to_tiered: bool = False
    from_offset: int = -1


@dataclass(frozen=True)
class Refuse:
    """The request is refused with `error` (raised by the shell, after the rest)."""

    ORDER: ClassVar[int] = 8
    error: MqmetaError


Effect = (
    StopFetching
    | Truncate
    | BeginEpoch
    | AppendReplicated
    | NoteConfirm
    | ProposeSyncStateSet
    | RequestRefresh
    | ReportMasterUnreachable
    | ElectSuccessor
    | StartFetching
    | LeaseRevoked
    | WakeWaiters
    | AnswerFetch
    | Refuse
)


# Snapshots ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleView:
    """A read-only snapshot of the core, for the shell and the threads it runs."""

    role: Role
    broker_id: int
    master_broker_id: int
    master_address: str
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    confirm_offset: int
    fetch_session: int
    departure: Departure = Departure.STAYING


@dataclass
class _PendingChange:
    """A SyncStateSet proposal in flight: counted with the current set until its outcome is
    definitive (the union for the confirm offset, each set for in_sync_replicas copies;
    never dropped on a timer: a proposal that timed out may commit at any later time, and
    its members must count from the moment they were proposed)."""

    members: tuple[int, ...]
    base_epoch: int  # the SyncStateSet epoch it was proposed against
    master_epoch: int  # the master epoch it was proposed in
    retry_ms: int = 0  # when to send it again after an uncertain failure (0 = in flight)
    attempts: int = 1


@dataclass
class _Handoff:
    """A handoff in progress: until when to wait, whom to prefer, whether the successor's
    election was asked for already (it is asked once; the shell reports the answer)."""

    deadline_ms: int
    preferred_broker_id: int
    then_leave: bool
    asked: bool = False
    failed_ms: int = 0  # when asking failed (0 = not failed): writes resume after the grace


# Pure rules (module functions: a test may swap one for a planted bug) ----------------
def counted_members(master_id: int, sync_state_set: Sequence[int], pending: Sequence[int] | None) -> set[int]:
    """Whose acks the confirm offset waits for: the SyncStateSet and the master, plus,
    while a change is in flight, the proposed set too. The controller may already have
    committed the new set while this master still holds the old one: a member being
    added must count from the moment it is proposed (RocketMQ #5663), a member being
    removed until the removal is known to have committed."""
    counted = set(sync_state_set) | {master_id}
    if pending is not None:
        counted |= set(pending)
    return counted


def truncation_point(
    slave_entries: Sequence[EpochEntry],
    slave_max_offset: int,
    master_entries: Sequence[EpochEntry],
    master_max_offset: int,
) -> int | None:
    """Where a slave must cut its log before copying from this master (None: keep it
    all): the consistent point, below which both logs hold the same bytes."""
    point = consistent_point(slave_entries, master_entries, master_max_offset, slave_max_offset)
    return point if point < slave_max_offset else None


# The core ------------------------------------------------------------------------------
@dataclass
class _State:
    """Everything the core believes. Only the handlers below change it; the shell and
    the threads it runs read it through BrokerCore's queries and view()."""

    broker_name: str  # for messages only
    policy: AckPolicy
    pending_grace_ms: int
    tracker: SyncStateTracker
    broker_id: int = 0
    role: Role = Role.FENCED
    master_epoch: int = 0
    master_broker_id: int = 0
    master_address: str = ""
    sync_state_set: tuple[int, ...] = ()
    sync_state_set_epoch: int = 0
    registered_ids: frozenset[int] = frozenset()
    pending: _PendingChange | None = None
    next_plan_ms: int = 0  # after a refused proposal: no new plan before this
    confirm_offset: int = 0
    fetch_session: int = 0
    newest_master_epoch_seen: int = 0  # from any controller answer, heartbeats included
    stopped: bool = False
    lease: Lease = field(default_factory=lambda: Lease(lease_ms=LEASE_MS_DEFAULT))
    departure: Departure = Departure.STAYING
    handoff: _Handoff | None = None  # while HANDING_OFF
    reported_ms: int | None = None  # the last ReportMasterUnreachable
    disk_failed: bool = False  # DiskFailed: FENCED for the rest of this process
    sync_started_ms: int | None = None  # the oldest fdatasync of the log still running
    # As master of an epoch its log already held (a restart, or the role lost and given
    # back): the durable end it found. Slaves are served unsynced bytes, so an earlier
    # process may have served bytes past it that a power loss took from this log, and
    # this one writes other bytes at those offsets in the same epoch. Past it, a slave's
    # log is trusted only once one of its fetches showed it holds nothing past it.
    reopened_at: int | None = None
    trusted: set[int] = field(default_factory=set)  # slaves shown to hold nothing past reopened_at


class BrokerCore:
    """One broker's role, fed events by its shell; see the module docstring."""

    def __init__(
        self,
        broker_name: str,
        policy: AckPolicy | None = None,
        max_not_catchup_ms: int = 15_000,
        pending_grace_ms: int = PENDING_GRACE_MS,
    ) -> None:
        tracker = SyncStateTracker(max_not_catchup_ms)
        self._state = _State(broker_name, policy or AckPolicy(), pending_grace_ms, tracker)

    # The one entry point ----------------------------------------------------------------
    def handle(self, event: Event) -> list[Effect]:
        """Applies one event; returns what the shell must do, in EFFECT_ORDER."""
        if self._state.stopped:
            return []
        effects = _HANDLERS[type(event)](self._state, event)
        return sorted(effects, key=lambda effect: effect.ORDER)  # stable: ties keep their order

    # Queries (no effects) ------------------------------------------------------------------
    def view(self) -> RoleView:
        s = self._state
        return RoleView(
            s.role,
            s.broker_id,
            s.master_broker_id,
            s.master_address,
            s.master_epoch,
            s.sync_state_set,
            s.sync_state_set_epoch,
            s.confirm_offset,
            s.fetch_session,
            s.departure,
        )

    @property
    def broker_id(self) -> int:
        return self._state.broker_id

    @property
    def role(self) -> Role:
        return self._state.role

    @property
    def master_epoch(self) -> int:
        return self._state.master_epoch

    @property
    def master_address(self) -> str:
        return self._state.master_address

    @property
    def sync_state_set(self) -> tuple[int, ...]:
        return self._state.sync_state_set

    @property
    def confirm_offset(self) -> int:
        return self._state.confirm_offset

    @property
    def fetch_session(self) -> int:
        return self._state.fetch_session

    @property
    def disk_failed(self) -> bool:
        return self._state.disk_failed

    @property
    def pending_sync_state_set(self) -> tuple[int, ...] | None:
        pending = self._state.pending
        return pending.members if pending is not None else None

    def follows(self, session: int) -> bool:
        """Is `session` the fetch session of this broker's current role as a slave?"""
        return _follows(self._state, session)

    def lease_valid(self, now_ms: int) -> bool:
        return self._state.lease.valid(now_ms)

    def writable(self, now_ms: int) -> bool:
        s = self._state
        return (
            s.role == Role.MASTER
            and s.lease.valid(now_ms)
            and s.departure is Departure.STAYING
            and not self.disk_stalled(now_ms)
        )

    def disk_stalled(self, now_ms: int) -> bool:
        """An fdatasync of the log has run longer than the lease (see SyncStarting)."""
        s = self._state
        return s.sync_started_ms is not None and now_ms - s.sync_started_ms > s.lease.lease_ms

    @property
    def departure(self) -> Departure:
        return self._state.departure

    def check_master(self) -> None:
        s = self._state
        if s.role != Role.MASTER:
            raise NotMaster(
                f"broker {s.broker_id} of {s.broker_name} is {s.role.value}, not the master",
                leader=s.master_address,
            )

    def check_writable(self, now_ms: int) -> None:
        """May this broker append now? Raises the refusal a producer should see."""
        self.check_master()
        s = self._state
        if not s.lease.valid(now_ms):
            raise NotMaster(
                f"master {s.broker_id} of {s.broker_name} has no valid "
                "lease from the controller; it refuses writes until it renews",
                leader="",
            )
        if self.disk_stalled(now_ms):
            raise NotMaster(
                f"master {s.broker_id} of {s.broker_name} has waited {now_ms - (s.sync_started_ms or 0)} ms "
                f"for its disk, longer than its lease ({s.lease.lease_ms} ms): it refuses writes and "
                "lets the controller elect an in-sync slave",
                leader="",
            )
        if s.departure is not Departure.STAYING:
            raise NotMaster(
                f"master {s.broker_id} of {s.broker_name} is handing off to an in-sync slave or "
                "shutting down; retry: the route names the new master in a moment",
                leader="",
            )
        if len(set(s.sync_state_set) | {s.broker_id}) < s.policy.min_in_sync_replicas:
            raise FailedPrecondition(
                f"SyncStateSet {list(s.sync_state_set)} is smaller than min_in_sync_replicas "
                f"{s.policy.min_in_sync_replicas}",
                code="IN_SYNC_REPLICAS_NOT_ENOUGH",
            )

    def write_outcome(self, end_offset: int, epoch: int) -> WriteOutcome:
        """Is everything before `end_offset`, written as master of `epoch`, acknowledged?
        Only the master of that epoch can say yes: once deposed, a later confirm offset
        (learned as a slave) may describe other bytes at the same offsets."""
        s = self._state
        if s.role != Role.MASTER or s.master_epoch != epoch:
            return WriteOutcome.DEPOSED
        return WriteOutcome.ACKNOWLEDGED if _acknowledged(s, end_offset) else WriteOutcome.WAITING

    def serves_fetch(self, master_epoch: int) -> bool:
        """Would a fetch of a slave following `master_epoch` be answered now (not refused)?"""
        return not _fetch_refusal(self._state, master_epoch)

    def acked_offsets(self) -> dict[int, int]:
        """Each slave's acknowledged offset in this master epoch (empty unless master)."""
        return _acked_offsets(self._state)

    def trusts(self, broker_id: int) -> bool:
        """Is slave `broker_id`'s log known to hold only this log's bytes? False, as master of
        an epoch it re-adopted, until one of its fetches showed it holds nothing past the
        durable end found (see _State.reopened_at)."""
        s = self._state
        return s.role == Role.MASTER and (s.reopened_at is None or broker_id in s.trusted)

    def slaves(self) -> dict[int, SlaveProgress]:
        """A copy of each slave's progress (empty unless master)."""
        if self._state.role != Role.MASTER:
            return {}
        return {i: SlaveProgress(**vars(p)) for i, p in self._state.tracker.slaves.items()}


# Rules shared by the handlers --------------------------------------------------------------
def _follows(s: _State, session: int) -> bool:
    return not s.stopped and s.role == Role.SLAVE and s.fetch_session == session


def _acked_offsets(s: _State) -> dict[int, int]:
    return s.tracker.acked() if s.role == Role.MASTER else {}


def _counted(s: _State) -> set[int]:
    pending = s.pending.members if s.pending is not None else None
    return counted_members(s.broker_id, s.sync_state_set, pending)


def _acknowledged(s: _State, end_offset: int) -> bool:
    """Acks from the whole set: the confirm offset covers the write. Acks from
    in_sync_replicas copies: that many in the set, and while a change is in flight that
    many in the proposed set too. The controller elects from the set it holds, which may
    be either: counted over their union, a write held by the master and a member being
    added alone was lost when the change never committed and a member without it was
    elected (found by the broker simulation at 2 of 3 copies)."""
    if s.policy.all_ack_in_sync_state_set:
        return s.confirm_offset >= end_offset
    acked = s.tracker.acked()

    def copies(members: Sequence[int]) -> int:
        return 1 + sum(1 for i in set(members) - {s.broker_id} if acked.get(i, 0) >= end_offset)

    enough = s.policy.in_sync_replicas
    return copies(s.sync_state_set) >= enough and (s.pending is None or copies(s.pending.members) >= enough)


def _ack_sets(s: _State) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    return s.sync_state_set, (s.pending.members if s.pending is not None else None)


def _wake_if_ack_sets_changed(
    s: _State, before: tuple[tuple[int, ...], tuple[int, ...] | None]
) -> list[Effect]:
    """Acks from in_sync_replicas copies: when the sets a write needs copies in change (a
    change committed, refused or adopted), writes may be acknowledged with no ack to come
    (a caught-up slave's fetch waits for the next append); their writers look again now,
    not at their wait's poll interval. (Under the default the confirm offset wakes them.)"""
    if s.role != Role.MASTER or s.policy.all_ack_in_sync_state_set or _ack_sets(s) == before:
        return []
    return [WakeWaiters()]


def _note(s: _State, force: bool = False) -> NoteConfirm:
    acked = tuple(sorted(_acked_offsets(s).items()))
    return NoteConfirm(s.role, s.master_epoch, s.confirm_offset, acked, force)


def _recompute_confirm(s: _State, log: LogView) -> list[Effect]:
    """As master: the confirm offset never moves backwards within a role. It is at most
    the master's durable offset, so while that has not passed it (every append, most
    fetches) nothing can move: no need to look at the slaves' acks."""
    if s.role != Role.MASTER or log.durable <= s.confirm_offset:
        return []
    computed = confirm_offset(s.broker_id, log.durable, s.tracker.acked(), _counted(s))
    if computed <= s.confirm_offset:
        return []
    s.confirm_offset = computed
    return [_note(s), WakeWaiters()]


def _new_session(s: _State) -> list[Effect]:
    effects: list[Effect] = [StopFetching(s.fetch_session)] if s.role == Role.SLAVE else []
    s.fetch_session += 1
    return effects


def _fetch_refusal(s: _State, slave_master_epoch: int) -> list[Effect]:
    if s.role != Role.MASTER:
        not_master = f"broker {s.broker_id} is {s.role.value}, not the master"
        return [Refuse(NotMaster(not_master, leader=s.master_address))]
    if slave_master_epoch > s.master_epoch:  # the slave knows a newer epoch: this master is stale
        stale = f"master epoch {s.master_epoch} is older than the slave's {slave_master_epoch}"
        return [RequestRefresh(), Refuse(FencedEpoch(stale))]
    if slave_master_epoch < s.master_epoch:
        # A fetch of an older session (it may have waited in a stream across elections)
        # says nothing about the slave's log now: no ack; the slave must refresh.
        behind = f"the slave follows master epoch {slave_master_epoch}; this master is at {s.master_epoch}"
        return [Refuse(FencedEpoch(behind))]
    return []


# Handlers: (state, event) -> effects ------------------------------------------------------
def _on_registered(s: _State, event: Registered) -> list[Effect]:
    s.broker_id = event.broker_id
    s.lease.lease_ms = event.lease_ms
    return []


def _on_replica_info(s: _State, info: ReplicaInfo) -> list[Effect]:
    """Adopts what the controller decided; an older master epoch than any the controller
    has named (in replica info or a heartbeat reply) is ignored: the watch stream and the
    calls travel separately, so a late decision must not undo a newer one."""
    if info.master_epoch < max(s.master_epoch, s.newest_master_epoch_seen):
        return []
    sets_before = _ack_sets(s)
    same_epoch = info.master_epoch == s.newest_master_epoch_seen
    s.newest_master_epoch_seen = info.master_epoch
    # Within one master epoch an info carries no order of its own: the reply to this
    # master's AlterSyncStateSet, built before a broker registered, may arrive after the
    # watch event that named it. Replacing the set then dropped that broker until the next
    # change (its fetches were not counted, so it never joined the SyncStateSet: seen in
    # CI). Registrations only add within an epoch here; a new epoch takes the info's.
    s.registered_ids = s.registered_ids | info.registered_ids if same_epoch else info.registered_ids
    if s.pending is not None and (
        info.sync_state_set_epoch > s.pending.base_epoch or info.master_epoch > s.pending.master_epoch
    ):
        s.pending = None  # the set (or the master) moved on: no copy of it can apply any more
    if info.sync_state_set_epoch >= s.sync_state_set_epoch:
        s.sync_state_set = tuple(sorted(info.sync_state_set))
        s.sync_state_set_epoch = info.sync_state_set_epoch
    same = info.master_epoch == s.master_epoch and info.master_broker_id == s.master_broker_id
    if same and s.role != Role.FENCED:
        return _recompute_confirm(s, info.log) or _wake_if_ack_sets_changed(s, sets_before)
    effects = _new_session(s)  # any running fetcher stops
    if s.departure is Departure.HANDING_OFF:  # the successor (or another) was elected
        leave = s.handoff is not None and s.handoff.then_leave
        s.departure, s.handoff = (Departure.LEAVING if leave else Departure.STAYING), None
    s.master_epoch = info.master_epoch
    s.master_broker_id = info.master_broker_id
    s.master_address = info.master_address
    if s.disk_failed:  # never master or slave again on a disk that failed
        s.role = Role.FENCED
    elif info.master_broker_id == s.broker_id and s.broker_id:
        effects += _become_master(s, info.now_ms, info.log)
    elif info.master_broker_id:
        s.role = Role.SLAVE
        effects.append(
            StartFetching(s.fetch_session, info.master_broker_id, info.master_address, info.master_epoch)
        )
    else:
        s.role = Role.FENCED
    return [*effects, WakeWaiters()]


def _become_master(s: _State, now_ms: int, log: LogView) -> list[Effect]:
    """A new epoch entry (unless this log already began it), a fresh confirm offset."""
    effects: list[Effect] = []
    if log.last_epoch < s.master_epoch:
        effects.append(BeginEpoch(s.master_epoch))
        s.reopened_at = None
    else:
        s.reopened_at = log.durable  # see _State.reopened_at
    s.trusted = set()
    others = [i for i in s.sync_state_set if i != s.broker_id]
    s.tracker.reset(now_ms, others)
    s.pending = None
    # Alone in its set it confirms all it has on disk; otherwise nothing beyond what it knew.
    s.confirm_offset = log.durable if not others else min(s.confirm_offset, log.durable)
    s.role = Role.MASTER
    return [*effects, _note(s, force=True)]


def _on_sync_state_set_changed(s: _State, event: SyncStateSetChanged) -> list[Effect]:
    """Adopt the committed set, then stop counting the union: no window in between."""
    effects = _on_replica_info(s, event.info)  # which wakes writers when the sets change
    s.pending = None
    return effects + _recompute_confirm(s, event.info.log)


def _on_sync_state_set_failed(s: _State, event: SyncStateSetFailed) -> list[Effect]:
    """Refused: it never applies, stop counting it. Otherwise keep counting the union:
    fenced, until the refresh shows the newer epoch; uncertain, until the same proposal,
    sent again every PROPOSAL_RETRY_INTERVAL_MS, gets a definitive answer. A member not
    alive refuses this copy only: if an earlier copy went unanswered it may still apply
    (with the liveness of its own moment), so the union is counted as for no answer."""
    pending = s.pending
    outcome = event.outcome
    if outcome is ProposalOutcome.NOT_ALIVE:
        only_copy = pending is None or pending.attempts == 1
        outcome = ProposalOutcome.REFUSED if only_copy else ProposalOutcome.UNCERTAIN
    if pending is not None and outcome is ProposalOutcome.REFUSED:
        sets_before = _ack_sets(s)
        s.pending = None  # planned again (maybe the same) after a pause: no refusal loop
        s.next_plan_ms = event.now_ms + PROPOSAL_RETRY_INTERVAL_MS
        return [RequestRefresh(), *_wake_if_ack_sets_changed(s, sets_before)]
    if pending is not None:
        pending.retry_ms = event.now_ms + PROPOSAL_RETRY_INTERVAL_MS
    return [RequestRefresh()]


def _on_heartbeat_answered(s: _State, reply: HeartbeatAnswered) -> list[Effect]:
    s.newest_master_epoch_seen = max(s.newest_master_epoch_seen, reply.master_epoch)
    effects: list[Effect] = []
    if s.role == Role.MASTER and (
        reply.master_broker_id != s.broker_id or reply.master_epoch != s.master_epoch
    ):
        s.lease.revoke()  # the controller names another master: stop writing now
        effects += [LeaseRevoked(reply.master_broker_id, reply.master_epoch), WakeWaiters()]
    else:
        s.lease.renew(reply.sent_ms, reply.lease_ms or None)
    stale = (
        reply.master_broker_id != s.master_broker_id
        or reply.master_epoch != s.master_epoch
        or reply.sync_state_set_epoch != s.sync_state_set_epoch
    )
    return effects + ([RequestRefresh()] if stale else [])


def _on_tick(s: _State, tick: Tick) -> list[Effect]:
    effects = _handoff_grace_over(s, tick.now_ms)
    pending = s.pending
    if s.role != Role.MASTER:
        return effects
    if pending is not None:
        if not pending.retry_ms or tick.now_ms < pending.retry_ms:
            return effects  # in flight, or not yet time to send it again
        pending.retry_ms, pending.attempts = 0, pending.attempts + 1
        retry = ProposeSyncStateSet(s.broker_id, pending.master_epoch, pending.base_epoch, pending.members)
        return effects + [retry]
    if tick.now_ms < s.next_plan_ms:
        return effects
    plan = s.tracker.plan(
        tick.now_ms,
        s.broker_id,
        list(s.sync_state_set),
        s.confirm_offset,
        tick.log.epoch_start,
        set(s.registered_ids),
    )
    if plan is None:
        return effects
    s.pending = _PendingChange(tuple(plan), s.sync_state_set_epoch, s.master_epoch)
    return effects + [ProposeSyncStateSet(s.broker_id, s.master_epoch, s.sync_state_set_epoch, tuple(plan))]


def _handoff_grace_over(s: _State, now_ms: int) -> list[Effect]:
    """A failed handoff's election can no longer commit: take writes again."""
    handoff = s.handoff
    if handoff is None or not handoff.failed_ms or now_ms - handoff.failed_ms <= s.pending_grace_ms:
        return []
    s.departure, s.handoff = Departure.STAYING, None
    return [WakeWaiters()]


def _on_appended(s: _State, event: Appended) -> list[Effect]:
    return [*_recompute_confirm(s, event.log), WakeWaiters()]  # also wakes long-polling fetches


def _on_sync_starting(s: _State, event: SyncStarting) -> list[Effect]:
    if s.sync_started_ms is None:
        s.sync_started_ms = event.now_ms
    return []


def _on_synced(s: _State, event: Synced) -> list[Effect]:
    s.sync_started_ms = None
    return [*_recompute_confirm(s, event.log), WakeWaiters()]


def _on_slave_fetch(s: _State, fetch: SlaveFetch) -> list[Effect]:
    """The master's side of a fetch: refuse, ask for a truncation, point to the tiered
    store, or record the fetch offset as the slave's ack and serve from it."""
    refusal = _fetch_refusal(s, fetch.master_epoch)
    if refusal:
        return refusal
    log = fetch.log
    cut = _untrusted_cut(s, fetch)
    if cut is not None:
        return [AnswerFetch(truncate_to=cut)]
    if fetch.handshake or fetch.fetch_offset > log.max_offset:
        point = truncation_point(fetch.epoch_entries, fetch.fetch_offset, log.epochs, log.max_offset)
        if point is not None:
            return [AnswerFetch(truncate_to=point)]
    if fetch.fetch_offset < log.min_offset:
        return [AnswerFetch(moved_to_tiered=True)]  # retention deleted it here
    effects: list[Effect] = []
    if fetch.broker_id in s.registered_ids:
        progress = s.tracker.slaves.get(fetch.broker_id)
        acked_before = 0 if progress is None else progress.acked_offset
        # what the master can serve is its durable log: caught up means holding all of it
        s.tracker.on_fetch(fetch.broker_id, fetch.fetch_offset, log.durable, fetch.now_ms, fetch.leaving)
        confirmed = _recompute_confirm(s, log)  # [] or [NoteConfirm, WakeWaiters]
        effects += confirmed
        if (
            not confirmed
            and not s.policy.all_ack_in_sync_state_set
            and fetch.fetch_offset > acked_before
            and fetch.broker_id in _counted(s)
        ):
            # Acks from in_sync_replicas copies: a counted member's higher ack may complete
            # writes that the confirm offset (every member's) does not cover yet; their
            # writers look again now, not when the slowest member acks or their wait's poll
            # interval ends.
            effects.append(WakeWaiters())
    return [*effects, AnswerFetch(from_offset=fetch.fetch_offset)]


def _untrusted_cut(s: _State, fetch: SlaveFetch) -> int | None:
    """Where a slave must cut before this master, in an epoch it re-adopted, serves or
    counts it (None: it may be served). Below reopened_at the slave's bytes are this log's
    (durable here, and what this master served before); past it they may be bytes an
    earlier process served and a power loss took from here: never acknowledged (an ack
    needs the master's own fsync) and maybe different from what this log holds there now."""
    reopened_at = s.reopened_at
    if reopened_at is None or fetch.broker_id in s.trusted:
        return None
    if fetch.fetch_offset <= reopened_at:
        s.trusted.add(fetch.broker_id)  # from now on it holds only what this process serves
        return None
    log = fetch.log
    point = (
        truncation_point(fetch.epoch_entries, fetch.fetch_offset, log.epochs, log.max_offset)
        if fetch.handshake
        else None
    )
    return reopened_at if point is None else min(point, reopened_at)


def _on_fetch_still_waiting(s: _State, event: FetchStillWaiting) -> list[Effect]:
    return _fetch_refusal(s, event.master_epoch)


def _on_fetch_answered(s: _State, event: FetchAnswered) -> list[Effect]:
    if s.role == Role.MASTER and event.broker_id in s.registered_ids:
        s.tracker.on_answer(event.broker_id, event.log.durable, event.now_ms)
    return []


def _on_master_answered(s: _State, answer: MasterAnswered) -> list[Effect]:
    """The slave's side: cut at the consistent point the master named, or append."""
    if not _follows(s, answer.session):
        return []
    effects: list[Effect] = [RequestRefresh()] if answer.master_epoch > s.master_epoch else []
    if answer.truncate_to >= 0:
        if answer.truncate_to < answer.log.max_offset:
            effects.append(Truncate(answer.truncate_to, answer.master_epoch))
        return effects
    if answer.data:
        effects.append(AppendReplicated(answer.data_offset, answer.data))
    return effects


def _on_replicated(s: _State, event: Replicated) -> list[Effect]:
    if not _follows(s, event.session):
        return []
    s.confirm_offset = min(event.confirm_offset, event.log.max_offset)
    return [
        _note(
            s,
        )
    ]


def _on_upload_starting(s: _State, event: UploadStarting) -> list[Effect]:
    """T1: nothing beyond the confirm offset is uploaded; the audit's evidence of the
    confirm offset is written before the upload starts."""
    if s.role != Role.MASTER or event.end_offset > s.confirm_offset:
        error = FailedPrecondition(
            f"an upload ending at {event.end_offset} is past the confirm offset {s.confirm_offset} "
            f"of this {s.role.value.lower()}"
        )
        return [Refuse(error)]
    return [_note(s, force=True)]


def _on_master_unreachable(s: _State, event: MasterUnreachable) -> list[Effect]:
    recent = s.reported_ms is not None and event.now_ms - s.reported_ms < REPORT_INTERVAL_MS
    if not _follows(s, event.session) or recent:
        return []
    s.reported_ms = event.now_ms
    return [ReportMasterUnreachable(s.master_broker_id, s.master_epoch)]


def _on_handoff_start(s: _State, event: HandoffStart) -> list[Effect]:
    if s.role != Role.MASTER:
        not_master = f"broker {s.broker_id} of {s.broker_name} is {s.role.value}, not the master"
        return [Refuse(NotMaster(f"{not_master}; hand off on the master", leader=s.master_address))]
    if s.handoff is not None and s.handoff.failed_ms:
        error = FailedPrecondition(
            f"a handoff of master {s.broker_id} of {s.broker_name} failed at {s.handoff.failed_ms} ms and "
            f"its election may still commit; writes resume {s.pending_grace_ms} ms after it: retry then"
        )
        return [Refuse(error)]
    if s.departure is Departure.HANDING_OFF:
        return []  # already under way (SIGTERM during an admin handoff): the caller waits for it
    if s.departure is Departure.LEAVING:
        return [Refuse(FailedPrecondition(f"broker {s.broker_id} of {s.broker_name} is shutting down"))]
    s.departure = Departure.HANDING_OFF
    s.handoff = _Handoff(event.deadline_ms, event.preferred_broker_id, event.then_leave)
    return [WakeWaiters()]


def _successor(s: _State) -> tuple[int, int] | None:
    """The in-sync slave to hand off to (the preferred one, else the one that holds the
    most; not one that is leaving) and how far it holds the log."""
    assert s.handoff is not None
    acked = s.tracker.acked()
    candidates = [i for i in s.sync_state_set if i != s.broker_id and i not in s.tracker.leaving]
    preferred = s.handoff.preferred_broker_id
    if preferred:
        candidates = [i for i in candidates if i == preferred]
    if not candidates:
        return None
    best = max(candidates, key=lambda i: (acked.get(i, 0), -i))
    return best, acked.get(best, 0)


def _on_handoff_tick(s: _State, tick: HandoffTick) -> list[Effect]:
    """Elect the successor once it holds every byte this master appended (so it holds
    every acknowledged write, whatever the ack policy) and every write in flight is
    acknowledged, or at the deadline if it holds everything by then; else give up."""
    handoff = s.handoff
    if s.role != Role.MASTER or handoff is None or handoff.asked:
        return []
    successor = _successor(s)
    name = f"{s.broker_name} (master {s.broker_id})"
    if successor is None:
        which = f"slave {handoff.preferred_broker_id}" if handoff.preferred_broker_id else "slave"
        error = FailedPrecondition(
            f"no in-sync {which} of {name} can take over: the SyncStateSet is "
            f"{list(s.sync_state_set)}; wait until a slave has caught up",
            code="NO_IN_SYNC_SLAVE",
        )
        return _abort_handoff(s, error)
    broker_id, held = successor
    end = tick.log.max_offset
    drained = s.confirm_offset >= end
    if held >= end and (drained or tick.now_ms >= handoff.deadline_ms):
        handoff.asked = True
        return [ElectSuccessor(broker_id, s.master_epoch)]
    if tick.now_ms >= handoff.deadline_ms:
        error = FailedPrecondition(
            f"in-sync slave {broker_id} of {name} holds {held} of the {end} bytes appended "
            "and did not catch up in time; writes resume here",
            code="NO_IN_SYNC_SLAVE",
        )
        return _abort_handoff(s, error)
    return []


def _abort_handoff(s: _State, error: MqmetaError) -> list[Effect]:
    s.departure, s.handoff = Departure.STAYING, None
    return [WakeWaiters(), Refuse(error)]


def _on_handoff_failed(s: _State, event: HandoffFailed) -> list[Effect]:
    """Writes stay refused (see the module's docstring); a refresh shows whether the
    election committed after all."""
    if s.departure is Departure.HANDING_OFF and s.handoff is not None:
        s.handoff.failed_ms = max(1, event.now_ms)
    return [RequestRefresh()]


def _on_leave(s: _State, event: Leave) -> list[Effect]:
    if s.role == Role.MASTER:
        error = FailedPrecondition(f"broker {s.broker_id} of {s.broker_name} is the master: hand off instead")
        return [Refuse(error)]
    s.departure = Departure.LEAVING
    return []


def _on_corruption_found(s: _State, event: CorruptionFound) -> list[Effect]:
    if s.role != Role.SLAVE:
        return []
    effects = _new_session(s)  # the fetcher stops: no append may race the cut
    fetch = StartFetching(s.fetch_session, s.master_broker_id, s.master_address, s.master_epoch)
    return [*effects, Truncate(event.offset, s.master_epoch), fetch]


def _on_fence(s: _State, event: Fence) -> list[Effect]:
    effects = _new_session(s)
    s.role = Role.FENCED
    return [*effects, WakeWaiters()]


def _on_disk_failed(s: _State, event: DiskFailed) -> list[Effect]:
    """Fenced for good; a master also names the in-sync slave to elect in its place: the
    one that holds the most, if it holds every acknowledged byte (the confirm offset)."""
    was_master = s.role == Role.MASTER
    effects = _new_session(s)
    s.role = Role.FENCED
    s.disk_failed = True
    if was_master and s.departure is not Departure.LEAVING:
        acked = s.tracker.acked()
        holders = [i for i in s.sync_state_set if i != s.broker_id and acked.get(i, 0) >= s.confirm_offset]
        if holders:
            successor = max(holders, key=lambda i: (acked.get(i, 0), -i))
            effects.append(ElectSuccessor(successor, s.master_epoch))
    return [*effects, WakeWaiters()]


def _on_stop(s: _State, event: Stop) -> list[Effect]:
    effects = _on_fence(s, Fence("stopping"))
    s.stopped = True
    return effects


# each handler takes its own event type; the table is keyed by that type
_HANDLERS: dict[type, Callable[[_State, Any], list[Effect]]] = {
    Registered: _on_registered,
    ReplicaInfo: _on_replica_info,
    SyncStateSetChanged: _on_sync_state_set_changed,
    SyncStateSetFailed: _on_sync_state_set_failed,
    HeartbeatAnswered: _on_heartbeat_answered,
    Tick: _on_tick,
    Appended: _on_appended,
    SyncStarting: _on_sync_starting,
    Synced: _on_synced,
    SlaveFetch: _on_slave_fetch,
    FetchStillWaiting: _on_fetch_still_waiting,
    FetchAnswered: _on_fetch_answered,
    MasterAnswered: _on_master_answered,
    Replicated: _on_replicated,
    UploadStarting: _on_upload_starting,
    MasterUnreachable: _on_master_unreachable,
    CorruptionFound: _on_corruption_found,
    HandoffStart: _on_handoff_start,
    HandoffTick: _on_handoff_tick,
    HandoffFailed: _on_handoff_failed,
    Leave: _on_leave,
    Fence: _on_fence,
    DiskFailed: _on_disk_failed,
    Stop: _on_stop,
}
