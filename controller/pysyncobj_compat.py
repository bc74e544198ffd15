"""Every place mqmeta reaches into pysyncobj's internals, checked when this module is imported.

pysyncobj 0.3.17 has no hooks for what mqmeta needs (a crash-safe journal, durable
snapshots, a transport that dials through the chaos suite's proxies, three Raft fixes), so
mqmeta overrides and replaces some of its private, name-mangled parts. This module is the
only one that names them. At import it checks that the installed pysyncobj is the pinned
version and that every name in REQUIREMENTS exists with the expected kind and is still
used where we hook in; otherwise it raises PysyncobjIncompatible naming each missing
name, so an upgrade fails when the controller starts instead of silently dropping a
durability fix.

Nothing is changed by importing this module, except what controller/pysyncobj_lazy_crypto.py
does before pysyncobj is imported (its encryptor without cryptography: controller/raft_ciphers.py).
What it provides, applied explicitly:
- install(journal_factory, journal_class, replace): the module-level replacements,
  install_journal_factory, install_durable_snapshots and install_prompt_first_tick
  (idempotent; ControllerRaft calls it before constructing its SyncObj);
- the serializer hooks (SyncObjConf serializer, serializeChecker, deserializer) are public
  configuration, but controller/snapshot.py relies on how Serializer calls them (a custom
  serializer may finish after it returns; the journal is compacted only once the checker
  says SUCCESS): REQUIREMENTS names what it relies on;
- NextIndexFix, HeldEntriesFix, SnapshotCommitFix, SnapshotTransferFix, InputFirstFix, ReadIndex,
  SendBeforeSync, ProposeInTick, PromptAppendOnConnect, PromptElectionFix, LeadershipTransfer
  and RaftFixes (all):
  SyncObj subclasses to inherit from;
- DialHookTransport: pysyncobj's TCP transport with a dial hook;
- AeadTcpConnection: pysyncobj's TCP connection sealing messages between two nodes of this
  version with AES-GCM (installed by install()), on QuietLinkFix: a link quiet both ways
  is not dropped as dead when it is next used;
- accessors: raft_journal, entries_from, leader_address, is_leader, read_snapshot_entries;
- wrap_tick and wrap_transport_send, for the benchmark's profiler only.
"""

from __future__ import annotations

import gzip
import inspect
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mqmeta.controller.pysyncobj_lazy_crypto  # noqa: F401 - before pysyncobj: its docstring says why
import pysyncobj.fast_queue
import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.tcp_server
import pysyncobj.transport
import pysyncobj.version
from mqmeta.controller import raft_ciphers
from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import CONNECTION_STATE, TCPTransport, TransportNotReadyError

from mqmeta.formats.atomic import fsync_dir

PINNED_VERSION = "0.3.17"  # equal to the pin in pyproject.toml (tests/test_pysyncobj_compat.py checks)

Entry = tuple[bytes, int, int]  # command, raft index, term: pysyncobj's journal entries


class PysyncobjIncompatible(ImportError):
    """The installed pysyncobj is not the one this compat layer was written against."""


# What we rely on --------------------------------------------------------------------------

ROUTINE = "a function"
PROPERTY = "a property"
ATTRIBUTE = "an attribute"
USES = "a name used by"  # the owner function's code refers to it: a hook it calls, an attribute it sets


@dataclass(frozen=True)
class Requirement:
    module: str  # "pysyncobj.syncobj"
    owner: str  # a dotted path inside the module ("SyncObj.__init__"), "" for the module itself
    name: str
    kind: str  # ROUTINE | PROPERTY | ATTRIBUTE | USES
    why: str

    def where(self) -> str:
        owner = f"{self.module}.{self.owner}" if self.owner else self.module
        return f"{owner}.{self.name}"


_SYNCOBJ, _SERIALIZER, _TRANSPORT, _JOURNAL, _TCP_SERVER, _CONNECTION, _FAST_QUEUE = (
    "pysyncobj.syncobj",
    "pysyncobj.serializer",
    "pysyncobj.transport",
    "pysyncobj.journal",
    "pysyncobj.tcp_server",
    "pysyncobj.tcp_connection",
    "pysyncobj.fast_queue",
)

REQUIREMENTS: tuple[Requirement, ...] = (
    # install_journal_factory
    Requirement(_SYNCOBJ, "", "createJournal", ROUTINE, "install_journal_factory replaces it"),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "createJournal", USES, "SyncObj creates its journal with it"),
    Requirement(_JOURNAL, "", "Journal", ATTRIBUTE, "the journal interface our journal must implement"),
    # pysyncobj_lazy_crypto: the module it replaces offers these two names, used here
    Requirement(_SYNCOBJ, "", "getEncryptor", ROUTINE, "pysyncobj_lazy_crypto provides it"),
    Requirement(_SYNCOBJ, "", "HAS_CRYPTO", ATTRIBUTE, "pysyncobj_lazy_crypto provides it"),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "getEncryptor", USES, "a node with a Raft secret builds its encryptor"
    ),
    # install_durable_snapshots
    Requirement(_SERIALIZER, "", "atomicReplace", ROUTINE, "install_durable_snapshots replaces it"),
    Requirement(
        _SERIALIZER, "Serializer.serialize", "atomicReplace", USES, "a snapshot is renamed into place"
    ),
    Requirement(
        _SERIALIZER, "Serializer.setTransmissionData", "atomicReplace", USES, "a received snapshot too"
    ),
    # controller/snapshot.py: the state snapshot is written beside the Raft thread
    Requirement(
        _SERIALIZER,
        "Serializer.serialize",
        "_Serializer__serializer",
        USES,
        "the custom serializer is called",
    ),
    Requirement(
        _SERIALIZER,
        "Serializer.checkSerializing",
        "_Serializer__serializeChecker",
        USES,
        "a snapshot still being written is reported through the checker",
    ),
    Requirement(
        _SERIALIZER,
        "Serializer.deserialize",
        "_Serializer__deserializer",
        USES,
        "the custom loader is called",
    ),
    # NextIndexFix and HeldEntriesFix
    Requirement(_SYNCOBJ, "SyncObj", "_SyncObj__onMessageReceived", ROUTINE, "the Raft fixes override it"),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "_SyncObj__onMessageReceived", USES, "it is the transport's callback"
    ),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__raftNextIndex", USES, "NextIndexFix keeps it"),
    Requirement(_SYNCOBJ, "SyncObj", "_SyncObj__sendNextNodeIdx", ROUTINE, "HeldEntriesFix acknowledges"),
    Requirement(_SYNCOBJ, "SyncObj", "raftCurrentTerm", PROPERTY, "HeldEntriesFix compares terms"),
    # SnapshotCommitFix
    Requirement(
        _SYNCOBJ,
        "SyncObj._SyncObj__onMessageReceived",
        "setTransmissionData",
        USES,
        "a follower installs a snapshot from an append_entries",
    ),
    Requirement(
        _SYNCOBJ,
        "SyncObj._SyncObj__onMessageReceived",
        "_SyncObj__raftCommitIndex",
        USES,
        "SnapshotCommitFix keeps it from rising on a snapshot message",
    ),
    Requirement(_SYNCOBJ, "SyncObj", "raftLastApplied", PROPERTY, "SnapshotCommitFix: what was installed"),
    # SnapshotTransferFix
    Requirement(_SYNCOBJ, "SyncObj", "_SyncObj__onNodeDisconnected", ROUTINE, "a lost link ends a transfer"),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "_SyncObj__onNodeDisconnected", USES, "it is the transport's callback"
    ),
    Requirement(
        _SYNCOBJ, "SyncObj", "_SyncObj__onBecomeLeader", ROUTINE, "a new leadership ends old transfers"
    ),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "_SyncObj__serializer", USES, "SnapshotTransferFix ends transfers"
    ),
    Requirement(
        _SERIALIZER, "Serializer", "cancelTransmisstion", ROUTINE, "SnapshotTransferFix ends a transfer"
    ),
    Requirement(
        _SERIALIZER, "Serializer.__init__", "_Serializer__transmissions", USES, "the transfers in flight"
    ),
    # InputFirstFix
    Requirement(_SYNCOBJ, "SyncObj._onTick", "_poller", USES, "a tick reads the network through it"),
    Requirement(
        _SYNCOBJ, "SyncObj._onTick", "_SyncObj__transport", USES, "InputFirstFix asks if it is ready"
    ),
    Requirement(_TRANSPORT, "TCPTransport", "ready", PROPERTY, "InputFirstFix reads only once connected"),
    # PromptElectionFix
    Requirement(_SYNCOBJ, "SyncObj._onTick", "_poller", USES, "a tick ends waiting for input"),
    Requirement(
        _SYNCOBJ, "SyncObj._onTick", "_SyncObj__raftElectionDeadline", USES, "the wait ends at the deadline"
    ),
    # CatchUpFix
    Requirement(
        _SYNCOBJ, "SyncObj._onTick", "_SyncObj__raftElectionDeadline", USES, "CatchUpFix holds it off"
    ),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__raftCommitIndex", USES, "CatchUpFix waits for it"),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__raftLeader", USES, "CatchUpFix needs a leader"),
    # accessors
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__raftLog", USES, "raft_journal reads the journal"),
    Requirement(_SYNCOBJ, "SyncObj", "_SyncObj__getEntries", ROUTINE, "entries_from reads entries"),
    Requirement(_SYNCOBJ, "SyncObj", "raftLastApplied", PROPERTY, "the index of the entry being applied"),
    Requirement(_SYNCOBJ, "SyncObj", "_getLeader", ROUTINE, "leader_address"),
    Requirement(_SYNCOBJ, "SyncObj", "_isLeader", ROUTINE, "is_leader"),
    # LeadershipTransfer
    Requirement(_SYNCOBJ, "SyncObj", "transferLeadership", ROUTINE, "a stopping leader hands off"),
    Requirement(_SYNCOBJ, "FAIL_REASON", "SUCCESS", ATTRIBUTE, "transferLeadership's answer"),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "_SyncObj__transferInProgress", USES, "a successor took the request"
    ),
    Requirement(_SYNCOBJ, "SyncObj", "_SyncObj__onMessageReceived", ROUTINE, "timeout_now arrives in it"),
    Requirement(
        _SYNCOBJ, "SyncObj._onTick", "_SyncObj__raftElectionDeadline", USES, "a stopping node never stands"
    ),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__commandsQueue", USES, "no transfer while queued"),
    Requirement(_FAST_QUEUE, "FastQueue.__init__", "_FastQueue__queue", USES, "what is queued"),
    Requirement(
        _SYNCOBJ, "FAIL_REASON", "NOT_LEADER", ATTRIBUTE, "a stopping leader refuses forwarded writes"
    ),
    # benchmark profiling (wrap_tick, wrap_transport_send)
    Requirement(_SYNCOBJ, "SyncObj", "_onTick", ROUTINE, "wrap_tick wraps it"),
    Requirement(_SYNCOBJ, "SyncObj._autoTickThread", "_onTick", USES, "every tick runs it"),
    Requirement(_TRANSPORT, "TCPTransport", "send", ROUTINE, "wrap_transport_send wraps it"),
    # SendBeforeSync
    Requirement(_SYNCOBJ, "SyncObj._onTick", "_checkCommandsToApply", USES, "a tick proposes through it"),
    Requirement(_SYNCOBJ, "SyncObj", "_SyncObj__sendAppendEntries", ROUTINE, "SendBeforeSync holds it"),
    Requirement(_SYNCOBJ, "SyncObj._onTick", "_SyncObj__sendAppendEntries", USES, "a tick sends through it"),
    Requirement(_SYNCOBJ, "SyncObj._checkCommandsToApply", "_SyncObj__raftLog", USES, "it appends there"),
    Requirement(
        _SYNCOBJ, "SyncObj", "_SyncObj__getCurrentLogIndex", ROUTINE, "SendBeforeSync: is anything new"
    ),
    Requirement(
        _SYNCOBJ,
        "SyncObj._SyncObj__sendAppendEntries",
        "_SyncObj__newAppendEntriesTime",
        USES,
        "the next heartbeat is due then",
    ),
    Requirement(
        _SYNCOBJ, "SyncObj._checkCommandsToApply", "_SyncObj__sendAppendEntries", USES, "and sends at once"
    ),
    # ProposeInTick
    Requirement(_SYNCOBJ, "SyncObj", "_applyCommand", ROUTINE, "ProposeInTick queues without the wake-up"),
    Requirement(_SYNCOBJ, "SyncObj._applyCommand", "_SyncObj__commandsQueue", USES, "the queue it fills"),
    Requirement(_SYNCOBJ, "SyncObj._applyCommand", "_SyncObj__pipeNotifier", USES, "the wake-up it skips"),
    Requirement(_SYNCOBJ, "SyncObj._applyCommand", "_SyncObj__callErrCallback", USES, "a full queue"),
    Requirement(_SYNCOBJ, "SyncObj._applyCommand", "_bchr", USES, "the command type byte"),
    Requirement(_SYNCOBJ, "", "_bchr", ATTRIBUTE, "ProposeInTick prefixes the command type with it"),
    # ReadIndex
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__raftCommitIndex", USES, "ReadIndex records it"),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__noopIDx", USES, "ReadIndex waits for the no-op"),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__otherNodes", USES, "ReadIndex counts a majority"),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "_SyncObj__pipeNotifier", USES, "ReadIndex and wake_tick wake the tick"
    ),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__conf", USES, "wake_tick: is there a pipe notifier"),
    Requirement(_SYNCOBJ, "SyncObj._onTick", "_SyncObj__applyLogEntries", USES, "a tick applies, then polls"),
    Requirement(_SYNCOBJ, "", "PIPE_NOTIFIER_ENABLED", ATTRIBUTE, "ReadIndex wakes the tick if it can"),
    Requirement(_SYNCOBJ, "SyncObj", "addOnTickCallback", ROUTINE, "ReadIndex starts late reads there"),
    Requirement(
        _SYNCOBJ, "SyncObj._onTick", "_SyncObj__raftElectionDeadline", USES, "a vote hold holds it off"
    ),
    Requirement(_SYNCOBJ, "SyncObj", "transferLeadership", ROUTINE, "a leader gives its lease up in it"),
    Requirement(
        _SYNCOBJ, "SyncObj._onTick", "_SyncObj__onTickCallbacks", USES, "the callbacks run before the poll"
    ),
    # install_prompt_first_tick
    Requirement(_SYNCOBJ, "SyncObj", "_autoTickThread", ROUTINE, "install_prompt_first_tick replaces it"),
    # PromptAppendOnConnect
    Requirement(
        _SYNCOBJ, "SyncObj", "_SyncObj__onNodeConnected", ROUTINE, "PromptAppendOnConnect extends it"
    ),
    Requirement(
        _SYNCOBJ, "SyncObj.__init__", "_SyncObj__onNodeConnected", USES, "the transport's connect callback"
    ),
    Requirement(
        _SYNCOBJ,
        "SyncObj._onTick",
        "_SyncObj__newAppendEntriesTime",
        USES,
        "a leader sends once it has passed",
    ),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_autoTickThread", USES, "the tick thread runs it"),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__initialised", USES, "the constructor waits for it"),
    Requirement(_SYNCOBJ, "SyncObj.__init__", "_SyncObj__mainThread", USES, "the tick stops with it"),
    Requirement(
        _SYNCOBJ, "SyncObj._autoTickThread", "_SyncObj__destroying", USES, "destroy() stops the tick"
    ),
    Requirement(_SYNCOBJ, "SyncObj._autoTickThread", "_doDestroy", USES, "and cleans up in it"),
    Requirement(_SYNCOBJ, "SyncObj._autoTickThread", "tryGetReady", USES, "the transport binds first"),
    # DialHookTransport
    Requirement(
        _TRANSPORT, "TCPTransport", "_connectIfNecessarySingle", ROUTINE, "the dial hook overrides it"
    ),
    Requirement(
        _TRANSPORT,
        "TCPTransport._connectIfNecessary",
        "_connectIfNecessarySingle",
        USES,
        "it dials every peer",
    ),
    Requirement(_TRANSPORT, "TCPTransport", "_shouldConnect", ROUTINE, "the dial hook asks it"),
    Requirement(_TRANSPORT, "TCPTransport.__init__", "_connections", USES, "the dial hook connects these"),
    Requirement(_TRANSPORT, "TCPTransport.__init__", "_lastConnectAttempt", USES, "the dial hook's retry"),
    Requirement(_TRANSPORT, "TCPTransport.__init__", "_syncObj", USES, "the dial hook reads the conf"),
    Requirement(_TRANSPORT, "CONNECTION_STATE", "DISCONNECTED", ATTRIBUTE, "the dial hook's state check"),
    # AeadTcpConnection (install_raft_frames)
    Requirement(_TRANSPORT, "", "TcpConnection", ATTRIBUTE, "install_raft_frames replaces it"),
    Requirement(_TRANSPORT, "TCPTransport.addNode", "TcpConnection", USES, "outgoing connections"),
    Requirement(_TCP_SERVER, "", "TcpConnection", ATTRIBUTE, "install_raft_frames replaces it"),
    Requirement(
        _TCP_SERVER, "TcpServer._TcpServer__onNewConnection", "TcpConnection", USES, "incoming connections"
    ),
    Requirement(_CONNECTION, "TcpConnection", "send", ROUTINE, "AeadTcpConnection seals in it"),
    Requirement(
        _CONNECTION, "TcpConnection", "_TcpConnection__processParseMessage", ROUTINE, "it opens frames"
    ),
    Requirement(
        _CONNECTION,
        "TcpConnection._TcpConnection__processConnection",
        "_TcpConnection__processParseMessage",
        USES,
        "every message received is parsed by it",
    ),
    Requirement(_CONNECTION, "TcpConnection", "_TcpConnection__trySendBuffer", ROUTINE, "a frame is sent"),
    # QuietLinkFix
    Requirement(
        _CONNECTION, "TcpConnection", "_TcpConnection__processConnection", ROUTINE, "bytes in reach it first"
    ),
    Requirement(
        _CONNECTION,
        "TcpConnection._TcpConnection__processConnection",
        "_TcpConnection__processConnectionTimeout",
        USES,
        "the timeout is checked before the bytes are read",
    ),
    Requirement(
        _CONNECTION,
        "TcpConnection._TcpConnection__trySendBuffer",
        "_TcpConnection__processConnectionTimeout",
        USES,
        "the timeout is checked on every send",
    ),
    Requirement(_CONNECTION, "TcpConnection.__init__", "_TcpConnection__lastReadTime", USES, "the count"),
    Requirement(_CONNECTION, "TcpConnection.__init__", "_TcpConnection__timeout", USES, "connectionTimeout"),
    Requirement(_CONNECTION, "TcpConnection.__init__", "_TcpConnection__readBuffer", USES, "frames in"),
    Requirement(_CONNECTION, "TcpConnection.__init__", "_TcpConnection__writeBuffer", USES, "frames out"),
    Requirement(_CONNECTION, "TcpConnection.__init__", "sendRandKey", USES, "the peer's handshake key"),
    Requirement(_CONNECTION, "TcpConnection.__init__", "recvRandKey", USES, "this node's handshake key"),
    Requirement(_CONNECTION, "TcpConnection.__init__", "encryptor", USES, "the secret's keys"),
    Requirement(
        _TRANSPORT, "TCPTransport._onOutgoingConnected", "recvRandKey", USES, "the handshake key is sent"
    ),
    Requirement(
        _TRANSPORT,
        "TCPTransport._onIncomingMessageReceived",
        "recvRandKey",
        USES,
        "and answered with this node's key",
    ),
)


def _resolve(namespace: Mapping[str, Any], module: str, owner: str) -> Any:
    target = namespace[module]
    for part in owner.split(".") if owner else ():
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _problem(requirement: Requirement, namespace: Mapping[str, Any]) -> str:
    """'' when the requirement holds, else what is wrong with it."""
    owner = _resolve(namespace, requirement.module, requirement.owner)
    if owner is None:
        return f"{requirement.module}.{requirement.owner} is missing"
    if requirement.kind == USES:
        code = getattr(owner, "__code__", None)
        if code is None or requirement.name not in code.co_names:
            return f"{requirement.module}.{requirement.owner} no longer uses {requirement.name}"
        return ""
    if requirement.kind == PROPERTY:
        found = inspect.getattr_static(owner, requirement.name, None)
        ok = isinstance(found, property)
    else:
        found = getattr(owner, requirement.name, None)
        ok = inspect.isroutine(found) if requirement.kind == ROUTINE else found is not None
    if found is None:
        return f"{requirement.where()} is missing"
    if not ok:
        return f"{requirement.where()} is {type(found).__name__}, not {requirement.kind}"
    return ""


def verify(installed_version: str | None, namespace: Mapping[str, Any]) -> None:
    """Raises PysyncobjIncompatible naming every requirement that does not hold.

    `namespace` maps the module names of REQUIREMENTS to module objects (the real ones at
    import; tests pass doctored copies)."""
    problems = []
    if installed_version != PINNED_VERSION:
        problems.append(f"pysyncobj {installed_version or '(version unknown)'} is installed")
    for requirement in REQUIREMENTS:
        problem = _problem(requirement, namespace)
        if problem:
            problems.append(f"{problem} ({requirement.why})")
    if problems:
        raise PysyncobjIncompatible(
            f"mqmeta is written against pysyncobj=={PINNED_VERSION} (controller/pysyncobj_compat.py) "
            "and the installed pysyncobj does not match: "
            + "; ".join(problems)
            + f". Install pysyncobj=={PINNED_VERSION}, or port controller/pysyncobj_compat.py to "
            "the new version and re-run tests/test_pysyncobj_compat.py."
        )


def installed_version() -> str | None:
    """pysyncobj's own version constant (pysyncobj/version.py; pysyncobj writes it into its
    journals too). importlib.metadata, which reads the same from the installed package's
    metadata, would cost every controller 0.8 MB and its email-parsing imports."""
    return getattr(pysyncobj.version, "VERSION", None)


def real_namespace() -> dict[str, Any]:
    return {
        _SYNCOBJ: pysyncobj.syncobj,
        _SERIALIZER: pysyncobj.serializer,
        _TRANSPORT: pysyncobj.transport,
        _JOURNAL: pysyncobj.journal,
        _TCP_SERVER: pysyncobj.tcp_server,
        _CONNECTION: pysyncobj.tcp_connection,
        _FAST_QUEUE: pysyncobj.fast_queue,
    }


verify(installed_version(), real_namespace())  # at import: an upgrade fails here, loudly


# Module-level replacements (install) ---------------------------------------------------------

_STOCK_CREATE_JOURNAL = pysyncobj.syncobj.createJournal
_STOCK_ATOMIC_REPLACE = pysyncobj.serializer.atomicReplace

JournalFactory = Callable[[str | None], Any]


def journal_interface() -> list[str]:
    """The method names of pysyncobj's journal interface (what SyncObj may call)."""
    return sorted(
        name for name, value in vars(pysyncobj.journal.Journal).items() if inspect.isfunction(value)
    )


def install_journal_factory(factory: JournalFactory, journal_class: type) -> None:
    """Makes every SyncObj constructed from now on get its journal from `factory`.

    pysyncobj 0.3.17's FileJournal is an mmap without checksums or fsync and compacts in
    place (controller/journal.py says what goes wrong and what replaces it). SyncObj has no
    parameter for the journal: its constructor calls the module-level
    `pysyncobj.syncobj.createJournal(journalFile)`, so that name is the seam. The journal
    class must implement every method of pysyncobj's Journal interface (checked here, so a
    method added by a new pysyncobj is found at start, not when Raft first calls it)."""
    missing = [name for name in journal_interface() if not callable(getattr(journal_class, name, None))]
    if missing:
        raise PysyncobjIncompatible(
            f"{journal_class.__name__} lacks {missing} of pysyncobj's Journal interface; "
            "implement them before installing it"
        )
    pysyncobj.syncobj.createJournal = factory


def restore_stock_journal() -> None:
    """pysyncobj's own createJournal again (a benchmark experiment compares against it)."""
    pysyncobj.syncobj.createJournal = _STOCK_CREATE_JOURNAL


def durable_replace(source_path: str, target_path: str) -> None:
    """rename(source, target), made durable: the file's data before, the directory after.

    pysyncobj writes a snapshot (fullDumpFile) to `<file>.tmp` and renames it into place
    with plain os.rename, fsyncing neither the file nor the directory; on its next tick
    it compacts the journal up to the snapshot. After a power loss right after that, the
    node could find a torn or missing snapshot beside a journal that no longer holds the
    entries the snapshot replaced. pysyncobj (with useFork=False, which mqmeta uses) calls
    this in the tick thread and only compacts after it returned; if it raises, pysyncobj
    counts the snapshot as failed and keeps the journal. A snapshot received from the
    leader is installed through the same call, before pysyncobj clears the journal."""
    fd = os.open(source_path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the data of the file pysyncobj has just written and closed
    finally:
        os.close(fd)
    os.replace(source_path, target_path)
    fsync_dir(Path(target_path).parent)  # the rename itself


ReplaceFunction = Callable[[str, str], None]


def install_durable_snapshots(replace: ReplaceFunction = durable_replace) -> None:
    """Routes pysyncobj's snapshot rename (serializer.atomicReplace) through `replace`:
    durable_replace, or a function that ends in it (controller/snapshot.guarded_replace)."""
    pysyncobj.serializer.atomicReplace = replace


def restore_stock_snapshots() -> None:
    """pysyncobj's own rename again (tests show what it does without the fix)."""
    pysyncobj.serializer.atomicReplace = _STOCK_ATOMIC_REPLACE


_TICK_LOG = logging.getLogger("pysyncobj.syncobj")  # where pysyncobj's tick thread logs


def auto_tick_without_start_delay(node: Any) -> None:
    """pysyncobj's SyncObj._autoTickThread (the tick thread of a node with autoTick) less
    its 0.1 s sleep between binding the Raft port and the first tick: a restarting node
    read nothing for that long, not even the leader's heartbeat already in its socket (a
    seventh of its restart to serving). The rest is pysyncobj's loop as it is."""
    try:
        node._SyncObj__transport.tryGetReady()
    except TransportNotReadyError:
        _TICK_LOG.exception("failed to perform initialization")
        return
    finally:
        node._SyncObj__initialised.set()
    try:
        while True:
            if not node._SyncObj__mainThread.is_alive():
                break
            if node._SyncObj__destroying:
                node._doDestroy()
                break
            try:
                node._onTick(node._SyncObj__conf.autoTickPeriod)
            except Exception:
                _TICK_LOG.exception("failed _onTick in _autoTickThread")
                time.sleep(node._SyncObj__conf.autoTickPeriod)
    except ReferenceError:  # pysyncobj passes a weak proxy: the node is gone
        pass


_STOCK_AUTO_TICK_THREAD = SyncObj._autoTickThread


def install_prompt_first_tick() -> None:
    """Every SyncObj constructed from now on ticks as soon as its port is bound."""
    SyncObj._autoTickThread = auto_tick_without_start_delay  # type: ignore[method-assign]


def restore_stock_tick_thread() -> None:
    """pysyncobj's own tick thread again (its test shows the delay without the fix)."""
    SyncObj._autoTickThread = _STOCK_AUTO_TICK_THREAD  # type: ignore[method-assign]


def install(
    journal_factory: JournalFactory, journal_class: type, replace: ReplaceFunction = durable_replace
) -> None:
    """Applies the module-level replacements; idempotent (each just sets a name)."""
    install_journal_factory(journal_factory, journal_class)
    install_durable_snapshots(replace)
    install_prompt_first_tick()
    install_raft_frames()


def wrap_tick(wrapper: Callable[[Callable[..., Any], Any, float], Any]) -> None:
    """Benchmark profiling: every node's tick (SyncObj._onTick, pysyncobj's whole event
    loop step) runs as wrapper(original, node, time_to_wait). Not used by the controller."""
    original = SyncObj._onTick

    def tick(node: Any, timeToWait: float = 0.0) -> Any:  # pysyncobj's parameter name
        return wrapper(original, node, timeToWait)

    SyncObj._onTick = tick


def wrap_transport_send(wrapper: Callable[[Callable[..., Any], Any, Any, Any], Any]) -> None:
    """Benchmark profiling: every Raft message sent runs as wrapper(original, transport,
    node, message). Not used by the controller."""
    original = TCPTransport.send

    def send(transport: Any, node: Any, message: Any) -> Any:
        return wrapper(original, transport, node, message)

    TCPTransport.send = send


# Raft fixes (inherit from them) -----------------------------------------------------------


def _is_successful_ack(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("type") == "next_node_idx"
        and bool(message.get("success"))
        and not message.get("reset")
    )


class NextIndexFix(SyncObj):
    """Leader side: a successful acknowledgement never moves a follower's nextIndex back.

    On every successful `next_node_idx` that raises the follower's match index, pysyncobj
    0.3.17 sets nextIndex = acked + 1, even when later entries are already on their way
    (with appendEntriesUseBatch=False every entry is sent at once, so several appends are
    in flight). The next append then resends them, and a follower that receives entries it
    already holds truncates its log there and writes them again (see HeldEntriesFix). A
    reset (the follower's log does not match) still moves nextIndex where the follower
    says."""

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if not _is_successful_ack(message):
            super()._SyncObj__onMessageReceived(node, message)
            return
        next_index = self._SyncObj__raftNextIndex
        before = next_index.get(node)
        super()._SyncObj__onMessageReceived(node, message)
        if before is not None and next_index.get(node, before) < before:
            next_index[node] = before  # a success never moves the leader backwards


class HeldEntriesFix(SyncObj):
    """Follower side: entries already held (same index, same term) are not written again.

    pysyncobj 0.3.17 truncates a follower's log after the append's prevLogIdx whenever the
    follower holds more, and re-adds the entries it was sent. A kill -9 between that
    truncation and the rewrite drops entries the follower had acknowledged, which can lose
    a committed write. Raft's rule is to truncate only on a term conflict; this drops the
    leading entries of an append that the follower holds already (by Log Matching, same
    index and term is the same entry) and lets pysyncobj handle the rest."""

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and message.get("entries")
            and "transmission" not in message
        ):
            message = self._skip_held_entries(node, message)
            if message is None:
                return
        super()._SyncObj__onMessageReceived(node, message)

    def _skip_held_entries(self, node: Any, message: dict) -> dict | None:
        if message["term"] != self.raftCurrentTerm:
            return message  # a new term: let pysyncobj update term and leader first
        journal = self._SyncObj__raftLog
        entries = message["entries"]
        first_index = journal[0][1]
        held = 0
        for _, index, term in entries:
            position = index - first_index
            if position < 0 or position >= len(journal) or journal[position][2] != term:
                break
            held += 1  # same index and term: by Log Matching, the same entry
        if held == 0:
            return message
        if held < len(entries):
            _, index, term = entries[held - 1]
            return dict(message, entries=entries[held:], prevLogIdx=index, prevLogTerm=term)
        # Everything resent is already here: acknowledge it, truncate nothing.
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=entries[-1][1] + 1, success=True)
        return None


def _is_snapshot_message(message: Any) -> bool:
    """An append_entries that carries (a piece of) a snapshot, or none, instead of entries:
    pysyncobj sends one, without prevLogIdx, while a follower is behind its first entry."""
    return (
        isinstance(message, dict) and message.get("type") == "append_entries" and "prevLogIdx" not in message
    )


class SnapshotCommitFix(SyncObj):
    """Follower side: a snapshot message never raises the commit index over the follower's
    own, unmatched entries.

    pysyncobj 0.3.17 raises a follower's commit index to min(leader's commit, its last
    index) after every append_entries, including the ones that carry a snapshot (in 64 KB
    pieces, or `None` when the file cannot be read), which skip the log-matching check.
    A follower with entries the new leader never had (a deposed leader's uncommitted
    tail) is sent a snapshot when the leader has compacted past them; on the first piece
    it counts its own tail as committed and applies it, though the committed entries at
    those indexes are others (R1, log agreement, broken; and if the transfer stops there,
    the next leader's appends are applied on top: a diverged state). Raft commits only
    what the log-matching check has matched: here a snapshot message may raise the commit
    index only to what the installed snapshot holds (its last index, once the last piece
    arrived); the next append with prevLogIdx raises the rest."""

    _SyncObj__raftCommitIndex: int  # pysyncobj's, set in SyncObj.__init__

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - pysyncobj's name
        if not _is_snapshot_message(message):
            super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]
            return
        # pysyncobj raises the commit index only when the leader's is above the follower's
        capped = dict(message, commit_index=min(message["commit_index"], self._SyncObj__raftCommitIndex))
        super()._SyncObj__onMessageReceived(node, capped)  # type: ignore[misc]
        installed = self.raftLastApplied  # the snapshot's last index if one was installed
        if installed > self._SyncObj__raftCommitIndex:
            self._SyncObj__raftCommitIndex = installed  # a snapshot holds committed entries only
            self._SyncObj__raftLog.setRaftCommitIndex(installed)


class SnapshotTransferFix(SyncObj):
    """Both sides: a snapshot sent in pieces is received from its start, from one sender.

    pysyncobj 0.3.17 sends a snapshot file in pieces, each marked only first/last, and keeps
    each follower's transfer (an open file and its position) until the last piece. Two
    ways left a follower with pieces of different transfers glued into one file, which
    then fails its checks when loaded (the node stops, exit 70, and its restart discards it):
    - the leader keeps a transfer across a lost link: the pieces sent into the broken
      connection are gone, and once the link is back it goes on from where it was;
    - a leader deposed mid-transfer keeps the transfer, and when elected again goes on
      with it, while the follower meanwhile began another leader's.
    Here a lost link and a new leadership end the transfers (the next one starts from the
    first piece), and a follower takes a piece that is not a first one only from the node
    and term that sent the first piece of the file it is writing (others are ignored: the
    sender finds the follower behind when the transfer ends, and starts again)."""

    _snapshot_piece_source: tuple[Any, int] | None = None  # (sender, term) of the file's first piece

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        super()._SyncObj__onNodeDisconnected(node)  # type: ignore[misc]
        self._SyncObj__serializer.cancelTransmisstion(node)  # type: ignore[attr-defined]

    def _SyncObj__onBecomeLeader(self) -> None:  # noqa: N802 - pysyncobj's name
        serializer = self._SyncObj__serializer  # type: ignore[attr-defined]
        for node in list(serializer._Serializer__transmissions):
            serializer.cancelTransmisstion(node)
        super()._SyncObj__onBecomeLeader()  # type: ignore[misc]

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - pysyncobj's name
        if _is_snapshot_message(message) and message.get("serialized") is not None:
            _data, is_first, _is_last = message["serialized"]
            source = (node, message["term"])
            if is_first:
                self._snapshot_piece_source = source
            elif source != self._snapshot_piece_source:
                message = dict(message, serialized=None)  # not this file's: term and commit only
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]


class InputFirstFix(SyncObj):
    """Both sides: a tick reads the messages that have arrived before it decides anything.

    pysyncobj 0.3.17's tick decides first (a follower whose election timeout has passed
    starts an election; a leader that heard from no majority for leaderFallbackTimeout
    steps down) and reads the network last. After a stall of the node itself (a slow
    fsync, a starved CPU, a long GIL wait) the leader's heartbeats are already waiting in
    its socket, yet it starts an election: the term goes up and a healthy leader is
    deposed (81 leader changes in one run of bench/metadata_scale/ on a loaded
    machine). Reading first only moves input earlier within the tick; a node that really
    heard nothing still elects (or steps down) in the same tick as before."""

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        if self._SyncObj__transport.ready:
            self._poller.poll(0)
        super()._onTick(timeToWait)


class PromptElectionFix(SyncObj):
    """Follower side: a tick that would wait past the election deadline waits only until it.

    pysyncobj 0.3.17 checks the deadline at the start of a tick and then waits for input
    up to autoTickPeriod (50 ms): a follower whose leader fell silent stood up to 50 ms
    after its deadline, at the first tick after it. The two followers of a dead leader
    tick on the same events (their retries to it start together), so two deadlines
    within one period became two candidacies within a millisecond or two, and a split
    vote (another 0.3-0.6 s of election timeout), in about one kill -9 in ten. A
    deadline already passed (a node connected to no one does not stand) leaves the wait
    as it is: the tick never spins."""

    _SyncObj__raftElectionDeadline: float  # pysyncobj's, set in SyncObj.__init__

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        if timeToWait > 0 and not self._isLeader():
            left = self._SyncObj__raftElectionDeadline - monotonic_time()
            if 0 < left < timeToWait:
                timeToWait = left
        super()._onTick(timeToWait)


class PromptAppendOnConnect(SyncObj):
    """Leader side: a node that (re)connects is sent append_entries on the next tick, not
    at the next heartbeat.

    pysyncobj 0.3.17 only records the new connection; the node hears of its leader when
    the leader's appendEntriesPeriod (heartbeat_ms) next comes round, so a restarted node
    waited up to a heartbeat after it was connected before it knew whom to ask and could
    serve a read. The connect callback runs in the tick thread; setting the next send time
    to now makes that tick (or the next) send to every follower, which only costs one
    heartbeat round early."""

    def _SyncObj__onNodeConnected(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        super()._SyncObj__onNodeConnected(node)  # type: ignore[misc]
        self._SyncObj__newAppendEntriesTime = 0.0


class LeadershipTransfer(SyncObj):
    """A leader about to stop hands its role to its most caught-up connected follower
    first (Raft's TimeoutNow, pysyncobj's transferLeadership), so that writes pause for a
    vote instead of a whole election timeout. pysyncobj's state belongs to its tick
    thread, so another thread only asks (request_leadership_transfer) and the tick does
    it; pysyncobj denies a follower that is not fully caught up, so the tick tries again
    until it is (or this node is no longer the leader).

    From the request on, the node is on its way out (Raft thesis section 3.10): it appends
    no write a follower forwards (refused as by a non-leader: the follower's caller
    retries, on the new leader), so its log never gets longer than the successor's, which
    would then get no vote from it; and once it is a follower it never stands for
    election again: its election deadline ran out while it led, so pysyncobj would make
    it stand at once, it could win, and then it exits and the others wait an election
    timeout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before SyncObj.__init__, which may start the tick thread that reads them
        self._transfer_requested = threading.Event()
        self._handing_over = False  # set once, by the request: this node is stopping
        self._asked_to_stand_in_term = -1  # a follower: the term whose leader handed over to it
        super().__init__(*args, **kwargs)

    def request_leadership_transfer(self) -> None:
        self._handing_over = True
        self._transfer_requested.set()

    def elected_by_hand_over(self) -> bool:
        """A leader: whether its leader of the term before asked it to stand (a hand-over),
        rather than it stood after its election timeout."""
        return self.raftCurrentTerm == self._asked_to_stand_in_term + 1

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - pysyncobj's name
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "apply_command" and self._handing_over:
            if "request_id" in message:
                self._SyncObj__transport.send(
                    node,
                    {
                        "type": "apply_command_response",
                        "request_id": message["request_id"],
                        "error": FAIL_REASON.NOT_LEADER,
                    },
                )
            return
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]
        if kind == "timeout_now" and self._SyncObj__transferInProgress:
            self._asked_to_stand_in_term = self.raftCurrentTerm  # it stands in the next term
        self._never_stand_again()  # a vote request may have made it a follower just now

    def _never_stand_again(self) -> None:
        """Here as well as at a tick's start: a request_vote read within a tick (InputFirstFix
        reads before pysyncobj decides) that deposes this node and is refused would leave
        the deadline that ran out while it led for the same tick's election check."""
        if self._handing_over and not self._isLeader():
            self._SyncObj__raftElectionDeadline = monotonic_time() + 3600.0

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        self._never_stand_again()
        if self._transfer_requested.is_set() and not self._isLeader():
            self._transfer_requested.clear()
        super()._onTick(timeToWait)

    def _checkCommandsToApply(self) -> None:  # noqa: N802 - pysyncobj's name
        """The transfer is asked after this tick appended what was queued (writes a
        follower forwarded before the request among them), and only with nothing left
        queued: an entry appended after timeout_now went out would make this log longer
        than the successor's, which then gets no vote from it. pysyncobj picks only a
        follower that holds every entry, so the tick asks again until one does."""
        super()._checkCommandsToApply()
        if self._transfer_requested.is_set() and self._isLeader() and not self._commands_queued():
            self.transferLeadership(None, self._transfer_answered)

    def _commands_queued(self) -> bool:
        return bool(self._SyncObj__commandsQueue._FastQueue__queue)

    def _transfer_answered(self, result: Any, error: Any) -> None:
        if error == FAIL_REASON.SUCCESS:  # sent: the follower starts its election now
            self._transfer_requested.clear()


class CatchUpFix(SyncObj):
    """A node that discarded a damaged log (controller/repair.py) neither votes nor stands
    for election until it has applied `catch_up_index` (the commit index it knew) and
    what its leader has committed: entries it had acknowledged are gone from it, and its
    empty log would grant its vote to a candidate that lacks them. pysyncobj has no such
    state; this drops request_vote messages and keeps the election deadline ahead while
    catching up (both in the tick thread, which owns pysyncobj's state)."""

    catch_up_index = 0  # set before SyncObj.__init__; 0: not catching up

    def catching_up(self) -> bool:
        if not self.catch_up_index:
            return False
        leader_commit = self._SyncObj__raftCommitIndex
        if self._SyncObj__raftLeader is not None and self.raftLastApplied >= max(
            self.catch_up_index, leader_commit
        ):
            logging.getLogger(__name__).warning(
                "caught up to index %d after discarding a damaged log: voting again", self.raftLastApplied
            )
            self.catch_up_index = 0
            return False
        return True

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - pysyncobj's name
        if message.get("type") == "request_vote" and self.catching_up():
            return  # no vote (and no term bump from it) until caught up
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        if self.catching_up():
            self._SyncObj__raftElectionDeadline = monotonic_time() + 3600.0
        super()._onTick(timeToWait)


class SendBeforeSync(SyncObj):
    """Leader side: new entries go to the followers before the leader's own fsync, which
    then runs while they write theirs (Raft thesis section 10.2.1; etcd does the same);
    and a tick sends each follower one append, not one per reason to send.

    pysyncobj 0.3.17's leader appends each new command to its journal (our journal
    fdatasyncs there) and only then sends it, so a write waits for two fsyncs one after
    the other. Here, while the leader turns queued commands into entries
    (_checkCommandsToApply, where it appends and sends each at once), the journal holds
    its fsync, and one fdatasync covers all of them when that returns. Safe because
    nothing is counted before it: the leader counts itself toward a commit only in the
    next tick (a commit is computed at the start of _onTick), after this sync; followers
    still sync before they acknowledge (their appends are not in this call). A leader
    that crashes before its sync may lose entries only followers hold: as after any
    leader crash, Raft keeps them if a majority holds them and drops them otherwise,
    and none was acknowledged to a client. A journal without begin_deferred_sync
    (pysyncobj's own) is left as it is.

    pysyncobj sends every follower an append when an entry was applied (the new commit
    index), one more for each new entry, and one per heartbeat. Within a tick these are
    held and sent once, before the leader's sync (or, in a tick that proposes nothing,
    just before the tick's poll): a tick that commits an entry and proposes the next sends
    each follower one message carrying both, not two (each message costs both sides a
    pickle, a compression, an encryption and, on the follower, an acknowledgement).

    An append that would carry only a new commit index (a tick that applied an entry
    and has no new entry for any follower, before the heartbeat is due) is not sent:
    the followers learn that index from the next append, the next write's or the
    heartbeat's (within heartbeat_ms), so one write costs each follower one append and
    one acknowledgement, not two of each. Raft needs no more: a follower's commit index
    only decides when it applies. Its state and its watch events lag the leader's by up
    to a heartbeat when writes stop; a follower's ReadIndex read does not wait for it
    (the leader sends the commit index with its answer: `_commit_send_forced`), nor does a
    write a follower forwarded (pysyncobj's apply_command): its caller waits on that
    follower until the follower applies the entry, so once everything queued and appended
    by then is committed the leader sends the commit index (without
    it each forwarded write waited up to a heartbeat: `_forwarded_upto`)."""

    _sends_held = False  # inside a tick: appends wait for _send_held_appends
    _send_wanted = False
    _commit_send_forced = False  # ReadIndex answered a follower: it needs the commit index now
    _forwarded_seen = False  # a follower forwarded a write since the last tick's sends
    _forwarded_upto = 0  # the last log index holding one: once committed, the followers need it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.addOnTickCallback(self._send_held_appends)  # just before the tick's poll

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        self._sends_held = True
        try:
            super()._onTick(timeToWait)
        finally:
            self._send_held_appends()  # a tick that returned before its callbacks

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 - pysyncobj's name
        if self._sends_held:
            self._send_wanted = True
            return
        self._commit_send_forced = False  # this send carries the commit index
        super()._SyncObj__sendAppendEntries()  # type: ignore[misc]

    def _send_held_appends(self) -> None:
        """Sends what the tick held, and sends at once from now until the next tick (the
        messages its poll reads may ask for a send: a new leadership's first append)."""
        self._sends_held = False
        if self._send_wanted:
            self._send_wanted = False
            if self._isLeader() and self._append_needed():
                super()._SyncObj__sendAppendEntries()  # type: ignore[misc]

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == "apply_command" and self._isLeader():
            self._forwarded_seen = True  # queued now; the next tick's _checkCommandsToApply appends it
        super()._SyncObj__onMessageReceived(node, message)

    def _append_needed(self) -> bool:
        """False for an append that would carry only a new commit index, unless a write a
        follower forwarded waits for that index. Called in a tick, after
        _checkCommandsToApply appended what was queued."""
        last_index = self._SyncObj__getCurrentLogIndex()
        if self._forwarded_seen:
            self._forwarded_seen = False
            self._forwarded_upto = max(self._forwarded_upto, last_index)
        commit_index = self._SyncObj__raftCommitIndex
        if self._forwarded_upto and commit_index >= self._forwarded_upto:
            self._forwarded_upto = 0  # this send carries a commit index covering them
            return True
        if self._commit_send_forced or monotonic_time() > self._SyncObj__newAppendEntriesTime:
            self._commit_send_forced = False
            return True
        next_index = self._SyncObj__raftNextIndex
        return any(next_index.get(node, 0) <= last_index for node in self._SyncObj__otherNodes)

    def _checkCommandsToApply(self) -> None:
        journal = self._SyncObj__raftLog
        if not self._isLeader() or not hasattr(journal, "begin_deferred_sync"):
            super()._checkCommandsToApply()
            return
        journal.begin_deferred_sync()
        try:
            super()._checkCommandsToApply()
            self._send_held_appends()  # before the sync: the followers write while the leader does
        finally:
            journal.end_deferred_sync()


class ProposeInTick(SyncObj):
    """A command the tick proposes itself does not wake the tick again.

    pysyncobj 0.3.17's _applyCommand queues a command and writes a byte to the tick's
    wake-up pipe, for callers on other threads. The controller's tick proposes its own
    commands (the Proposer's pump, at the start of _checkCommandsToApply, which takes the
    queue right after): that byte only made the tick's next poll return at once, so every
    proposal cost one empty tick (every per-tick check, a pipe write and its read). While
    `_proposing_in_tick` is set (by the tick thread, around its pump), commands are queued
    without it. pysyncobj's _checkCommandsToApply takes them in the same call; one it
    leaves queued (no leader known, or its time budget spent) waits for the next tick,
    within autoTickPeriod, as it did after the wake-up's one empty tick."""

    _proposing_in_tick = False

    def _applyCommand(self, command: bytes, callback: Any, commandType: int | None = None) -> None:  # noqa: N802, N803 - pysyncobj's names
        if not self._proposing_in_tick:
            super()._applyCommand(command, callback, commandType)
            return
        if commandType is not None:
            command = pysyncobj.syncobj._bchr(commandType) + command
        try:
            self._SyncObj__commandsQueue.put_nowait((command, callback))  # type: ignore[attr-defined]
        except queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)  # type: ignore[attr-defined]


class ReadNotConfirmed(Exception):
    """A ReadIndex read could not be confirmed (no leader, leadership lost, a round that
    no majority answered in time): the caller reads another way or fails; never stale."""


READ_ROUND_TIMEOUT_S = 1.0  # a round no majority confirmed by then fails (the caller falls back)
READ_ROUNDS_INFLIGHT_MAX = 4  # rounds the leader runs at once; further reads wait for the next
READ_WAITERS_MAX = 20_000  # reads queued on a node; past it a read fails at once
# Leader leases (ReadIndex.lease_read_index): a follower that answered a ping of the
# leader neither votes for another node nor stands for election for its vote hold,
# election_min - heartbeat, at most VOTE_HOLD_S_MAX; the leader reads alone until the
# round's start + the smallest hold its majority promised, shortened by the clock-rate
# difference the lease tolerates between two nodes.
VOTE_HOLD_S_MAX = 1.0
LEASE_CLOCK_DRIFT_MAX = 0.1  # 10 %: far above what two machines' monotonic clocks differ by

# Messages between nodes (pysyncobj ignores types it does not know, so a node without
# ReadIndex simply never answers: its leader's reads time out and fall back)
_PING, _PONG, _ASK, _ANSWER = "read_index_ping", "read_index_pong", "read_index_ask", "read_index_answer"
_RELEASE = "read_index_release"  # a leader handing over frees its followers' vote holds


class _ReadRound:
    __slots__ = ("index", "term", "started", "acked", "holds", "waiters", "confirmed")

    def __init__(self, index: int, term: int, waiters: list[Any]) -> None:
        self.index = index
        self.term = term
        self.started = monotonic_time()
        self.acked: set[Any] = set()  # followers that answered (the leader counts itself)
        self.holds: dict[Any, float] = {}  # follower -> the vote hold it promised (seconds)
        self.waiters = waiters  # Futures of this node, or (node, ask id, incarnation) of a follower
        self.confirmed = False


class ReadIndex(SyncObj):
    """Linearizable reads without a log entry: Raft's ReadIndex (thesis section 6.4).

    A read on the leader joins the next round: the tick records the commit index (once
    the leader has committed the no-op of its term), sends one `read_index_ping` (term,
    round) to every follower and, once a majority (itself included) answered in the same
    term, the leader was still the leader when the read arrived: the read is served
    when the node has applied that index. A follower answers a ping only while its term
    equals the ping's, so after a majority has moved to a newer term no round of an old
    leader completes: a partitioned old leader refuses (its reads time out). Every read
    waiting when a round starts shares it, so concurrent reads cost one ping each per
    follower, not one log entry each. A follower asks the leader (`read_index_ask`); the
    leader answers with the confirmed index and the follower serves once it has applied
    it. State lives on the tick thread; other threads only queue reads and wake it.

    Leader lease (Raft thesis section 6.4.1): a follower that answers a ping promises,
    in its pong, to grant no vote and start no election for its vote hold (election_min
    - heartbeat, at most VOTE_HOLD_S_MAX) from then on, and keeps it: request_vote
    messages are dropped and its election deadline held off while the hold runs (also
    for a hold after its own restart, when it had a term: the promise of its previous
    run). So once a majority promised, no other leader can be elected before the round's
    start + the smallest hold promised; the leader answers reads alone until then,
    less LEASE_CLOCK_DRIFT_MAX of it for clocks that run at different rates
    (lease_read_index, on any thread: no round, no tick). Reads that are served so keep
    the lease renewed by a round with no reads when half of it is left. A leader that
    hands over its leadership gives its lease up first and tells every follower to free
    its hold (read_index_release, ahead of timeout_now), so the successor's votes are not
    held. A follower of an older version
    promises nothing (no hold in its pong): it counts for ReadIndex, never for a lease."""

    _SyncObj__raftElectionDeadline: float  # pysyncobj's, set in SyncObj.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before SyncObj.__init__, which may start the tick thread that reads them
        self._read_lock = threading.Lock()
        self._reads_new: list[Any] = []  # Futures queued by other threads
        self._reads_waiting: list[Any] = []  # tick thread: reads for the next round
        self._read_rounds: dict[int, _ReadRound] = {}
        self._read_round_next = 0
        self._read_asks: dict[int, tuple[Any, float]] = {}  # follower: ask id -> (Future, asked at)
        self._read_ask_next = 0
        # Ask ids restart at 1 with the process: the leader's answer to an ask of this node's
        # previous run (a round that started before this run's reads) must not settle them.
        self._read_incarnation = os.urandom(8).hex()
        self._reads_applying: list[tuple[int, Any]] = []  # (index, Future): wait for the apply
        self._lease: tuple[float, int] = (0.0, -1)  # (valid until, term): written by the tick only
        self._lease_used = False  # a read was served by the lease: keep it renewed (any thread sets)
        self._lease_refused_term = -1  # a term in which this node handed its leadership over
        self._vote_held_until = 0.0  # follower: no vote, no election until then (monotonic)
        super().__init__(*args, **kwargs)
        if self.raftCurrentTerm > 0:  # it may have promised a hold before a restart: keep it
            self._vote_held_until = monotonic_time() + self.vote_hold_s()
        self.addOnTickCallback(self._reads_before_poll)

    # any thread
    def read_index(self) -> Future:
        """A Future that gets the index after which this node's state answers a read
        linearizably (set once the node has applied it), or ReadNotConfirmed."""
        future: Future = Future()
        future.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it
        with self._read_lock:
            if len(self._reads_new) >= READ_WAITERS_MAX:
                future.set_exception(ReadNotConfirmed(f"{READ_WAITERS_MAX} reads are queued on this node"))
                return future
            self._reads_new.append(future)
        if pysyncobj.syncobj.PIPE_NOTIFIER_ENABLED:
            self._SyncObj__pipeNotifier.notify()  # the tick may be asleep in its poll
        return future

    def lease_read_index(self) -> int | None:
        """Any thread: the index after which this node's state answers a read linearizably
        when its lease covers now and it has applied that index, else None (the caller
        takes read_index()). The lease is read before the indexes, the commit index
        before the applied one: each only grows while the term lasts."""
        until, term = self._lease
        if monotonic_time() >= until or not self._isLeader() or self.raftCurrentTerm != term:
            return None
        commit = self._SyncObj__raftCommitIndex
        if self.raftLastApplied < commit:
            return None
        self._lease_used = True
        return int(commit)

    def vote_hold_s(self) -> float:
        """How long this node, as a follower, holds its vote after a ping of its leader."""
        conf = self._SyncObj__conf
        return min(conf.raftMinTimeout - conf.appendEntriesPeriod, VOTE_HOLD_S_MAX)

    def transferLeadership(self, node: Any = None, callback: Any = None) -> None:  # noqa: N802 - pysyncobj's name
        # Before timeout_now goes out: the lease is given up for this term, and every
        # follower is told to free the hold it promised (sent ahead of timeout_now on each
        # connection), so that the successor's request_vote finds no held vote. Without it,
        # a follower other than the successor (in a cluster of four or more, whose majority
        # needs them) would drop the vote and the hand-over would wait an election timeout.
        self._lease_refused_term = self.raftCurrentTerm
        self._lease = (0.0, -1)
        if self._isLeader():
            for other in self._SyncObj__otherNodes:
                self._SyncObj__transport.send(other, {"type": _RELEASE, "term": self.raftCurrentTerm})
        super().transferLeadership(node, callback)

    # the tick thread
    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        if not self._isLeader() and self._vote_held_until > monotonic_time():
            self._hold_vote(0.0)  # a hold kept over a restart
        self._start_reads()
        super()._onTick(timeToWait)
        self._finish_reads()

    def _reads_before_poll(self) -> None:
        """Just before the tick sleeps in its poll: reads queued since the tick took its
        reads start, rounds confirmed since it began are answered, and reads whose index
        it applied are served. Each used to wait until the poll woke for the next message
        or heartbeat (50 ms): the wake-up of a read queued between the tick's start and
        InputFirstFix's poll(0) is read by that poll; a pong read by that poll(0) confirmed
        a round that was answered only after the last poll; and a follower applies the
        index it was answered with in the tick after the answer came."""
        if self._reads_new:
            self._start_reads()
        self._renew_lease()
        self._finish_reads()

    def _hold_vote(self, hold_s: float) -> None:
        """No vote for another node and no election of its own before now + hold_s (nor
        before a hold already promised ends)."""
        self._vote_held_until = max(self._vote_held_until, monotonic_time() + hold_s)
        deadline = self._SyncObj__raftElectionDeadline
        self._SyncObj__raftElectionDeadline = max(deadline, self._vote_held_until)

    def _renew_lease(self) -> None:
        """A round with no reads, when reads used the lease and half of it is left."""
        if not self._lease_used or self._read_rounds or not self._isLeader():
            return
        if self.raftCurrentTerm == self._lease_refused_term:
            return
        until, term = self._lease
        if term == self.raftCurrentTerm and until - monotonic_time() > self.vote_hold_s() / 2:
            return
        self._lease_used = False  # renewed while reads use it; an idle leader stops pinging
        self._start_round(renewal=True)

    def _start_reads(self) -> None:
        if not self._reads_new and not self._reads_waiting:
            return  # most ticks: no read queued (a read queued meanwhile also wakes the tick)
        with self._read_lock:
            new, self._reads_new = self._reads_new, []
        self._reads_waiting.extend(new)
        if not self._reads_waiting:
            return
        if self._isLeader():
            self._start_round()
            return
        waiting, self._reads_waiting = self._reads_waiting, []
        local = [waiter for waiter in waiting if isinstance(waiter, Future)]
        # followers' asks queued while this node led are refused (they fall back), not forwarded
        self._refuse_asks([waiter for waiter in waiting if not isinstance(waiter, Future)], "not the leader")
        if self._getLeader() is not None:
            self._ask_leader(local)
        else:
            self._fail_reads(local, "no leader is known")

    def _start_round(self, renewal: bool = False) -> None:
        noop = self._SyncObj__noopIDx
        commit = self._SyncObj__raftCommitIndex
        if noop is None or commit < noop or len(self._read_rounds) >= READ_ROUNDS_INFLIGHT_MAX:
            return  # the no-op of this term is not committed yet, or enough rounds run: next tick
        if not renewal and not self._reads_waiting:
            return
        waiters, self._reads_waiting = self._reads_waiting, []
        read_round = _ReadRound(commit, self.raftCurrentTerm, waiters)
        self._read_round_next += 1
        self._read_rounds[self._read_round_next] = read_round
        others = self._SyncObj__otherNodes
        if self._has_majority(read_round):
            read_round.confirmed = True  # a single node
        lease = read_round.term != self._lease_refused_term  # else the followers promise no hold
        for node in others:
            self._SyncObj__transport.send(
                node, {"type": _PING, "term": read_round.term, "round": self._read_round_next, "lease": lease}
            )

    def _has_majority(self, read_round: _ReadRound) -> bool:
        return len(read_round.acked) + 1 > (len(self._SyncObj__otherNodes) + 1) / 2

    def _ask_leader(self, futures: list[Future]) -> None:
        if not futures:
            return
        asks = []
        for future in futures:
            self._read_ask_next += 1
            self._read_asks[self._read_ask_next] = (future, monotonic_time())
            asks.append(self._read_ask_next)
        self._SyncObj__transport.send(
            self._getLeader(), {"type": _ASK, "asks": asks, "incarnation": self._read_incarnation}
        )

    def _refuse_asks(self, waiters: list[tuple[Any, int, str]], why: str) -> None:
        """Answers followers' asks (node, ask id, incarnation) with an error."""
        by_asker: dict[tuple[Any, str], list[int]] = {}
        for node, ask, incarnation in waiters:
            by_asker.setdefault((node, incarnation), []).append(ask)
        for (node, incarnation), asks in by_asker.items():
            self._SyncObj__transport.send(
                node,
                {"type": _ANSWER, "asks": asks, "incarnation": incarnation, "index": 0, "error": why},
            )

    def _finish_reads(self) -> None:
        if not self._read_rounds and not self._read_asks and not self._reads_applying:
            return  # most ticks: no read in flight
        now = monotonic_time()
        leader = self._isLeader()
        for number, read_round in list(self._read_rounds.items()):
            if not leader or read_round.term != self.raftCurrentTerm:
                del self._read_rounds[number]
                self._answer_round(read_round, "leadership was lost before the read was confirmed")
            elif read_round.confirmed:
                del self._read_rounds[number]
                self._answer_round(read_round, None)
            elif now - read_round.started > READ_ROUND_TIMEOUT_S:
                del self._read_rounds[number]
                self._answer_round(read_round, "no majority confirmed this leader in time")
        for ask, (future, asked) in list(self._read_asks.items()):
            if now - asked > READ_ROUND_TIMEOUT_S:
                del self._read_asks[ask]
                self._fail_reads([future], "the leader did not answer in time")
        self._serve_applied()

    def _answer_round(self, read_round: _ReadRound, error: str | None) -> None:
        local: list[Future] = []
        remote: dict[tuple[Any, str], list[int]] = {}
        for waiter in read_round.waiters:
            if isinstance(waiter, tuple):
                node, ask, incarnation = waiter
                remote.setdefault((node, incarnation), []).append(ask)
            else:
                local.append(waiter)
        for (node, incarnation), asks in remote.items():
            self._SyncObj__transport.send(
                node,
                {
                    "type": _ANSWER,
                    "asks": asks,
                    "incarnation": incarnation,
                    "index": read_round.index,
                    "error": error,
                },
            )
        if remote and error is None:  # the askers apply up to the index once they know it committed
            self._commit_send_forced = True
            self._SyncObj__sendAppendEntries()
        if error is not None:
            self._fail_reads(local, error)
        else:
            self._reads_applying.extend((read_round.index, future) for future in local)

    def _serve_applied(self) -> None:
        if not self._reads_applying:
            return
        applied = self.raftLastApplied
        still = []
        for index, future in self._reads_applying:
            if applied >= index:
                if not future.done():
                    future.set_result(index)
            else:
                still.append((index, future))
        self._reads_applying = still

    @staticmethod
    def _fail_reads(futures: list[Any], why: str) -> None:
        for future in futures:
            if isinstance(future, Future) and not future.done():
                future.set_exception(ReadNotConfirmed(why))

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == _PING:
            if message["term"] == self.raftCurrentTerm and not self._isLeader():
                pong = {"type": _PONG, "term": message["term"], "round": message["round"]}
                if message.get("lease") is True:  # a leader of an older version takes no lease
                    pong["hold"] = self.vote_hold_s()
                    self._hold_vote(pong["hold"])  # before the promise goes out
                self._SyncObj__transport.send(node, pong)
        elif kind == _PONG:
            read_round = self._read_rounds.get(message["round"])
            if read_round is not None and message["term"] == read_round.term == self.raftCurrentTerm:
                read_round.acked.add(node)  # a node counts once, however often it answers
                hold = message.get("hold")
                if isinstance(hold, int | float) and not isinstance(hold, bool) and hold > 0:
                    read_round.holds[node] = float(hold)  # an older follower promises nothing
                read_round.confirmed = read_round.confirmed or self._has_majority(read_round)
                self._extend_lease(read_round)
        elif kind == "request_vote" and self._vote_held_until > monotonic_time() and not self._isLeader():
            return  # the hold promised to the leader: no vote, and no newer term from the candidate
        elif kind == _RELEASE:
            if node == self._getLeader() and message["term"] == self.raftCurrentTerm:
                self._vote_held_until = 0.0  # its leader gave its lease up: the hold protects nothing
        elif kind == "timeout_now" and node == self._getLeader() and message["term"] >= self.raftCurrentTerm:
            self._vote_held_until = 0.0  # the leader gave its lease up before it asked for the transfer
            super()._SyncObj__onMessageReceived(node, message)
        elif kind == _ASK:
            asks = [(node, ask, message.get("incarnation", "")) for ask in message["asks"]]
            if self._isLeader():
                self._reads_waiting.extend(asks)
                self._start_round()
            else:
                self._refuse_asks(asks, "not the leader")
        elif kind == _ANSWER:
            self._answered(message)
        else:
            super()._SyncObj__onMessageReceived(node, message)

    def _extend_lease(self, read_round: _ReadRound) -> None:
        """A majority promised holds from after the round started: no other leader can be
        elected before started + the smallest of them (less the clock drift allowance)."""
        if read_round.term == self._lease_refused_term or not read_round.holds:
            return
        if len(read_round.holds) + 1 <= (len(self._SyncObj__otherNodes) + 1) / 2:
            return
        hold = min(read_round.holds.values())
        until = read_round.started + hold * (1.0 - LEASE_CLOCK_DRIFT_MAX)
        current_until, current_term = self._lease
        if current_term != read_round.term or until > current_until:
            self._lease = (until, read_round.term)

    def _answered(self, message: dict) -> None:
        if message.get("incarnation") != self._read_incarnation:
            return  # for this node's previous run: its ask ids name other reads here
        futures = [self._read_asks.pop(ask)[0] for ask in message["asks"] if ask in self._read_asks]
        if message["error"] is not None:
            self._fail_reads(futures, f"the leader could not confirm the read: {message['error']}")
        else:
            self._reads_applying.extend((message["index"], future) for future in futures)
            self._serve_applied()


class RaftFixes(
    PromptAppendOnConnect,
    PromptElectionFix,
    CatchUpFix,
    ReadIndex,
    SendBeforeSync,
    ProposeInTick,
    LeadershipTransfer,
    InputFirstFix,
    SnapshotTransferFix,
    SnapshotCommitFix,
    HeldEntriesFix,
    NextIndexFix,
):
    """Every Raft fix, leadership transfer, ReadIndex and SendBeforeSync: what every
    controller node runs with."""


# The transport ------------------------------------------------------------------------------


class DialHookTransport(TCPTransport):
    """pysyncobj's TCP transport, connecting to `dial_address(peer address)` instead of the
    peer's address. Peers keep their real addresses as identities (what a node announces
    and how others know it), so which side connects and who is who do not change; only the
    TCP connect goes elsewhere (mqmeta's dial map puts the chaos suite's proxies there).
    pysyncobj has no hook for it: this is its _connectIfNecessarySingle with the address
    passed through dial_address. Subclasses override dial_address."""

    def dial_address(self, address: str) -> str:
        return address

    def _connectIfNecessarySingle(self, node: Any) -> bool:
        connection = self._connections.get(node)
        if connection is not None and connection.state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        last = self._lastConnectAttempt.get(node)
        if last is not None and monotonic_time() - last < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = monotonic_time()
        host, _, port = self.dial_address(node.address).rpartition(":")
        return bool(self._connections[node].connect(host, int(port)))


# Raft message frames ----------------------------------------------------------------------

FRAME_MAGIC = 0x01  # first byte of a sealed frame; a Fernet token starts with "g", zlib with 0x78
FRAME_MARK = b"+aead1"  # appended to a node's handshake key: it reads sealed frames
FRAME_COMPRESS_MIN_BYTES = 16 * 1024  # smaller messages are sealed as pickled (zlib costs more than it saves)
_FRAME_HEADER = struct.Struct(">BQB")  # magic, message number (the nonce), flags
_FRAME_COMPRESSED = 1


def _frame_capable(key: Any) -> bool:
    return isinstance(key, bytes) and key.endswith(FRAME_MARK)


class QuietLinkFix(TcpConnection):
    """pysyncobj 0.3.17 drops a connection on which nothing was read for connectionTimeout,
    and looks only when the connection is next used: when bytes arrive (before reading
    them: they are lost) or on the next send (which then goes nowhere). The link between
    two followers carries nothing while they have a leader, so after a second it was
    dropped by the first message on it, the request_vote of the election after the
    leader died: the other follower never got it, stood too, and the vote split (a
    kill -9 failover of 0.87-1.65 s in about one round of ten instead of 0.3-0.5 s). Here
    bytes that arrive prove the peer alive (the count starts from them), and a send on a
    link quiet both ways for longer than the timeout starts the count afresh. A link in
    use (sends closer together than the timeout: a leader's heartbeats every 50 ms) whose
    peer stops answering is still dropped after the timeout; on a link used more sparsely
    each send starts the count again, so a dead peer there shows as TCP's error (a reset,
    a refused connection), not as silence: Raft answers no refused vote, so silence on
    such a link is no sign of a dead peer."""

    _TcpConnection__lastReadTime: float  # pysyncobj's, set in TcpConnection.__init__
    _TcpConnection__timeout: float
    _last_send = 0.0

    def _TcpConnection__processConnection(self, descr: Any, eventType: int) -> None:  # noqa: N802, N803 - pysyncobj's names
        if eventType & POLL_EVENT_TYPE.READ:
            self._TcpConnection__lastReadTime = monotonic_time()
        # by name, not super(): the poller holds this bound method, and a test turns a
        # connection back into pysyncobj's own class (a node of an older version)
        TcpConnection._TcpConnection__processConnection(self, descr, eventType)  # type: ignore[attr-defined]

    def _TcpConnection__trySendBuffer(self) -> None:  # noqa: N802 - pysyncobj's name
        now = monotonic_time()
        if now - max(self._TcpConnection__lastReadTime, self._last_send) > self._TcpConnection__timeout:
            self._TcpConnection__lastReadTime = now  # quiet both ways: an answer is due from now
        self._last_send = now
        super()._TcpConnection__trySendBuffer()  # type: ignore[misc]


class AeadTcpConnection(QuietLinkFix):
    """pysyncobj's TCP connection, sealing each Raft message between two nodes of this
    version with AES-GCM instead of pickle + zlib + Fernet.

    With a Raft secret, pysyncobj 0.3.17 pickles each message, compresses it (zlib level
    3, also a 100-byte acknowledgement) and encrypts it with Fernet (AES-CBC, an HMAC,
    base64), and the receiver undoes each step: 70-150 microseconds of CPU per message on
    this machine, eight messages per write. Here the two nodes mark the random keys they
    exchange when they connect (pysyncobj's own handshake, still in Fernet) with
    FRAME_MARK; once both keys carry it, each message is one frame: the header (magic,
    message number, flags) and the pickle, compressed only from FRAME_COMPRESS_MIN_BYTES,
    sealed with AES-GCM under a key of this connection and direction (HKDF of the
    secret's `raft_frame_key` and both handshake keys), the message number as nonce and
    the header as associated data. The receiver takes a frame only with a higher number
    than the last (no replay, no reordering; pysyncobj checked Fernet's timestamps and
    the handshake key inside each message) and drops the connection on any failure, as
    pysyncobj does. A node of an older version never marks its key, so the two talk
    Fernet as before: a rolling upgrade needs nothing."""

    recvRandKey: Any  # pysyncobj's, set in TcpConnection.__init__ (so are the next three)
    sendRandKey: Any
    encryptor: Any
    _TcpConnection__readBuffer: bytes
    _frame_keys: tuple[bytes, bytes] | None = None  # the handshake keys the sealers were made for
    _sealer: Any = None
    _opener: Any = None
    _sent_number = 0
    _received_number = 0

    def send(self, message: Any) -> None:
        if self.encryptor is None:
            super().send(message)
            return
        own_key = self.recvRandKey
        if message is own_key and isinstance(own_key, bytes) and not _frame_capable(own_key):
            if getattr(self.encryptor, "raft_frame_key", None) is not None:
                self.recvRandKey = message = own_key + FRAME_MARK  # the handshake: announced here
            super().send(message)  # in Fernet: the peer learns the key from this message
            return
        if not self._frames_ready():
            super().send(message)
            return
        data = pysyncobj.pickle.dumps(message)
        flags = 0
        if len(data) >= FRAME_COMPRESS_MIN_BYTES:
            data, flags = zlib.compress(data, 1), _FRAME_COMPRESSED
        self._sent_number += 1
        header = _FRAME_HEADER.pack(FRAME_MAGIC, self._sent_number, flags)
        frame = header + self._sealer.encrypt(self._sent_number.to_bytes(12, "big"), data, header)
        self._TcpConnection__writeBuffer += struct.pack("i", len(frame)) + frame
        self._TcpConnection__trySendBuffer()

    def _frames_ready(self) -> bool:
        """Both handshake keys are marked (and the sealers made for them)."""
        peer_key, own_key = self.sendRandKey, self.recvRandKey
        if not (_frame_capable(peer_key) and _frame_capable(own_key)):
            return False
        if self._frame_keys != (peer_key, own_key):
            secret = getattr(self.encryptor, "raft_frame_key", None)
            if secret is None:
                return False
            aead, _fernet = raft_ciphers.ciphers()
            self._sealer = aead(_connection_key(secret, receiver=peer_key, sender=own_key))
            self._opener = aead(_connection_key(secret, receiver=own_key, sender=peer_key))
            self._frame_keys = (peer_key, own_key)
            self._sent_number = self._received_number = 0
        return True

    def _TcpConnection__processParseMessage(self) -> Any:  # noqa: N802 - pysyncobj's name
        buffer = self._TcpConnection__readBuffer
        if len(buffer) < 5 or buffer[4] != FRAME_MAGIC:
            return super()._TcpConnection__processParseMessage()  # type: ignore[misc]
        length = struct.unpack("i", buffer[:4])[0]
        if len(buffer) - 4 < length:
            return None
        try:
            message = self._open_frame(buffer[4 : 4 + length])
        except Exception:  # noqa: BLE001 - a frame that does not open ends the connection, as in pysyncobj
            _TICK_LOG.warning("a Raft frame from a peer did not open: connection dropped")
            self.disconnect()
            return None
        self._TcpConnection__readBuffer = buffer[4 + length :]
        return message

    def _open_frame(self, frame: bytes) -> Any:
        if self.encryptor is None or not self._frames_ready():
            raise ValueError("a sealed frame before both handshake keys were marked")
        header = frame[: _FRAME_HEADER.size]
        _magic, number, flags = _FRAME_HEADER.unpack(header)
        if number <= self._received_number:
            raise ValueError(f"frame {number} after frame {self._received_number}")
        data = self._opener.decrypt(number.to_bytes(12, "big"), frame[_FRAME_HEADER.size :], header)
        self._received_number = number
        if flags & _FRAME_COMPRESSED:
            data = zlib.decompress(data)
        return pysyncobj.pickle.loads(data)


def _connection_key(secret: bytes, receiver: bytes, sender: bytes) -> bytes:
    """The key of one direction of one connection (each handshake key is 32 random bytes)."""
    return raft_ciphers.hkdf_sha256(secret, b"mqmeta raft connection 1" + receiver + sender, 32)


_STOCK_TCP_CONNECTION = TcpConnection


def install_raft_frames() -> None:
    """Every Raft connection made from now on is an AeadTcpConnection (pysyncobj makes
    them in two places: the transport's outgoing ones, the server's incoming ones)."""
    pysyncobj.transport.TcpConnection = AeadTcpConnection
    pysyncobj.tcp_server.TcpConnection = AeadTcpConnection


def restore_stock_connections() -> None:
    """pysyncobj's own connections again (a test runs a node of an older version)."""
    pysyncobj.transport.TcpConnection = _STOCK_TCP_CONNECTION
    pysyncobj.tcp_server.TcpConnection = _STOCK_TCP_CONNECTION


# Accessors ---------------------------------------------------------------------------------


def wake_tick(node: SyncObj) -> None:
    """Any thread: the node's tick returns from its poll at once (or skips its next wait),
    as pysyncobj's own _applyCommand wakes it; without a pipe notifier (a platform that has
    none, or appendEntriesUseBatch) the tick finds the work within autoTickPeriod."""
    if pysyncobj.syncobj.PIPE_NOTIFIER_ENABLED and not node._SyncObj__conf.appendEntriesUseBatch:
        node._SyncObj__pipeNotifier.notify()


def raft_journal(node: SyncObj) -> Any:
    """The journal object this node's Raft log lives in (what createJournal returned)."""
    return node._SyncObj__raftLog


def entries_from(node: SyncObj, index: int, count: int) -> list[Entry]:
    """Up to `count` entries from Raft index `index` on; [] when compacted away."""
    return list(node._SyncObj__getEntries(index, count))


def leader_address(node: SyncObj) -> str:
    """The last known leader's Raft address, '' when none is known (it may be stale)."""
    leader = node._getLeader()
    return leader.address if leader is not None else ""


def current_term(node: SyncObj) -> int:
    """The Raft term this node is in (as far as it has heard)."""
    return int(node.raftCurrentTerm)


def is_leader(node: SyncObj) -> bool:
    """Whether this node thinks it leads (two nodes can, until one hears a newer term)."""
    return bool(node._isLeader())


def read_snapshot_entries(path: Path) -> tuple[Entry, Entry]:
    """The (last applied, previous) entries of a snapshot file in pysyncobj's gzip shape
    (pysyncobj's stock format and mqmeta's format 1; snapshot.read_position reads any).

    The file starts with pickle((state, last applied entry, previous entry, cluster)) in
    gzip, as pysyncobj's Serializer writes it (format 1 of controller/snapshot.py wrote the
    same first pickle, with the state in the pickles after it). Reading the whole gzip stream
    checks its CRC-32; only the first pickle is loaded. Errors (gzip, zlib, pickle, a
    short tuple) are the caller's to report."""
    with gzip.open(path, "rb") as snapshot:
        raw = snapshot.read()  # to the end: only then is the gzip CRC-32 checked
    data = pysyncobj.pickle.loads(raw)
    return data[1], data[2]
