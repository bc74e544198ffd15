"""Every pysyncobj patch of controller/pysyncobj_compat.py, one test per patched behaviour,
on real pysyncobj nodes (real SyncObj, real TCP on loopback, real files).

Properties checked:
- an upgrade fails at import, naming what is missing: the pinned version (equal to the
  pin in pyproject.toml), every private name with its kind, every hook still wired;
  a journal class that lacks a method of pysyncobj's Journal interface is refused;
- importing changes nothing; install() does, idempotently;
- a controller loads no cryptography, with a Raft secret either (pysyncobj_lazy_crypto,
  raft_ciphers), and its encryptor reads and makes the tokens of pysyncobj's own (same
  salt, same key);
- install_journal_factory: a real ControllerRaft writes our journal format;
- install_durable_snapshots: a real node's snapshot file data and its directory entry
  are fsynced before the journal is compacted, and snapshot.read_position reads the
  snapshot pysyncobj wrote;
- the state snapshot (controller/snapshot.py, through pysyncobj's serializer hooks): the
  replicated state survives a compaction and a restart;
- NextIndexFix: a stale successful ack does not move the leader's nextIndex backwards,
  so no entry is sent to a follower twice;
- HeldEntriesFix: a follower sent entries it already holds does not truncate its log;
- PromptElectionFix: a follower stands at its election deadline, not when a tick's wait
  for input ends;
- LeadershipTransfer: a leader asked to hand over appends no write a follower forwards
  (refused as not the leader), appends one forwarded before the request ahead of the
  transfer, and, once a follower, never stands for election again (also when a vote it
  refuses deposes it within a tick);
- SnapshotCommitFix: a follower holding a deposed leader's uncommitted entries applies
  none of them when the new leader starts sending it a snapshot;
- InputFirstFix: a follower that stalled past its election timeout reads the leader's
  heartbeats (waiting in its socket) before deciding, so it does not depose the leader;
- PromptAppendOnConnect: a restarted follower hears from its leader as soon as they are
  connected, not at the leader's next heartbeat (a stock leader waits for it);
- DialHookTransport: Raft connects through the dial map, peers keep their identities;
- QuietLinkFix: a link quiet both ways for longer than the connection timeout carries
  the next message (pysyncobj's own drops it, and the message, on that send), and a
  link whose peer stops answering messages sent on it is still dropped;
- wrap_tick, wrap_transport_send (the benchmark's profiler) see every tick and message;
- install_prompt_first_tick: a node's tick thread does not sleep 0.1 s between binding
  its port and its first tick (pysyncobj's does);
- AeadTcpConnection (install_raft_frames): two nodes of this version with a Raft secret
  send no Fernet token once connected (every message a sealed frame), a node of an older
  version and one of this version talk Fernet (and commit), and a frame opens only once,
  in order, unaltered and on the connection (and direction) it was sealed for; the
  secret's frame key comes with pysyncobj's own Fernet key (the same derivation).

Each test was seen to fail with the patch it covers disabled.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.poller
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_server
import pysyncobj.transport
import pytest
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.wait import wait_for as cluster_wait_for
from mqmeta.controller import pysyncobj_compat as compat
from mqmeta.controller import pysyncobj_lazy_crypto, raft_ciphers, raft_node
from mqmeta.controller.journal import FILE_MAGIC, DurableJournal, parse_records
from mqmeta.controller.raft_node import ControllerRaft, Peer, RaftSettings
from mqmeta.controller.snapshot import read_position
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport

from mqmeta import dialmap
from tests.support.checks_process import run_script

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
BIND_ATTEMPTS_MAX = 5


def wait_for(
    predicate: Callable[[], Any], timeout_s: float, what: str, step: Callable[[], None] | None = None
):
    """Polls `predicate` (running `step` between polls, e.g. a manual Raft tick) until it
    is true; fails the test saying what it waited for."""
    if step is None:
        return cluster_wait_for(predicate, timeout_s, what)
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        step()


# Import-time checks -----------------------------------------------------------------------


def doctored(module: types.ModuleType, **replacements: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{**vars(module), **replacements})


def class_without(cls: type, name: str, **replacements: Any) -> type:
    body = {k: v for k, v in vars(cls).items() if k not in (name, "__dict__", "__weakref__")}
    body.update(replacements)
    return type(cls.__name__, cls.__bases__, body)


def refusal(namespace: dict[str, Any], version: str | None = compat.PINNED_VERSION) -> str:
    with pytest.raises(compat.PysyncobjIncompatible) as refused:
        compat.verify(version, namespace)
    return str(refused.value)


def test_the_installed_pysyncobj_passes_and_the_pin_matches_pyproject():
    compat.verify(compat.installed_version(), compat.real_namespace())
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"pysyncobj=={compat.PINNED_VERSION}" in dependencies


def test_another_version_is_refused_naming_both():
    message = refusal(compat.real_namespace(), version="0.3.18")
    assert "pysyncobj 0.3.18 is installed" in message and "pysyncobj==0.3.17" in message
    assert "(version unknown)" in refusal(compat.real_namespace(), version=None)


def test_a_missing_mangled_method_is_named():
    namespace = compat.real_namespace()
    namespace["pysyncobj.syncobj"] = doctored(
        pysyncobj.syncobj, SyncObj=class_without(SyncObj, "_SyncObj__getEntries")
    )
    message = refusal(namespace)
    assert "pysyncobj.syncobj.SyncObj._SyncObj__getEntries is missing (entries_from" in message


def test_a_name_of_the_wrong_kind_is_named():
    namespace = compat.real_namespace()
    namespace["pysyncobj.syncobj"] = doctored(pysyncobj.syncobj, createJournal=42)
    assert "pysyncobj.syncobj.createJournal is int, not a function" in refusal(namespace)


def test_a_hook_pysyncobj_no_longer_calls_is_named():
    def serialize(self, data, id):  # writes without atomicReplace, as a new version might
        return None

    namespace = compat.real_namespace()
    serializer = class_without(pysyncobj.serializer.Serializer, "serialize", serialize=serialize)
    namespace["pysyncobj.serializer"] = doctored(pysyncobj.serializer, Serializer=serializer)
    message = refusal(namespace)
    assert "pysyncobj.serializer.Serializer.serialize no longer uses atomicReplace" in message


def test_an_instance_attribute_no_longer_set_is_named():
    def __init__(self, *args, **kwargs):  # noqa: N807 - sets no _SyncObj__raftNextIndex
        self._SyncObj__raftLog = None

    namespace = compat.real_namespace()
    namespace["pysyncobj.syncobj"] = doctored(
        pysyncobj.syncobj, SyncObj=class_without(SyncObj, "__init__", __init__=__init__)
    )
    message = refusal(namespace)
    assert "SyncObj.__init__ no longer uses _SyncObj__raftNextIndex" in message
    assert "no longer uses _SyncObj__raftLog" not in message


def test_an_upgraded_pysyncobj_fails_at_import(tmp_path):
    """A copy of the installed pysyncobj with one private method renamed and the version
    bumped, first on the path: importing the compat module (so starting a controller)
    fails with one message naming both."""
    source = Path(pysyncobj.__file__).parent
    shadow = tmp_path / "site"
    shutil.copytree(source, shadow / "pysyncobj", ignore=shutil.ignore_patterns("__pycache__"))
    syncobj_py = shadow / "pysyncobj" / "syncobj.py"
    text = syncobj_py.read_text()
    assert text.count("__getEntries(") > 1
    syncobj_py.write_text(text.replace("__getEntries(", "__entriesFrom("))
    version_py = shadow / "pysyncobj" / "version.py"
    assert f"VERSION = '{compat.PINNED_VERSION}'" in version_py.read_text()
    version_py.write_text("VERSION = '0.3.18'\n")
    run = subprocess.run(
        [sys.executable, "-c", "import mqmeta.controller.raft_node"],
        env={**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode != 0
    assert "PysyncobjIncompatible" in run.stderr
    assert "pysyncobj 0.3.18 is installed" in run.stderr
    assert "SyncObj._SyncObj__getEntries is missing" in run.stderr


def test_a_journal_lacking_an_interface_method_is_refused():
    class NoTimer(DurableJournal):
        onOneSecondTimer = None  # type: ignore[assignment]

    before = pysyncobj.syncobj.createJournal
    with pytest.raises(compat.PysyncobjIncompatible, match="NoTimer lacks \\['onOneSecondTimer'\\]"):
        compat.install_journal_factory(lambda journal_file: None, NoTimer)
    assert pysyncobj.syncobj.createJournal is before


def test_import_changes_nothing_and_install_is_explicit_and_idempotent():
    script = """
import os
import pysyncobj.journal, pysyncobj.serializer, pysyncobj.syncobj
import mqmeta.controller.raft_node as raft_node
from mqmeta.controller import pysyncobj_compat as compat
from mqmeta.controller import snapshot
stock = (pysyncobj.journal.createJournal, os.rename)
assert (pysyncobj.syncobj.createJournal, pysyncobj.serializer.atomicReplace) == stock, "import patched"
raft_node.install_pysyncobj_patches()
installed = (pysyncobj.syncobj.createJournal, pysyncobj.serializer.atomicReplace)
assert installed == (raft_node._create_journal, snapshot.guarded_replace), installed
raft_node.install_pysyncobj_patches()
assert (pysyncobj.syncobj.createJournal, pysyncobj.serializer.atomicReplace) == installed
print("ok")
"""
    run = run_script(script)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_cryptography_is_not_imported_even_for_a_raft_secret():
    script = """
import sys
import mqmeta.controller.server, mqmeta.cli  # what `mqmeta controller` imports
import pysyncobj.syncobj
from mqmeta.controller import pysyncobj_compat, pysyncobj_lazy_crypto
assert "cryptography" not in sys.modules, "imported at start"
assert pysyncobj.syncobj.HAS_CRYPTO
ours = pysyncobj.syncobj.getEncryptor("a secret")
connection = pysyncobj_compat.AeadTcpConnection(None)
connection.encryptor, connection.recvRandKey = ours, b"k" * 32 + pysyncobj_compat.FRAME_MARK
connection.sendRandKey = b"p" * 32 + pysyncobj_compat.FRAME_MARK
assert connection._frames_ready() and connection._sealer.encrypt(bytes(12), b"m", b"h")
assert "cryptography" not in sys.modules, "imported for a secret"
stock = pysyncobj_lazy_crypto.stock_encryptor()  # pysyncobj's own, with cryptography
assert stock.SALT == pysyncobj_lazy_crypto.PBKDF2_SALT
stock = stock.getEncryptor("a secret")
assert stock.decrypt(ours.encrypt(b"entry")) == b"entry" == ours.decrypt(stock.encrypt(b"entry"))
print("ok")
"""
    run = run_script(script)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


# A real ControllerRaft in this process --------------------------------------------------


class Controllers:
    """Single-node ControllerRafts in this process, bound to an ephemeral port on 127.0.0.1."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.running: list[ControllerRaft] = []

    def start(self, settings: RaftSettings | None = None) -> ControllerRaft:
        address = "127.0.0.1:0"  # one node: nobody dials it, its identity is never used
        node = ControllerRaft(
            "n1",
            address,
            [Peer("n1", address, "")],
            self.data_dir,
            settings or RaftSettings(),
            on_events=lambda index, events: None,
        )
        self.running.append(node)
        wait_for(node.is_leader, 10.0, "the single node to elect itself")
        return node

    def stop(self, node: ControllerRaft) -> None:
        self.running.remove(node)
        node.close()
        wait_for(lambda: not node.tick_thread_alive(), 10.0, "the Raft thread to stop")


@pytest.fixture
def controllers(tmp_path):
    made = Controllers(tmp_path / "n1")
    yield made
    for node in list(made.running):
        made.stop(node)


class _SleepRecorder(types.SimpleNamespace):
    """pysyncobj.syncobj's `time` module, recording each sleep it asks for."""

    def __init__(self) -> None:
        super().__init__(sleeps=[])

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_node_ticks_as_soon_as_its_port_is_bound(controllers, monkeypatch):
    recorder = _SleepRecorder()
    monkeypatch.setattr(pysyncobj.syncobj, "time", recorder)
    controllers.start()  # ControllerRaft installs the patches, then builds its node
    assert 0.1 not in recorder.sleeps, f"the tick thread slept before its first tick: {recorder.sleeps}"


def barriers(node: ControllerRaft, count: int) -> None:
    for _ in range(count):
        node._apply_entry(json.dumps([{"type": "barrier"}]), sync=True, timeout=5.0)


def test_a_controller_writes_our_journal(controllers, tmp_path):
    node = controllers.start()
    barriers(node, 5)
    assert isinstance(compat.raft_journal(node), DurableJournal)
    data = (tmp_path / "n1" / "raft.journal").read_bytes()
    assert data.startswith(FILE_MAGIC), "the journal on disk is not ours"
    entries, _, end = parse_records(data, "raft.journal")
    assert not data[end:].strip(b"\0"), "past the records: only the zeros written ahead"
    assert len(entries) >= 5 + 2  # pysyncobj's first no-op, the leader's no-op
    assert entries[-1] == compat.entries_from(node, entries[-1][1], 1)[0]


class DiskEvents:
    """Records, in order, every fsync (with the path and inode of the file), every rename
    (Python's os.rename audit event: also pysyncobj's own os.rename) and every journal
    compaction (with the inode the snapshot file had when it began, and when it ended)."""

    hook_added = False
    active: DiskEvents | None = None

    def __init__(self, monkeypatch, snapshot: Path) -> None:
        self.events: list[tuple] = []
        self.snapshot = snapshot
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_ino))
            real_fsync(fd)

        real_compact = DurableJournal.deleteEntriesTo

        def compact(journal: DurableJournal, entry_to: int) -> None:
            inode = os.stat(self.snapshot).st_ino if self.snapshot.exists() else None
            self.events.append(("compact", entry_to, inode))
            real_compact(journal, entry_to)
            self.events.append(("compacted", entry_to))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(DurableJournal, "deleteEntriesTo", compact)
        if not DiskEvents.hook_added:
            sys.addaudithook(DiskEvents._audit)  # cannot be removed: it checks `active`
            DiskEvents.hook_added = True
        DiskEvents.active = self

    @staticmethod
    def _audit(event: str, args: tuple) -> None:
        recorder = DiskEvents.active
        if event == "os.rename" and recorder is not None:
            recorder.events.append(("rename", os.fsdecode(args[0]), os.fsdecode(args[1])))

    def stop(self) -> None:
        DiskEvents.active = None


def test_snapshot_is_durable_before_the_journal_is_compacted(controllers, tmp_path, monkeypatch):
    data_dir = tmp_path / "n1"
    snapshot = data_dir / "raft.snapshot"
    node = controllers.start()
    barriers(node, 5)
    recorder = DiskEvents(monkeypatch, snapshot)
    try:
        node.forceLogCompaction()
        wait_for(lambda: any(e[0] == "compacted" for e in recorder.events), 10.0, "a journal compaction")
    finally:
        recorder.stop()
    events = recorder.events
    compaction = next(i for i, e in enumerate(events) if e[0] == "compact")
    snapshot_inode = events[compaction][2]
    renamed = [
        i for i, e in enumerate(events[:compaction]) if e[:3] == ("rename", f"{snapshot}.tmp", str(snapshot))
    ]
    assert renamed, f"no snapshot was renamed into place before the compaction: {events}"
    data_synced = [i for i, e in enumerate(events[:compaction]) if e[0] == "fsync" and e[2] == snapshot_inode]
    assert data_synced and data_synced[-1] < renamed[-1], f"snapshot data not fsynced before: {events}"
    directory = os.path.realpath(data_dir)  # /proc/self/fd names the real path
    directory_synced = [e for e in events[renamed[-1] : compaction] if e[0] == "fsync" and e[1] == directory]
    assert directory_synced, f"the snapshot's directory entry was not fsynced before compaction: {events}"
    # and the snapshot pysyncobj wrote is what read_position (so the restart path) reads
    last, previous = read_position(snapshot)
    journal = compat.raft_journal(node)
    assert (journal[0], journal[1]) == (previous, last)


def test_the_snapshot_carries_the_replicated_state(controllers):
    """The state snapshot: after a compaction the state exists only in the snapshot; a
    restarted node must get it back from there."""
    node = controllers.start()
    put = [{"type": "put_topic", "name": "KeptInSnapshot", "queue_count": 2}]
    node._apply_entry(json.dumps(put), sync=True, timeout=5.0)
    put_index = node.raftLastApplied
    barriers(node, 3)
    digest = node.state.digest
    node.forceLogCompaction()
    journal = compat.raft_journal(node)
    wait_for(lambda: journal[0][1] > put_index, 10.0, "the journal to be compacted past the topic")
    controllers.stop(node)
    again = controllers.start()
    wait_for(lambda: again.raftLastApplied >= put_index + 3, 10.0, "the restarted node to apply")
    assert again.state.get("topic/KeptInSnapshot") is not None, "the snapshot lost the state"
    assert again.state.digest == digest


# Two real SyncObj nodes on loopback, ticked by hand ---------------------------------------


class Counter(SyncObj):
    def __init__(self, address: str, peer: str, conf: SyncObjConf, transport: type = TCPTransport) -> None:
        super().__init__(address, [peer], conf, transportClass=transport)
        self.value = 0

    @replicated
    def inc(self) -> int:
        self.value += 1
        return self.value


class LeaderWithNextIndexFix(compat.NextIndexFix, Counter):
    pass


class FollowerWithHeldEntriesFix(compat.HeldEntriesFix, Counter):
    pass


class RecordingTransport(TCPTransport):
    """Remembers the Raft index of every entry this node sends, per peer."""

    sent: dict[str, dict[str, list[int]]] = {}  # sender address -> peer address -> indexes

    def __init__(self, syncObj, selfNode, otherNodes) -> None:  # noqa: N803 - pysyncobj's names
        self.sender = selfNode.address
        super().__init__(syncObj, selfNode, otherNodes)

    def send(self, node, message) -> bool:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            indexes = [entry[1] for entry in message.get("entries", [])]
            RecordingTransport.sent.setdefault(self.sender, {}).setdefault(node.address, []).extend(indexes)
        return bool(super().send(node, message))


def manual_conf(address: str, election_s: float) -> SyncObjConf:
    return SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=False,
        appendEntriesPeriod=0.05,
        raftMinTimeout=election_s,
        raftMaxTimeout=election_s * 1.5,
        connectionTimeout=max(5.0, election_s * 1.5),
        bindAddress=address,
        maxBindRetries=1,
    )


_HELD: list[PortReservation] = []  # for the whole module: never handed out twice


@pytest.fixture(scope="module", autouse=True)
def _release_held_ports() -> Iterator[None]:
    yield
    while _HELD:
        _HELD.pop().release()


def loopback_addresses(count: int) -> list[str]:
    """Ports held (cluster.ports.PortReservation) until the test process ends. A port found
    by listening on port 0 and closing is free for anyone: a cluster on the other worker
    could reserve it before pysyncobj binds it, and then lose it to pysyncobj."""
    _HELD.append(PortReservation.pick(count))
    return _HELD[-1].addresses


def bind_pair(
    make_leader: Callable[[str, str], Any], make_follower: Callable[[str, str], Any]
) -> tuple[Any, Any]:
    """Two nodes made with (own address, peer address): pysyncobj needs both addresses up
    front, so a port taken meanwhile is retried with two new ones."""
    for _ in range(BIND_ATTEMPTS_MAX):
        leader_address, follower_address = loopback_addresses(2)
        try:
            leader = make_leader(leader_address, follower_address)
        except SyncObjException:
            continue
        try:
            follower = make_follower(follower_address, leader_address)
        except SyncObjException:
            leader.destroy()
            continue
        return leader, follower
    pytest.fail(f"could not bind two loopback ports in {BIND_ATTEMPTS_MAX} attempts")


def start_pair(leader_class: type, follower_class: type, transport: type = TCPTransport) -> tuple[Any, Any]:
    """A leader-to-be (short election timeout) and a follower (one that never runs out)."""
    return bind_pair(
        lambda own, peer: leader_class(own, peer, manual_conf(own, 0.2), transport),
        lambda own, peer: follower_class(own, peer, manual_conf(own, 30.0), transport),
    )


def tick_both(leader, follower) -> Callable[[], None]:
    def step() -> None:
        leader.doTick(0.005)
        follower.doTick(0.005)

    return step


def in_step(leader, follower) -> bool:
    """The follower knows the leader and holds (and the leader knows it holds) everything."""
    status = leader.getStatus()
    last = status["commit_idx"]
    return (
        compat.is_leader(leader)
        and compat.leader_address(follower) == leader.selfNode.address
        and status.get(f"match_idx_server_{follower.selfNode.address}") == last
        and follower.getStatus()["log_len"] == status["log_len"]
        and leader.raftLastApplied == last
        and follower.raftLastApplied == last
    )


def stale_ack_scenario(leader, follower) -> tuple[int, list[int]]:
    """Makes a follower's acknowledgement reach the leader after newer entries went out.

    Returns (the first new index, the indexes the leader sent the follower since). With
    manual ticks the order is exact: in one leader tick pysyncobj first sends what was
    proposed, then reads the network."""
    step = tick_both(leader, follower)
    wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
    first = leader.getStatus()["commit_idx"] + 1
    RecordingTransport.sent.clear()
    leader.inc(callback=lambda result, error: None)
    leader.doTick(0.0)  # sends entry `first`
    wait_for(
        lambda: follower.getStatus()["log_len"] == leader.getStatus()["log_len"],
        5.0,
        "the follower to store (and acknowledge) the first entry",
        lambda: follower.doTick(0.005),
    )
    leader.inc(callback=lambda result, error: None)
    leader.inc(callback=lambda result, error: None)
    # The next tick sends first+1 and first+2, then reads the (now stale) ack of `first`.
    key = f"match_idx_server_{follower.selfNode.address}"
    wait_for(
        lambda: leader.getStatus()[key] >= first,
        5.0,
        "the leader to read the ack",
        lambda: leader.doTick(0.02),
    )
    leader.inc(callback=lambda result, error: None)
    leader.doTick(0.0)  # proposes first+3: sends from the follower's nextIndex on
    wait_for(lambda: in_step(leader, follower), 10.0, "the follower to catch up", step)
    sent = RecordingTransport.sent[leader.selfNode.address][follower.selfNode.address]
    return first, sent


def stop_pair(*nodes) -> None:
    for node in nodes:
        node.destroy()  # manual ticks: destroys at once


def test_a_stale_ack_does_not_move_next_index_back():
    leader, follower = start_pair(LeaderWithNextIndexFix, Counter, RecordingTransport)
    try:
        first, sent = stale_ack_scenario(leader, follower)
        assert [i for i in sent if i >= first] == [first, first + 1, first + 2, first + 3], (
            f"entries sent to the follower from index {first} on: {sent}"
        )
        status = leader.getStatus()
        assert status[f"next_node_idx_server_{follower.selfNode.address}"] == first + 4
    finally:
        stop_pair(leader, follower)


def test_a_follower_keeps_entries_it_already_holds():
    leader, follower = start_pair(Counter, FollowerWithHeldEntriesFix, RecordingTransport)
    journal = compat.raft_journal(follower)
    truncations: list[int] = []
    real_delete = journal.deleteEntriesFrom

    def delete_entries_from(entry_from: int) -> None:
        truncations.append(entry_from)
        real_delete(entry_from)

    journal.deleteEntriesFrom = delete_entries_from
    try:
        first, sent = stale_ack_scenario(leader, follower)
        resent = sorted({i for i in sent if i >= first and sent.count(i) > 1})
        assert resent, f"pysyncobj's leader did not resend (nothing to check): {sent}"
        assert truncations == [], f"the follower truncated entries it held (resent: {resent})"
        last = leader.getStatus()["commit_idx"]
        assert compat.entries_from(follower, first, last) == compat.entries_from(leader, first, last)
        assert follower.value == leader.value == 4, "four increments, each applied once"
    finally:
        stop_pair(leader, follower)


class FollowerWithSnapshotCommitFix(compat.SnapshotCommitFix, Counter):
    pass


def increment_entry(node: Counter, index: int, term: int) -> tuple[bytes, int, int]:
    """A journal entry of `node.inc()`, as pysyncobj's leader would send it."""
    command = pysyncobj.syncobj._bchr(pysyncobj.syncobj._COMMAND_TYPE.REGULAR)
    (function_id,) = (i for name, i in node._methodToID.items() if "inc" in str(name))
    return command + pysyncobj.pickle.dumps(function_id), index, term


@pytest.mark.parametrize(
    "serialized", [None, (b"the first 64 KB", True, False)], ids=["unreadable", "first-piece"]
)
def test_a_snapshot_message_commits_no_unmatched_entry(serialized):
    """A deposed leader's uncommitted tail (indexes 2-3, term 1) is not applied when the
    new leader (term 2, commit index 10, compacted past them) sends a snapshot: pysyncobj
    raises the commit index on a snapshot message without the log-matching check."""
    follower_address, peer_address = loopback_addresses(2)  # the peer only names the sender
    follower = FollowerWithSnapshotCommitFix(
        follower_address, peer_address, manual_conf(follower_address, 30.0)
    )
    try:
        deliver = follower._SyncObj__onMessageReceived
        sender = next(iter(follower.otherNodes))
        tail = [increment_entry(follower, 2, 1), increment_entry(follower, 3, 1)]
        deliver(
            sender,
            {
                "type": "append_entries",
                "term": 1,
                "commit_index": 1,
                "entries": tail,
                "prevLogIdx": 1,
                "prevLogTerm": 0,
            },
        )
        assert compat.entries_from(follower, 2, 2) == tail and follower.getStatus()["commit_idx"] == 1
        deliver(sender, {"type": "append_entries", "term": 2, "commit_index": 10, "serialized": serialized})
        follower.doTick(0.0)  # applies what is committed
        assert follower.value == 0, "the follower applied entries the new leader never committed"
        assert follower.getStatus()["commit_idx"] == 1
    finally:
        follower.destroy()


class PromptFollower(compat.PromptElectionFix, Counter):
    pass


def test_a_follower_stands_at_its_election_deadline_not_at_the_end_of_a_wait():
    """PromptElectionFix: a tick asked to wait up to 2 s for input (pysyncobj waits up to
    autoTickPeriod, 50 ms for a controller) waits only until the election deadline, so
    the follower whose leader is silent stands then; pysyncobj's own waits the 2 s."""
    leader, follower = start_pair(Counter, PromptFollower)
    step = tick_both(leader, follower)
    try:
        wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
        started = compat.monotonic_time()
        follower._SyncObj__raftElectionDeadline = started + 0.1  # the leader ticks no more from here
        stood_at = None
        while stood_at is None and compat.monotonic_time() - started < 6.0:
            tick_started = compat.monotonic_time()
            follower.doTick(2.0)
            if follower.getStatus()["state"] == 1:  # a candidate: it stood at this tick's start
                stood_at = tick_started - started
        assert stood_at is not None and stood_at < 0.5, stood_at
    finally:
        stop_pair(leader, follower)


class HandingOverLeader(compat.LeadershipTransfer, Counter):
    pass


def test_a_leader_handing_over_appends_no_forwarded_write():
    """Once asked to hand over, a leader refuses a write its follower forwards (as a
    non-leader does: the follower's caller retries elsewhere) and its log stays as long
    as the successor's; the successor takes over by the hand-over."""
    leader, follower = start_pair(HandingOverLeader, HandingOverLeader)
    step = tick_both(leader, follower)
    try:
        wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
        log_len = leader.getStatus()["log_len"]
        answers: list[Any] = []
        leader.request_leadership_transfer()
        follower.inc(callback=lambda result, error: answers.append(error))
        follower.doTick(0.0)  # forwards the write to its leader
        wait_for(lambda: answers, 5.0, "the forwarded write's answer", step)
        assert answers == [FAIL_REASON.NOT_LEADER]
        wait_for(lambda: compat.is_leader(follower), 5.0, "the successor to lead", step)
        assert follower.getStatus()["log_len"] == log_len + 1  # its term's no-op only
        assert follower.elected_by_hand_over() and not compat.is_leader(leader)
    finally:
        stop_pair(leader, follower)


def test_a_write_forwarded_before_the_request_is_appended_before_the_transfer():
    """A write a follower forwarded just before the request waits in pysyncobj's queue:
    it is appended (and committed) before timeout_now goes out, never after it, so the
    successor holds it when it stands and the old leader grants its vote."""
    leader, follower = start_pair(HandingOverLeader, HandingOverLeader)
    step = tick_both(leader, follower)
    try:
        wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
        answers: list[Any] = []
        follower.inc(callback=lambda result, error: answers.append((result, error)))
        follower.doTick(0.0)  # forwards the write
        wait_for(
            lambda: compat.is_leader(leader) and leader._commands_queued(), 5.0, "it queued", leader.doTick
        )
        transport = leader._SyncObj__transport
        real_send = transport.send
        asked_at: list[int] = []  # the old leader's last index when timeout_now went out

        def send(node, message):
            if isinstance(message, dict) and message.get("type") == "timeout_now":
                asked_at.append(leader._SyncObj__getCurrentLogIndex())
            return real_send(node, message)

        transport.send = send
        old_term = leader.raftCurrentTerm
        leader.request_leadership_transfer()
        wait_for(lambda: compat.is_leader(follower), 5.0, "the successor to lead by the hand-over", step)
        wait_for(lambda: answers, 5.0, "the forwarded write's answer", step)
        assert answers == [(1, FAIL_REASON.SUCCESS)] and follower.elected_by_hand_over()
        after = compat.entries_from(leader, asked_at[0] + 1, 10)
        assert [term for _, _, term in after if term == old_term] == []  # none of its term after it
    finally:
        stop_pair(leader, follower)


class StoppingLeaderReadingFirst(compat.LeadershipTransfer, compat.InputFirstFix, Counter):
    """The controllers' order: LeadershipTransfer's tick runs before InputFirstFix's read."""


def test_a_stopping_leader_that_refuses_a_vote_in_its_tick_does_not_stand():
    """A request_vote read at the start of a tick (InputFirstFix) deposes the stopping
    leader; refused (its log is longer), it leaves the deadline that ran out while it led,
    and pysyncobj's election check follows in the same tick: it must not stand."""
    leader, follower = start_pair(StoppingLeaderReadingFirst, Counter)
    step = tick_both(leader, follower)
    try:
        wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
        leader.inc(callback=lambda result, error: None)
        leader.doTick(0.0)  # appends and sends an entry the follower will not read in time
        follower._SyncObj__raftElectionDeadline = 0.0
        follower.doTick(0.0)  # stands first (pysyncobj decides before it reads), its log shorter
        term = follower.raftCurrentTerm
        leader._SyncObj__raftElectionDeadline = 0.0  # it has led for longer than a timeout
        leader.request_leadership_transfer()
        time.sleep(0.05)  # the request_vote is in the leader's socket
        leader.doTick(0.0)
        assert leader.raftCurrentTerm == term and leader.getStatus()["state"] == 0
    finally:
        stop_pair(leader, follower)


def test_a_node_that_handed_over_never_stands_for_election_again():
    """The old leader's election deadline ran out while it led: without the rule it
    stands as soon as it is a follower (and, its log as long, could win, and then exit).
    Here its vote is granted (pysyncobj then resets its deadline) and the successor falls
    silent, so the rule at each tick is what keeps it a follower."""
    leader, follower = start_pair(HandingOverLeader, Counter)
    step = tick_both(leader, follower)
    try:
        wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
        leader.request_leadership_transfer()
        wait_for(lambda: compat.is_leader(follower), 5.0, "the successor to lead", step)
        term = follower.raftCurrentTerm
        deadline = time.monotonic() + 1.0  # over three of the old leader's election timeouts
        while time.monotonic() < deadline:
            leader.doTick(0.01)  # the successor is silent: no heartbeat resets the old leader
        assert leader.raftCurrentTerm == term and not compat.is_leader(leader)
        assert leader.getStatus()["state"] == 0  # a follower, not a candidate
    finally:
        stop_pair(leader, follower)


class TransferFixNode(compat.SnapshotTransferFix, SyncObj):
    """A node of three (no state of its own): only its snapshot transfers are looked at."""

    def __init__(self, address: str, peers: list[str], conf: SyncObjConf) -> None:
        super().__init__(address, peers, conf)


def _incoming_snapshot(node: Any) -> bytes | None:
    """What the node has received of the snapshot file it is writing (in memory here)."""
    return node._SyncObj__serializer._Serializer__incomingTransmissionFile


def test_a_follower_takes_snapshot_pieces_only_from_the_sender_of_the_first():
    """Pieces of another sender, or of the same sender in a later term (a leader deposed
    mid-transfer and elected again, going on with its old transfer), are not glued onto
    the file being received: pysyncobj appended every non-first piece."""
    address, *peers = loopback_addresses(3)
    node = TransferFixNode(address, peers, manual_conf(address, 30.0))
    try:
        deliver = node._SyncObj__onMessageReceived
        first, second = sorted(node.otherNodes, key=str)

        def piece(sender: Any, term: int, data: bytes, is_first: bool) -> None:
            message = {"type": "append_entries", "term": term, "commit_index": 0}
            deliver(sender, dict(message, serialized=(data, is_first, False)))

        piece(first, 2, b"first-1 ", True)
        piece(first, 2, b"first-2 ", False)
        piece(second, 3, b"second-7 ", False)  # the new leader's transfer began elsewhere
        piece(first, 4, b"first-3 ", False)  # the old leader again, with its old transfer
        received = pysyncobj.pickle.to_bytes(b"first-1 ") + pysyncobj.pickle.to_bytes(b"first-2 ")
        assert _incoming_snapshot(node) == received
        piece(first, 4, b"again-1 ", True)  # a new transfer from its first piece is taken
        piece(first, 4, b"again-2 ", False)
        again = pysyncobj.pickle.to_bytes(b"again-1 ") + pysyncobj.pickle.to_bytes(b"again-2 ")
        assert _incoming_snapshot(node) == again
    finally:
        node.destroy()


def test_a_lost_link_or_a_new_leadership_restarts_a_snapshot_transfer():
    """The pieces sent into a broken connection are gone: the next transfer to that node
    starts from the first piece, as does every transfer after the node is elected again.
    pysyncobj went on from where it was."""
    address, *peers = loopback_addresses(3)
    node = TransferFixNode(address, peers, manual_conf(address, 30.0))
    try:
        serializer = node._SyncObj__serializer
        serializer._Serializer__inMemorySerializedData = b"s" * (
            4 * serializer._Serializer__transmissionBatchSize
        )
        follower, other = sorted(node.otherNodes, key=str)

        def next_piece_is_first(target: Any) -> bool:
            return serializer.getTransmissionData(target)[1]

        assert next_piece_is_first(follower) and not next_piece_is_first(follower)
        assert next_piece_is_first(other) and not next_piece_is_first(other)
        node._SyncObj__onNodeDisconnected(follower)
        assert next_piece_is_first(follower), "a transfer went on across a lost link"
        assert not next_piece_is_first(other), "only the lost link's transfer ends"
        node._SyncObj__connectedNodes.update(node.otherNodes)  # else pysyncobj ends their transfers itself
        node._SyncObj__onBecomeLeader()
        assert next_piece_is_first(follower) and next_piece_is_first(other), "a leadership kept old transfers"
    finally:
        node.destroy()


class FollowerWithInputFirstFix(compat.InputFirstFix, Counter):
    pass


def start_stallable_pair(follower_class: type) -> tuple[Any, Any]:
    """A leader-to-be (election timeout 0.2 s) and a follower whose timeout (0.4-0.6 s) a
    test can outlast by not ticking it."""
    return bind_pair(
        lambda own, peer: Counter(own, peer, manual_conf(own, 0.2)),
        lambda own, peer: follower_class(own, peer, manual_conf(own, 0.4)),
    )


def term_after_a_follower_stall(follower_class: type) -> tuple[int, int, str]:
    """(term before, term after, the follower's leader) when the follower stalls for 1 s
    (longer than its election timeout) while the leader keeps sending heartbeats, then
    ticks once."""
    leader, follower = start_stallable_pair(follower_class)
    try:
        step = tick_both(leader, follower)
        wait_for(lambda: in_step(leader, follower), 10.0, "a leader and an up-to-date follower", step)
        term = follower.raftCurrentTerm
        stall_until = time.monotonic() + 1.0
        while time.monotonic() < stall_until:  # only the leader runs: its heartbeats queue up
            leader.doTick(0.005)
        follower.doTick(0.0)  # the first tick after the stall
        return term, follower.raftCurrentTerm, compat.leader_address(follower)
    finally:
        stop_pair(leader, follower)


def test_a_stalled_follower_reads_the_leaders_heartbeats_before_electing_itself():
    before, after, leader = term_after_a_follower_stall(FollowerWithInputFirstFix)
    assert after == before, f"the follower started an election (term {before} -> {after})"
    assert leader, "the follower lost track of its leader"


class Relay(threading.Thread):
    """A TCP forwarder on 127.0.0.1 (its own port): counts the connections it carried."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.accepted = 0
        self.stopping = threading.Event()
        self.selector = selectors.DefaultSelector()

    def run(self) -> None:
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, None)
        while not self.stopping.is_set():
            for key, _ in self.selector.select(timeout=0.05):
                if key.data is None:
                    self._accept()
                else:
                    self._pump(key.fileobj, key.data)

    def _accept(self) -> None:
        inbound, _ = self.server.accept()
        outbound = socket.create_connection(self.target, timeout=2.0)
        self.accepted += 1
        for a, b in ((inbound, outbound), (outbound, inbound)):
            a.setblocking(False)
            self.selector.register(a, selectors.EVENT_READ, b)

    def _pump(self, source: Any, destination: socket.socket) -> None:
        try:
            data = source.recv(65536)
            if data:
                destination.setblocking(True)
                destination.sendall(data)
                destination.setblocking(False)
                return
        except OSError:
            pass
        for s in (source, destination):
            try:
                self.selector.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


class LeaderWithPromptAppend(compat.PromptAppendOnConnect, Counter):
    pass


HEARTBEAT_NEVER_S = 60.0  # longer than the test: only a prompt send reaches the follower


def quick_redial_conf(address: str, election_s: float) -> SyncObjConf:
    conf = manual_conf(address, election_s)
    conf.connectionRetryTime = 0.1  # whichever node dials (the higher address) redials soon
    return conf


def restarted_follower_hears_its_leader(leader_class: type) -> bool:
    """A pair forms, the leader's heartbeat is then set a minute apart (pysyncobj checks the
    period against the election timeout only at start), the follower is destroyed and
    started again on its address: whether it learns who leads within RESTART_HEARD_S."""
    for _ in range(BIND_ATTEMPTS_MAX):
        leader_address, follower_address = loopback_addresses(2)
        try:
            leader = leader_class(leader_address, follower_address, quick_redial_conf(leader_address, 0.2))
        except SyncObjException:
            continue
        break
    else:
        pytest.fail(f"could not bind a loopback port in {BIND_ATTEMPTS_MAX} attempts")
    follower = Counter(follower_address, leader_address, quick_redial_conf(follower_address, 30.0))
    restarted = None
    try:
        wait_for(
            lambda: compat.leader_address(follower) == leader_address,
            10.0,
            "the follower to hear of its leader",
            tick_both(leader, follower),
        )
        conf = leader._SyncObj__conf
        conf.appendEntriesPeriod, conf.leaderFallbackTimeout = HEARTBEAT_NEVER_S, 2 * HEARTBEAT_NEVER_S
        for _ in range(20):  # the heartbeat already due goes out; the next is a minute away
            tick_both(leader, follower)()
        follower.destroy()
        restarted = Counter(follower_address, leader_address, quick_redial_conf(follower_address, 30.0))
        step = tick_both(leader, restarted)
        deadline = time.monotonic() + RESTART_HEARD_S
        while time.monotonic() < deadline and compat.leader_address(restarted) != leader_address:
            step()
        return compat.leader_address(restarted) == leader_address
    finally:
        stop_pair(*(n for n in (leader, follower, restarted) if n is not None))


RESTART_HEARD_S = 3.0  # connecting takes up to connectionRetryTime (0.1 s here), then a tick


def test_a_restarted_follower_hears_its_leader_once_connected():
    assert restarted_follower_hears_its_leader(LeaderWithPromptAppend), "not within the connect"
    assert not restarted_follower_hears_its_leader(Counter), "a stock leader sent before its heartbeat"


def test_raft_connects_through_the_dial_map(monkeypatch):
    """The controller's transport (DialHookTransport + mqmeta.dialmap): the node that
    dials reaches its peer only through the relay the dial map names; the cluster forms,
    replicates, and each node knows the other by its real address."""
    for _ in range(BIND_ATTEMPTS_MAX):
        low, high = sorted(loopback_addresses(2))  # pysyncobj: the higher address dials
        relay = Relay(low)
        relay.start()
        monkeypatch.setattr(dialmap, "_mapping", {low: relay.address})
        try:
            dialer = Counter(high, low, manual_conf(high, 0.2), raft_node._DialingTransport)
        except SyncObjException:
            relay.stop()
            continue
        try:
            listener = Counter(low, high, manual_conf(low, 30.0), raft_node._DialingTransport)
        except SyncObjException:
            dialer.destroy()
            relay.stop()
            continue
        break
    else:
        pytest.fail(f"could not bind two loopback ports in {BIND_ATTEMPTS_MAX} attempts")
    try:
        wait_for(lambda: in_step(dialer, listener), 10.0, "a cluster formed", tick_both(dialer, listener))
        assert relay.accepted >= 1, "the dialing node did not connect through the dial map"
        dialer.inc(callback=lambda result, error: None)
        wait_for(lambda: listener.value == 1, 5.0, "the entry to reach the peer", tick_both(dialer, listener))
        assert (
            compat.leader_address(listener) == high
            and dialer.getStatus()[f"partner_node_status_server_{low}"]
        )
    finally:
        stop_pair(dialer, listener)
        relay.stop()


def test_profiling_wrappers_see_every_tick_and_message(monkeypatch):
    """wrap_tick and wrap_transport_send (the benchmark's profiler) run around pysyncobj's
    tick and every Raft message; monkeypatch restores pysyncobj's own afterwards."""
    monkeypatch.setattr(SyncObj, "_onTick", SyncObj._onTick)
    monkeypatch.setattr(TCPTransport, "send", TCPTransport.send)
    ticks: list[float] = []
    kinds: list[str] = []

    def on_tick(original, node, time_to_wait):
        ticks.append(time_to_wait)
        return original(node, time_to_wait)

    def on_send(original, transport, node, message):
        kinds.append(message.get("type") if isinstance(message, dict) else "?")
        return original(transport, node, message)

    compat.wrap_tick(on_tick)
    compat.wrap_transport_send(on_send)
    leader, follower = start_pair(Counter, Counter)
    try:
        wait_for(lambda: in_step(leader, follower), 10.0, "a cluster formed", tick_both(leader, follower))
        assert ticks and {"request_vote", "append_entries", "next_node_idx"} <= set(kinds)
    finally:
        stop_pair(leader, follower)


def test_the_raft_port_listens_on_its_own_address_only(tmp_path):
    """The Raft port speaks pickle: it must listen on the configured address, not on every
    interface (pysyncobj's default). 127.0.0.2 is another loopback address: a listener on
    0.0.0.0 would accept there too."""
    reservation = socket.socket()
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reservation.bind(("127.0.0.1", 0))  # held (not listening) so no one else takes the port
    address = f"127.0.0.1:{reservation.getsockname()[1]}"
    node = ControllerRaft(
        "n1", address, [Peer("n1", address, "")], tmp_path, RaftSettings(), on_events=lambda i, e: None
    )
    try:
        wait_for(node.is_leader, 10.0, "the single node to elect itself")
        socket.create_connection(("127.0.0.1", int(address.rpartition(":")[2])), timeout=2).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", int(address.rpartition(":")[2])), timeout=2).close()
    finally:
        node.close()
        reservation.close()


# QuietLinkFix: a link quiet both ways is not dropped when next used --------------------------


def message_after_a_quiet_spell(
    connection_class: type, monkeypatch, timeout_s: float = 0.3
) -> dict[str, Any]:
    """Two real connections (client and accepted) of `connection_class` on a real poller:
    one message, then nothing either way for over the connection timeout (two followers
    under a leader), then a second message (a request_vote)."""
    monkeypatch.setattr(pysyncobj.tcp_server, "TcpConnection", connection_class)
    poller = pysyncobj.poller.createPoller("auto")
    received: list[Any] = []
    accepted: list[Any] = []

    def on_new(conn) -> None:
        conn.setOnMessageReceivedCallback(received.append)
        accepted.append(conn)

    host, port = loopback_addresses(1)[0].rsplit(":", 1)
    server = pysyncobj.tcp_server.TcpServer(poller, host, int(port), on_new, connectionTimeout=timeout_s)
    server.bind()
    client = connection_class(poller, timeout=timeout_s)
    try:
        assert client.connect(host, int(port))
        step = lambda: poller.poll(0.01)  # noqa: E731 - a pump for wait_for
        wait_for(lambda: accepted and client.state == CONNECTION_STATE.CONNECTED, 5.0, "connected", step)
        client.send("first")
        wait_for(lambda: received == ["first"], 5.0, "the first message", step)
        quiet_until = time.monotonic() + 2 * timeout_s
        while time.monotonic() < quiet_until:
            poller.poll(0.01)
        client.send("after a quiet spell")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(received) < 2:
            poller.poll(0.01)
        return {"received": received, "client": client.state, "accepted": accepted[0].state}
    finally:
        client.disconnect()
        for conn in accepted:
            conn.disconnect()
        server.unbind()


def test_a_link_quiet_both_ways_carries_the_next_message(monkeypatch):
    """QuietLinkFix: the second message arrives and both ends stay connected; pysyncobj's
    own connection drops the link on that send (the message goes nowhere)."""
    fixed = message_after_a_quiet_spell(compat.QuietLinkFix, monkeypatch)
    assert fixed == {
        "received": ["first", "after a quiet spell"],
        "client": CONNECTION_STATE.CONNECTED,
        "accepted": CONNECTION_STATE.CONNECTED,
    }
    stock = message_after_a_quiet_spell(TcpConnection, monkeypatch)
    assert stock["received"] == ["first"] and stock["client"] == CONNECTION_STATE.DISCONNECTED


def test_a_link_whose_peer_stops_answering_is_still_dropped(monkeypatch):
    """QuietLinkFix keeps pysyncobj's dead-peer check for a link in use: messages sent
    every 50 ms with nothing read back for the timeout end the connection."""
    monkeypatch.setattr(pysyncobj.tcp_server, "TcpConnection", compat.QuietLinkFix)
    poller = pysyncobj.poller.createPoller("auto")
    accepted: list[Any] = []
    host, port = loopback_addresses(1)[0].rsplit(":", 1)
    server = pysyncobj.tcp_server.TcpServer(poller, host, int(port), accepted.append, connectionTimeout=0.3)
    server.bind()
    client = compat.QuietLinkFix(poller, timeout=0.3)
    try:
        assert client.connect(host, int(port))
        wait_for(
            lambda: accepted and client.state == CONNECTION_STATE.CONNECTED,
            5.0,
            "connected",
            lambda: poller.poll(0.01),
        )
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and client.state == CONNECTION_STATE.CONNECTED:
            client.send("heartbeat")  # the accepted end never answers
            poller.poll(0.05)
        assert client.state == CONNECTION_STATE.DISCONNECTED
    finally:
        client.disconnect()
        for conn in accepted:
            conn.disconnect()
        server.unbind()


# Raft messages sealed as frames (AeadTcpConnection) ----------------------------------------


class StockConnectionsTransport(TCPTransport):
    """A node of an older version: pysyncobj's own connections, whatever is installed."""

    def addNode(self, node) -> None:  # noqa: N802 - pysyncobj's name
        super().addNode(node)
        for connection in self._connections.values():
            connection.__class__ = TcpConnection

    def _onNewIncomingConnection(self, conn) -> None:  # noqa: N802 - pysyncobj's name
        conn.__class__ = TcpConnection
        super()._onNewIncomingConnection(conn)


class CountingFrames:
    """Counts Fernet tokens and sealed frames made in this process."""

    def __init__(self, monkeypatch) -> None:
        self.fernet = 0
        self.frames = 0
        aead, fernet_class = raft_ciphers.ciphers()
        real_fernet = fernet_class.encrypt_at_time
        real_seal = aead.encrypt

        def fernet(encryptor, data, current_time):
            self.fernet += 1
            return real_fernet(encryptor, data, current_time)

        def seal(aead, nonce, data, associated_data):
            self.frames += 1
            return real_seal(aead, nonce, data, associated_data)

        monkeypatch.setattr(fernet_class, "encrypt_at_time", fernet)
        monkeypatch.setattr(aead, "encrypt", seal)


def secret_pair(monkeypatch, follower_transport: type = TCPTransport) -> tuple[Any, Any]:
    monkeypatch.setattr(pysyncobj.syncobj, "getEncryptor", pysyncobj_lazy_crypto.encryptor_with_frame_key)
    monkeypatch.setattr(pysyncobj.transport, "TcpConnection", compat.AeadTcpConnection)
    monkeypatch.setattr(pysyncobj.tcp_server, "TcpConnection", compat.AeadTcpConnection)
    return bind_pair(
        lambda own, peer: Counter(own, peer, secret_conf(own, 0.2)),
        lambda own, peer: Counter(own, peer, secret_conf(own, 30.0), follower_transport),
    )


def secret_conf(address: str, election_s: float) -> SyncObjConf:
    conf = manual_conf(address, election_s)
    conf.password = "a secret"
    return conf


def increments(leader, follower, count: int) -> None:
    step = tick_both(leader, follower)
    wait_for(lambda: leader._isLeader() and follower.value == leader.value, 10.0, "a leader, in step", step)
    start = leader.value
    for _ in range(count):
        done: list[Any] = []
        leader.inc(callback=lambda result, error, done=done: done.append(error))
        wait_for(lambda done=done: bool(done), 10.0, "an increment to commit", step)
        assert done == [FAIL_REASON.SUCCESS]
    wait_for(lambda: follower.value == start + count, 10.0, "the follower to apply them", step)


def test_two_nodes_of_this_version_seal_their_messages_as_frames(monkeypatch):
    leader, follower = secret_pair(monkeypatch)
    try:
        increments(leader, follower, 1)  # connected, handshake done
        counted = CountingFrames(monkeypatch)
        increments(leader, follower, 20)
        assert counted.fernet == 0, f"{counted.fernet} messages went in Fernet after the handshake"
        assert counted.frames >= 40  # an append and its acknowledgement per write at least
    finally:
        stop_pair(leader, follower)


def test_a_node_of_an_older_version_and_one_of_this_version_talk_fernet(monkeypatch):
    leader, follower = secret_pair(monkeypatch, StockConnectionsTransport)
    try:
        increments(leader, follower, 1)
        counted = CountingFrames(monkeypatch)
        increments(leader, follower, 20)
        assert counted.frames == 0 and counted.fernet >= 40
    finally:
        stop_pair(leader, follower)


class _NoPoller:
    def subscribe(self, *args: Any) -> None: ...

    def unsubscribe(self, *args: Any) -> None: ...


def connected_ends() -> tuple[Any, Any]:
    """Two AeadTcpConnections past a marked handshake, without sockets: frames that one
    sends (its write buffer) are fed to the other (its read buffer) by the test."""
    encryptor = pysyncobj_lazy_crypto.encryptor_with_frame_key("a secret")
    a, b = compat.AeadTcpConnection(_NoPoller()), compat.AeadTcpConnection(_NoPoller())
    key_a, key_b = os.urandom(32) + compat.FRAME_MARK, os.urandom(32) + compat.FRAME_MARK
    a.encryptor = b.encryptor = encryptor
    a.recvRandKey, a.sendRandKey = key_a, key_b
    b.recvRandKey, b.sendRandKey = key_b, key_a
    return a, b


def sent_frames(sender: Any, messages: list[Any]) -> list[bytes]:
    frames = []
    for message in messages:
        sender.send(message)
        frames.append(sender._TcpConnection__writeBuffer)
        sender._TcpConnection__writeBuffer = b""
    return frames


def received(receiver: Any, data: bytes) -> tuple[Any, bool]:
    """(the message parsed from `data`, whether the connection was dropped)."""
    dropped: list[bool] = []
    receiver.disconnect = lambda: dropped.append(True)
    receiver._TcpConnection__readBuffer = data
    return receiver._TcpConnection__processParseMessage(), bool(dropped)


def test_a_frame_opens_once_in_order_and_unaltered_on_its_own_connection():
    a, b = connected_ends()
    big = {"type": "append_entries", "entries": [(os.urandom(8) * 4096, 7, 2)]}  # compressed
    first, second, third = sent_frames(a, [{"type": "ping", "n": 1}, big, {"type": "ping", "n": 3}])
    assert second[4] == compat.FRAME_MAGIC and b"ping" not in first  # sealed, not in clear
    assert received(b, first) == ({"type": "ping", "n": 1}, False)
    assert received(b, second) == (big, False)
    assert received(b, first) == (None, True), "a replayed frame was taken"
    assert received(b, third[:-1] + bytes([third[-1] ^ 1])) == (None, True), "an altered frame was taken"
    other, _ = connected_ends()  # another connection: other handshake keys
    (foreign,) = sent_frames(other, [{"type": "ping", "n": 9}])
    assert received(b, foreign)[1], "a frame of another connection was taken"
    (reply,) = sent_frames(b, [{"type": "pong"}])
    assert received(a, reply) == ({"type": "pong"}, False)  # each direction its own key and numbers
