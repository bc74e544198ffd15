"""The thin shell that runs the pure state machine on pysyncobj.

One Raft entry carries a batch of commands (group commit): the Raft tick takes
whatever callers are waiting when the previous batch is still in flight (Proposer.pump),
so one sequential caller pays one round trip, and sixteen concurrent callers share one.
pysyncobj runs with appendEntriesUseBatch=False, so every entry is sent at once.

Effects happen in one order per entry: apply (pure) -> applied-entry log -> command
history (controller/command_history.py) -> wake the callers and the watchers.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.controller import pysyncobj_compat
from mqmeta.controller.applied_log import AppliedLog
from mqmeta.controller.command_history import CommandHistory
from mqmeta.controller.commands import Command, Undecodable, command_json, decode_entry, encode_entry
from mqmeta.controller.journal import DurableJournal, fail_stop, reconcile_with_snapshot
from mqmeta.controller.repair import (
    SCRUB_INTERVAL_S_DEFAULT,
    RaftRepairStats,
    RaftScrubber,
    discard_damaged,
    inspect_data_dir,
)
from mqmeta.controller.snapshot import StateSnapshots, guarded_replace
from mqmeta.controller.state_machine import ControllerState, apply
from pysyncobj import FAIL_REASON, SyncObjConf, replicated
from pysyncobj.journal import MemoryJournal

from mqmeta.dialmap import dial
from mqmeta.errors import DeadlineExceeded, InvalidArgument, MqmetaError, Unavailable
from mqmeta.formats.atomic import make_directories
from mqmeta.timing import PENDING_GRACE_MS, PROPOSAL_TIMEOUT_MS_DEFAULT, PROPOSAL_TIMEOUT_MS_MAX

RAFT_STATE_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER, as onStateChanged reports it
TRANSFER_POLL_INTERVAL_S = 0.01  # how often a stopping leader checks that another took over

log = logging.getLogger(__name__)

Json = dict[str, Any]
EventSink = Callable[[int, list[Json]], None]


@dataclass(frozen=True)
class Peer:
    id: str
    raft: str
    grpc: str


@dataclass(frozen=True)
class RaftSettings:
    heartbeat_ms: int = 50
    election_min_ms: int = 300
    election_max_ms: int = 600
    leader_fallback_ms: int = 1000
    connection_retry_ms: int = 100  # a restarted peer is dialed again within 0.1 s
    compaction_min_entries: int = 5000
    compaction_min_time_s: int = 300
    batch_commands_max: int = 512
    inflight_batches_max: int = 1
    queue_commands_max: int = 20_000
    proposal_timeout_ms: int = PROPOSAL_TIMEOUT_MS_DEFAULT
    journal_fsync: bool = True
    secret: str | None = None
    scrub_interval_s: int = SCRUB_INTERVAL_S_DEFAULT  # the journal and snapshot re-checked (P16)
    gc_thaw_interval_s: int = 600  # full GC passes examine what is new; 0: the collector as Python runs it

    def validate(self) -> None:
        if self.election_min_ms <= 3 * self.heartbeat_ms:
            raise InvalidArgument("election_min_ms must exceed 3 x heartbeat_ms")
        if self.election_max_ms <= self.election_min_ms:
            raise InvalidArgument("election_max_ms must exceed election_min_ms")
        if self.leader_fallback_ms <= self.heartbeat_ms:
            raise InvalidArgument("leader_fallback_ms must exceed heartbeat_ms")
        if self.proposal_timeout_ms > PROPOSAL_TIMEOUT_MS_MAX:
            raise InvalidArgument(
                f"proposal_timeout_ms must be at most {PROPOSAL_TIMEOUT_MS_MAX}: a broker resumes "
                f"writes {PENDING_GRACE_MS} ms after a proposal's outcome went unknown, so no "
                "proposal may commit later than that"
            )
        if not 1 <= self.scrub_interval_s <= 86_400:
            raise InvalidArgument("scrub_interval_s must be 1 to 86400")
        if not 0 <= self.gc_thaw_interval_s <= 86_400:
            raise InvalidArgument("gc_thaw_interval_s must be 0 (off) to 86400")
        for name in ("batch_commands_max", "inflight_batches_max", "queue_commands_max"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be at least 1")


def _syncobj_conf(
    settings: RaftSettings,
    data_dir: Path,
    bind_address: str | None = None,
    snapshots: StateSnapshots | None = None,
    on_state_changed: Callable[[int, int], None] | None = None,
) -> SyncObjConf:
    """pysyncobj's configuration for a node; with `snapshots`, the state snapshot is
    written beside the Raft thread (controller/snapshot.py), else pysyncobj's own."""
    hooks = {}
    if snapshots is not None:
        hooks = {
            "serializer": snapshots.serialize,
            "serializeChecker": snapshots.check,
            "deserializer": snapshots.deserialize,
        }
    if on_state_changed is not None:
        hooks["onStateChanged"] = on_state_changed
    return SyncObjConf(
        # The Raft port listens on its own address only (pysyncobj's default is every
        # interface): its wire format is pickle, reachable only where it must be.
        bindAddress=bind_address,
        password=settings.secret or None,
        appendEntriesUseBatch=False,
        appendEntriesPeriod=settings.heartbeat_ms / 1000,
        raftMinTimeout=settings.election_min_ms / 1000,
        raftMaxTimeout=settings.election_max_ms / 1000,
        leaderFallbackTimeout=settings.leader_fallback_ms / 1000,
        connectionTimeout=max(settings.election_max_ms / 1000, 1.0),
        connectionRetryTime=settings.connection_retry_ms / 1000,
        logCompactionMinEntries=settings.compaction_min_entries,
        logCompactionMinTime=settings.compaction_min_time_s,
        journalFile=str(data_dir / "raft.journal"),
        fullDumpFile=str(data_dir / "raft.snapshot"),
        commandsWaitLeader=True,
        dynamicMembershipChange=False,
        # No forked snapshot writer: it outlives a kill -9 of the node and can replace a
        # newer snapshot with its older one after the restart (with `snapshots`, pysyncobj
        # never forks: the writer is a thread of this process, joined on close).
        useFork=False,
        **hooks,
    )


_JOURNAL_FSYNC: dict[str, bool] = {}


def _create_journal(journal_file: str | None):
    """pysyncobj's createJournal, replaced (see controller/journal.py for why)."""
    if journal_file is None:
        return MemoryJournal()
    return DurableJournal(Path(journal_file), fsync=_JOURNAL_FSYNC.get(journal_file, True))


def install_pysyncobj_patches() -> None:
    """Our journal and durable snapshots in pysyncobj (idempotent; every ControllerRaft
    calls it before constructing its SyncObj; the benchmark's raw nodes call it too)."""
    pysyncobj_compat.install(_create_journal, DurableJournal, guarded_replace)


class _DialingTransport(pysyncobj_compat.DialHookTransport):
    """Connects through the dial map (mqmeta/dialmap.py) so that the chaos suite's proxies
    sit on every Raft link; peers keep their real addresses as identities."""

    def dial_address(self, address: str) -> str:
        return dial(address)


class ControllerRaft(pysyncobj_compat.RaftFixes):
    """pysyncobj node whose replicated state is a ControllerState, with the Raft fixes of
    controller/pysyncobj_compat.py (NextIndexFix, HeldEntriesFix, InputFirstFix)."""

    def __init__(
        self,
        node_id: str,
        raft_address: str,
        peers: list[Peer],
        data_dir: Path,
        settings: RaftSettings,
        on_events: EventSink,
    ) -> None:
        settings.validate()
        install_pysyncobj_patches()
        make_directories(data_dir)
        self.repair_stats = RaftRepairStats()
        damage, loaded = inspect_data_dir(data_dir)  # the snapshot read once, for the load too
        if damage is not None:  # discarded, re-joined from the others (controller/repair.py)
            self.catch_up_index = discard_damaged(data_dir, damage)
            self.repair_stats.corruptions_found += 1
            self.repair_stats.repairs += 1
            self.repair_stats.catch_up_index = self.catch_up_index
        self._scrubber = RaftScrubber(data_dir, settings.scrub_interval_s, self.repair_stats)
        journal = data_dir / "raft.journal"
        reconcile_with_snapshot(
            journal, data_dir / "raft.snapshot", None if loaded is None else loaded.tail[:2]
        )
        _JOURNAL_FSYNC[str(journal)] = settings.journal_fsync
        # Attributes set before SyncObj.__init__ are runtime-only (not in snapshots).
        self._node_id = node_id
        self._journal_path = journal
        self._applied_log = AppliedLog(data_dir / "applied.jsonl", node_id)
        self._applied_pending: list[Json] = []  # the last entry's record, until _write_applied
        self.history = CommandHistory()  # what this node applied, for the history read
        self._on_events = on_events
        self._state = ControllerState()
        self._snapshots = StateSnapshots(lambda: self._state, self._install_state, loaded)
        self.on_applied: Callable[[float, int], None] | None = None  # (seconds, commands): metrics
        self._pump: Callable[[], None] | None = None  # Proposer.pump, on the tick thread
        self.leader_terms = 0  # how often this node became leader (metrics)
        others = [p.raft for p in peers if p.raft != raft_address]
        super().__init__(
            raft_address,
            others,
            _syncobj_conf(settings, data_dir, raft_address, self._snapshots, self._state_changed),
            transportClass=_DialingTransport,
        )
        self.addOnTickCallback(self._write_applied)  # a tick that applied but proposed nothing
        self._scrubber.start()

    @property
    def state(self) -> ControllerState:
        return self._state

    def attach_pump(self, pump: Callable[[], None]) -> None:
        """`pump` (Proposer.pump) runs at the start of every tick's _checkCommandsToApply,
        on the tick thread: what it proposes is appended and sent in the same tick."""
        self._pump = pump

    def wake_tick(self) -> None:
        """Any thread: the tick stops waiting in its poll (or does not start to)."""
        pysyncobj_compat.wake_tick(self)

    def _checkCommandsToApply(self) -> None:  # noqa: N802 - pysyncobj's name
        self._write_applied()
        if self._pump is not None:
            self._proposing_in_tick = True  # ProposeInTick: no wake-up for the tick's own proposals
            try:
                self._pump()
            finally:
                self._proposing_in_tick = False
        super()._checkCommandsToApply()

    def _state_changed(self, old_state: int, new_state: int) -> None:
        if new_state == RAFT_STATE_LEADER:
            self.leader_terms += 1
            log.info(
                "Raft leader now (term %d): %s",
                self.raftCurrentTerm,
                "the previous leader handed leadership over"
                if self.elected_by_hand_over()
                else "elected after an election timeout",
            )
        elif old_state == RAFT_STATE_LEADER:
            log.info("no longer the Raft leader (term %d)", self.raftCurrentTerm)

    def _install_state(self, state: ControllerState) -> None:
        """A snapshot was loaded (at start, or received from the leader): readers that
        hold the previous state finish with it; new ones get this one."""
        self._state = state

    def _entry_position(self) -> tuple[int, int]:
        index = self.raftLastApplied + 1  # pysyncobj counts an entry applied after it returns
        entries = pysyncobj_compat.entries_from(self, index, 1)
        return index, (entries[0][2] if entries else -1)

    @replicated
    def _apply_entry(self, payload: str) -> list[Json]:
        started = time.perf_counter()
        index, term = self._entry_position()
        commands = decode_entry(payload)
        results: list[Json] = []
        events: list[Json] = []
        effects: dict[str, Json | None] = {}
        for command in commands:
            result, command_events, changes = apply(self._state, command, index, term)
            results.append(result)
            events.extend(command_events)
            effects.update(changes)
        types = sorted({c.TYPE for c in commands})
        documents = [_logged(c) for c in commands]  # the line's and the history's
        self._write_applied()  # the previous entry's line, if no tick came between
        self._applied_pending.append(
            {
                "index": index,
                "term": term,
                "command_type": types[0] if len(types) == 1 else "batch",
                "command_digest": hashlib.sha256(payload.encode()).hexdigest(),
                "state_digest": self._state.digest,
                "commands": documents,
                "effects": effects,
            }
        )
        self.history.record(index, term, commands, results, documents)
        if events:
            if any("replica_info" in event for event in events):
                # A broker set changed (a new master, its replicas): as leader, send the
                # followers this commit index now, not with the next append or heartbeat,
                # so that watch streams on followers (a nameserver's route copy) learn it
                # as promptly as the leader's (SendBeforeSync._append_needed).
                self._commit_send_forced = True
            self._on_events(index, events)
        if self.on_applied is not None:
            self.on_applied(time.perf_counter() - started, len(commands))
        return results

    def leader_raft_address(self) -> str:
        return pysyncobj_compat.leader_address(self)

    def is_leader(self) -> bool:
        return pysyncobj_compat.is_leader(self)

    def current_term(self) -> int:
        return pysyncobj_compat.current_term(self)

    def status(self) -> Json:
        return self.getStatus()

    def hand_over_leadership(self, timeout_s: float) -> bool:
        """As leader: asks the most caught-up follower to take over now, and waits (bounded)
        until this node is no longer the leader. True if it is not the leader (any more)."""
        if not self.is_leader():
            return True
        self.request_leadership_transfer()
        deadline = time.monotonic() + timeout_s
        while self.is_leader() and time.monotonic() < deadline:
            time.sleep(TRANSFER_POLL_INTERVAL_S)
        return not self.is_leader()

    def _write_applied(self) -> None:
        """Appends the last applied entry's record to applied.jsonl, if not yet written, or
        stops the node as a failed journal write does (an exception here would end
        pysyncobj's tick thread and leave the node hanging). The Raft log holds the entry:
        the restart replays it and writes the record again.

        The record is made in _apply_entry but written after pysyncobj has called the
        entry's callbacks (the answers, handed to the event loop), in the same tick
        (_checkCommandsToApply, an on-tick callback) or before the next entry is applied:
        the line's encoding and its write are off the write's path, and the loop takes
        the GIL for the answer at that write's system call instead of at the end of the
        tick. Nothing is applied between the record and its write, so it holds the state
        it was made from; a kill -9 between the two loses the line as before (the replay
        writes it)."""
        try:
            record = self._applied_pending.pop()  # atomic: close() may race a last tick
        except IndexError:
            return
        try:
            self._applied_log.append(record)
        except OSError as error:
            fail_stop(self._journal_path, "a write of the applied-command log applied.jsonl", error, False)

    def close(self) -> None:
        self._scrubber.stop()
        self.destroy()
        self._write_applied()
        self._snapshots.close()
        self._applied_log.close()


def _logged(command: Command) -> Json:
    """A command as the applied-entry log shows it (what could not be decoded, as such)."""
    if isinstance(command, Undecodable):
        return {"type": command.TYPE, "reason": command.reason}
    return command_json(command)


class CommandGroup:
    """Several independent commands of one caller (a `Write` batch) with one future for
    all their outcomes: a Future (and its Condition) per command cost the leader a fifth
    of its CPU in a bulk load. The commands may land in different Raft entries; each is
    settled once, with its result or the error that ended it."""

    __slots__ = ("future", "_outcomes", "_remaining", "_lock")

    def __init__(self, count: int) -> None:
        self.future: Future = Future()
        self.future.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it
        self._outcomes: list[Json | MqmetaError | None] = [None] * count
        self._remaining = count
        self._lock = threading.Lock()

    def settle(self, index: int, outcome: Json | MqmetaError) -> None:
        with self._lock:
            if self._outcomes[index] is not None:
                return
            self._outcomes[index] = outcome
            self._remaining -= 1
            finished = self._remaining == 0
        if finished:
            self.future.set_result(list(self._outcomes))

    def outcomes(self) -> list[Json | MqmetaError | None]:
        """What is settled so far (None: not yet)."""
        with self._lock:
            return list(self._outcomes)


Deliver = Callable[[Json | MqmetaError], None]  # called once, on the Raft thread, with the outcome

# Where a command's outcome goes: its own future, its place in a CommandGroup, or a
# function that hands it on (a coroutine's waiter: no Future, no Condition in between).
Target = Future | tuple[CommandGroup, int] | Deliver


def _settle(target: Target, outcome: Json | MqmetaError) -> None:
    if isinstance(target, tuple):
        target[0].settle(target[1], outcome)
    elif isinstance(target, Future):
        if not target.done():
            if isinstance(outcome, MqmetaError):
                target.set_exception(outcome)
            else:
                target.set_result(outcome)
    else:
        target(outcome)


class _Batch:
    def __init__(self, targets: list[Target]) -> None:
        self.targets = targets
        self.started = time.monotonic()
        self.done = False


class Proposer:
    """Group commit: batches waiting commands into one Raft entry, with bounds.

    The Raft node's tick takes the batches (`pump`, at the start of every tick's
    _checkCommandsToApply, ControllerRaft.attach_pump), so a command goes from the caller's
    thread straight to the thread that appends and sends it: a proposer thread of its own
    cost every write one more thread hand-off (and a Condition.notify per command, a
    twentieth of the leader's GIL time with 16 writers), and the batch waiting when the
    previous one committed went out a tick later than it could. `wake` (the tick's
    wake-up, ControllerRaft.wake_tick) is called when the queue becomes non-empty; the
    tick takes every command queued by then. Each tick also fails batches that pysyncobj
    never answered within proposal_timeout_ms."""

    def __init__(self, raft: ControllerRaft, settings: RaftSettings, wake: Callable[[], None]) -> None:
        self._raft = raft
        self._settings = settings
        self._wake = wake
        self._lock = threading.Condition()
        self._queue: deque[tuple[Command, Target]] = deque()
        self._inflight: deque[_Batch] = deque()
        self._stopped = False
        self._paused = False  # draining before a leadership handover: nothing new is sent

    def submit(self, command: Command) -> Future:
        future: Future = Future()
        future.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it
        self.submit_to(command, future)
        return future

    def submit_to(self, command: Command, target: Target) -> None:
        """Queues `command`; its outcome goes to `target` once (a Deliver function is called
        on the Raft thread, or on the caller's for a command never proposed)."""
        with self._lock:
            if self._stopped:
                raise Unavailable("this controller node is shutting down; try another node")
            if len(self._queue) >= self._settings.queue_commands_max:
                raise Unavailable("controller proposal queue is full; retry with backoff")
            was_empty = not self._queue
            self._queue.append((command, target))
        if was_empty:
            self._wake()

    def submit_group(self, commands: list[Command]) -> CommandGroup:
        """Queues every command or none (a full queue refuses the whole group)."""
        group = CommandGroup(len(commands))
        with self._lock:
            if self._stopped:
                raise Unavailable("this controller node is shutting down; try another node")
            if len(self._queue) + len(commands) > self._settings.queue_commands_max:
                raise Unavailable("controller proposal queue is full; retry with backoff")
            was_empty = not self._queue
            self._queue.extend((command, (group, i)) for i, command in enumerate(commands))
        if was_empty:
            self._wake()
        return group

    def propose(self, command: Command, timeout_s: float) -> Json:
        """Submits and waits; raises DeadlineExceeded when the outcome is unknown."""
        future = self.submit(command)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            raise not_committed(command, timeout_s) from None

    def drain(self, timeout_s: float) -> bool:
        """Sends nothing new from now on (waiting commands stay queued, and fail with
        Unavailable at stop(): never proposed, so a client's retry elsewhere is safe) and
        waits, bounded, until every batch sent has its answer. True if none is left."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._paused = True
            while self._inflight and time.monotonic() < deadline:
                self._lock.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
            return not self._inflight

    def stop(self) -> None:
        """Fails every command still queued (never proposed) and takes no more."""
        with self._lock:
            self._stopped = True
            waiting = [target for _, target in self._queue]
            self._queue.clear()
            self._lock.notify_all()
        _fail(waiting, Unavailable("controller node stopped"))

    def pump(self) -> None:
        """The Raft tick: proposes the waiting commands, as entries of up to
        batch_commands_max, while fewer than inflight_batches_max are in flight."""
        self._expire_inflight(self._settings.proposal_timeout_ms / 1000)
        while True:
            with self._lock:
                if not self._ready_to_send():
                    return
                take = min(len(self._queue), self._settings.batch_commands_max)
                items = [self._queue.popleft() for _ in range(take)]
                batch = _Batch([target for _, target in items])
                self._inflight.append(batch)
            payload = encode_entry([c for c, _ in items])
            self._raft._apply_entry(payload, callback=lambda res, err, b=batch: self._done(b, res, err))

    def _ready_to_send(self) -> bool:
        return (
            not self._stopped
            and not self._paused
            and bool(self._queue)
            and len(self._inflight) < self._settings.inflight_batches_max
        )

    def _expire_inflight(self, timeout_s: float) -> None:
        # pysyncobj may never call back for a command lost in a leader change.
        now = time.monotonic()
        expired: list[_Batch] = []
        with self._lock:
            while self._inflight and now - self._inflight[0].started > timeout_s:
                batch = self._inflight.popleft()
                batch.done = True
                expired.append(batch)
            if expired:
                self._lock.notify_all()
        for batch in expired:
            _fail(
                batch.targets, DeadlineExceeded("the commit of this write timed out; its outcome is unknown")
            )

    def _done(self, batch: _Batch, results: list[Json] | None, error: int) -> None:
        with self._lock:
            if batch.done:
                return
            batch.done = True
            self._inflight.remove(batch)
            self._lock.notify_all()
        if error == FAIL_REASON.SUCCESS and results is not None:
            for target, result in zip(batch.targets, results, strict=True):
                _settle(target, result)
        else:
            _fail(batch.targets, Unavailable(_fail_reason_text(error)))


def not_committed(command: Command, timeout_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"the controller did not commit {command.TYPE} within {timeout_s:.1f}s "
        "(no quorum or leader election in progress); its outcome is unknown"
    )


def _fail(targets: list[Target], error: MqmetaError) -> None:
    for target in targets:
        _settle(target, error)


_NEVER_APPENDED = (FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER)


def _fail_reason_text(error: int) -> str:
    names = {
        FAIL_REASON.QUEUE_FULL: "the Raft queue is full",
        FAIL_REASON.MISSING_LEADER: "there is no Raft leader",
        FAIL_REASON.DISCARDED: "the entry was discarded by a new leader",
        FAIL_REASON.NOT_LEADER: "the node it was forwarded to is not (or no longer) the leader",
        FAIL_REASON.LEADER_CHANGED: "the leader changed",
    }
    reason = names.get(error, f"pysyncobj failure {error}")
    if error in _NEVER_APPENDED:  # refused before any log took it
        return f"the write was not committed: {reason}; nothing was written, retry"
    return f"the write was not committed: {reason}; its outcome may be unknown, retry"
