"""The controller's state snapshots (controller/snapshot.py), on real files.

Properties checked:
- a frozen state does not change when the live state goes on applying commands (the
  writer thread reads it while the Raft thread applies);
- serialize() returns before the snapshot is written (the Raft thread is not held), and
  check() says SERIALIZING until then and SUCCESS exactly once after it;
- a snapshot read back holds every key, value and the digest it was written with, in
  several chunks; read_position (the restart check) finds its Raft position;
- snapshots in pysyncobj's stock format (written before this module) and in format 1
  (gzip of pickles, written before format 2) still load;
- format 2 keeps the values encoded until read: a load decodes no chunk, a read decodes
  the read key's chunk only, commands on encoded keys reach the same digest as on the
  state they were written from, and writing a snapshot of such a state decodes nothing
  for good; readers on other threads never find an encoded key missing while commits
  replace it; a flipped byte anywhere in the file, or a file cut short, is refused;
- a snapshot whose content does not add up to its recorded digest is refused;
- the start-up check's read (load_snapshot, with every check) is what the node installs:
  its snapshot file is read once at start; a file renamed over it since is read again;
- the garbage collector is held off while a snapshot is decoded, also by two threads at
  once, and is on again afterwards (off again if it was off);
- pysyncobj's own rename of a file still being written is refused, and a snapshot
  received from the leader cancels the writer: the older snapshot never lands over it.
"""

from __future__ import annotations

import copy
import gc
import gzip
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
from mqmeta.cluster.wait import wait_for
from mqmeta.controller import snapshot
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.snapshot import SnapshotInProgress, StateSnapshots, guarded_replace, read_snapshot
from mqmeta.controller.state_machine import ControllerState, apply
from pysyncobj import SERIALIZER_STATE

from mqmeta.errors import CorruptData

pytestmark = pytest.mark.timeout(60)

TAIL = ((b"last", 12, 3), (b"previous", 11, 3), set())  # (last entry, previous entry, cluster)


def loaded_state(topics: int) -> ControllerState:
    state = ControllerState()
    for replica in (1, 2, 3):
        command = {
            "type": "register_broker",
            "cluster": "c",
            "broker_name": "b",
            "address": f"127.0.0.1:{9000 + replica}",
            "check_code": f"b-{replica}",
        }
        assert apply(state, command_from_json(command), 1)[0]["ok"]
    for i in range(topics):
        result = apply(
            state, command_from_json({"type": "put_topic", "name": f"t{i}", "queue_count": 4}), 2 + i
        )[0]
        assert result["ok"], result
    return state


class Gate:
    """Holds the writer between chunks until opened (so a test can act mid-write)."""

    def __init__(self, monkeypatch) -> None:
        self.opened = threading.Event()
        self.reached = threading.Event()
        real_chunks = snapshot._chunks

        def gated(items, size):
            for chunk in real_chunks(items, size):
                self.reached.set()
                assert self.opened.wait(30.0), "the test never opened the gate"
                yield chunk

        monkeypatch.setattr(snapshot, "_chunks", gated)


def snapshots_of(state: ControllerState) -> tuple[StateSnapshots, list[ControllerState]]:
    installed: list[ControllerState] = []
    return StateSnapshots(lambda: state, installed.append), installed


def test_a_frozen_state_does_not_change_when_the_live_state_does():
    state = loaded_state(50)
    frozen = state.freeze()
    kept = copy.deepcopy(frozen.values)
    apply(
        state, command_from_json({"type": "put_topic", "mode": "update", "name": "t1", "queue_count": 8}), 100
    )
    apply(state, command_from_json({"type": "delete_topic", "name": "t2"}), 101)
    apply(
        state,
        command_from_json({"type": "elect_master", "cluster": "c", "broker_name": "b", "alive": {"1": {}}}),
        102,
    )
    apply(state, command_from_json({"type": "update_config", "values": {"default_queue_count": "16"}}), 103)
    assert frozen.values == kept, "a value shared with the live state was changed in place"
    assert state.digest != frozen.digest
    rebuilt = ControllerState.from_items(frozen.items())
    assert rebuilt.recompute_digest() == frozen.digest


def test_serialize_returns_before_the_file_is_written_and_success_comes_once(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    state = loaded_state(30)
    snapshots, _ = snapshots_of(state)
    target = tmp_path / "raft.snapshot"
    snapshots.serialize(f"{target}.tmp", TAIL)  # returns at once: the writer waits at the gate
    gate.reached.wait(10.0)
    assert snapshots.check() == SERIALIZER_STATE.SERIALIZING
    assert not target.exists()
    gate.opened.set()
    assert wait_for(lambda: snapshots.check() == SERIALIZER_STATE.SUCCESS, 10.0, "the writer to finish")
    assert snapshots.check() == SERIALIZER_STATE.NOT_SERIALIZING, "SUCCESS must be reported once"
    assert target.exists() and not Path(f"{target}.tmp").exists()


def test_a_snapshot_read_back_holds_every_key_and_its_raft_position(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "CHUNK_KEYS", 16)  # several chunks
    state = loaded_state(100)
    snapshots, installed = snapshots_of(state)
    target = tmp_path / "raft.snapshot"
    snapshots.serialize(f"{target}.tmp", TAIL)
    wait_for(lambda: snapshots.check() == SERIALIZER_STATE.SUCCESS, 10.0, "the writer to finish")
    loaded, tail = read_snapshot(target)
    assert loaded.entries == state.entries
    assert loaded.digest == state.digest == loaded.recompute_digest()
    assert tail[:2] == TAIL[:2]
    assert snapshot.read_position(target) == TAIL[:2]
    assert target.read_bytes().startswith(snapshot.MAGIC), "written in format 2"
    assert snapshots.deserialize(str(target))[:2] == TAIL[:2]
    assert installed and installed[0].digest == state.digest
    assert [t["name"] for t in installed[0].topics()] == [t["name"] for t in state.topics()]


def written_snapshot(state: ControllerState, target: Path) -> None:
    snapshots, _ = snapshots_of(state)
    snapshots.serialize(f"{target}.tmp", TAIL)
    wait_for(lambda: snapshots.check() == SERIALIZER_STATE.SUCCESS, 10.0, "the writer to finish")


def test_the_start_up_read_of_a_snapshot_is_the_one_installed(tmp_path, monkeypatch):
    state = loaded_state(30)
    target = tmp_path / "raft.snapshot"
    written_snapshot(state, target)
    loaded = snapshot.load_snapshot(target)  # what the start-up check (repair.py) reads
    assert loaded.state.digest == state.digest and loaded.tail[:2] == TAIL[:2]
    reads: list[Path] = []
    real_read = snapshot.read_snapshot
    monkeypatch.setattr(snapshot, "read_snapshot", lambda path: reads.append(path) or real_read(path))
    installed: list[ControllerState] = []
    snapshots = StateSnapshots(lambda: state, installed.append, loaded)
    assert snapshots.deserialize(str(target))[:2] == TAIL[:2]
    assert installed == [loaded.state] and reads == [], "the snapshot was read a second time"
    # Later loads (a snapshot received from the leader, renamed over it) read the file.
    os.replace(target, tmp_path / "old")
    written_snapshot(loaded_state(31), target)
    snapshots.deserialize(str(target))
    assert reads == [target] and len(installed[1].topics()) == 31


def test_a_start_up_read_of_another_file_is_not_installed(tmp_path):
    target = tmp_path / "raft.snapshot"
    written_snapshot(loaded_state(5), target)
    loaded = snapshot.load_snapshot(target)
    os.replace(target, tmp_path / "old")
    written_snapshot(loaded_state(6), target)  # renamed over it between the check and the load
    installed: list[ControllerState] = []
    StateSnapshots(lambda: ControllerState(), installed.append, loaded).deserialize(str(target))
    assert installed[0] is not loaded.state and len(installed[0].topics()) == 6


def format_1_snapshot(state: ControllerState, target: Path, chunk_keys: int = 7) -> None:
    """`state` in the format written before format 2 (gzip of pickles)."""
    frozen = state.freeze()
    items = list(frozen.items())
    chunks = [items[i : i + chunk_keys] for i in range(0, len(items), chunk_keys)]
    meta = {"format": snapshot.FORMAT_1, "keys": len(items), "chunks": len(chunks), "digest": frozen.digest}
    with gzip.open(target, "wb") as out:
        out.write(pickle.dumps((meta, *TAIL)) + b"".join(pickle.dumps(chunk) for chunk in chunks))


def test_the_collector_is_held_off_while_snapshots_are_decoded(tmp_path, monkeypatch):
    target = tmp_path / "raft.snapshot"
    format_1_snapshot(loaded_state(5), target)
    seen: list[bool] = []
    real_from_chunks = ControllerState.from_chunks.__func__  # type: ignore[attr-defined]

    def recording(cls, chunks):
        seen.append(gc.isenabled())
        if len(seen) == 1:
            read_snapshot(target)  # a second decode (another thread's) inside the first
            seen.append(gc.isenabled())
        return real_from_chunks(cls, chunks)

    monkeypatch.setattr(ControllerState, "from_chunks", classmethod(recording))
    assert gc.isenabled()
    read_snapshot(target)
    assert seen == [False, False, False] and gc.isenabled()
    gc.disable()
    try:
        read_snapshot(target)
        assert not gc.isenabled(), "a collector that was off was turned on"
    finally:
        gc.enable()


def test_a_snapshot_in_pysyncobjs_stock_format_still_loads(tmp_path):
    state = loaded_state(20)
    target = tmp_path / "raft.snapshot"
    with gzip.open(target, "wb") as out:
        pickle.dump(({"_state": state}, *TAIL), out)
    loaded, tail = read_snapshot(target)
    assert loaded.digest == state.digest and tail[:2] == TAIL[:2]


def test_a_format_1_snapshot_still_loads(tmp_path):
    state = loaded_state(40)
    target = tmp_path / "raft.snapshot"
    format_1_snapshot(state, target)
    loaded, tail = read_snapshot(target)
    assert loaded.entries == state.entries and loaded.digest == state.digest
    assert tail[:2] == TAIL[:2] and snapshot.read_position(target) == TAIL[:2]


def chunks_of(state: ControllerState) -> Any:
    return {id(chunk): chunk for chunk in state.freeze().encoded.values()}.values()


def test_a_format_2_snapshot_keeps_values_encoded_until_read(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "CHUNK_KEYS", 16)  # several chunks of topics
    state = loaded_state(100)
    target = tmp_path / "raft.snapshot"
    written_snapshot(state, target)
    loaded, _ = read_snapshot(target)
    chunks = chunks_of(loaded)
    assert len(chunks) == 8 and not any(c.is_decoded for c in chunks), "a load decoded values"
    assert loaded.key_count == state.key_count and loaded.digest == state.digest
    assert loaded.get("topic/t5") == state.get("topic/t5")
    assert sum(c.is_decoded for c in chunks) == 1, "a read decoded more than its key's chunk"
    commands = [
        {"type": "put_topic", "mode": "update", "name": "t70", "queue_count": 8},
        {"type": "delete_topic", "name": "t71"},
        {"type": "put_topic", "name": "new", "queue_count": 2},
        {"type": "elect_master", "cluster": "c", "broker_name": "b", "alive": {"1": {}}},
    ]
    for index, command in enumerate(commands, start=200):
        assert (
            apply(loaded, command_from_json(command), index)[0]
            == apply(state, command_from_json(command), index)[0]
        )
    assert loaded.digest == state.digest == loaded.recompute_digest()
    assert loaded.entries == state.entries
    assert [t["name"] for t in loaded.topics()] == [t["name"] for t in state.topics()]


def test_a_snapshot_of_an_encoded_state_holds_it_all_and_decodes_nothing_for_good(tmp_path):
    state = loaded_state(30)
    first, second = tmp_path / "first", tmp_path / "raft.snapshot"
    written_snapshot(state, first)
    loaded, _ = read_snapshot(first)
    apply(loaded, command_from_json({"type": "delete_topic", "name": "t3"}), 300)
    apply(state, command_from_json({"type": "delete_topic", "name": "t3"}), 300)
    decoded = {id(c) for c in chunks_of(loaded) if c.is_decoded}  # t3's, read by the delete
    written_snapshot(loaded, second)
    assert {id(c) for c in chunks_of(loaded) if c.is_decoded} == decoded, "the writer kept what it decoded"
    again, _ = read_snapshot(second)
    assert again.entries == state.entries and again.digest == state.digest


def big_value(round_: int) -> dict:
    """Large enough that hashing it (sha256 releases the GIL) lets readers run mid-commit."""
    return {"uploaded_offset": round_, "segments": [{"base_offset": k, "name": "s" * 40} for k in range(60)]}


def test_readers_beside_commits_never_find_an_encoded_key_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "CHUNK_KEYS", 8)
    keys = [f"tiered/c/b{i}" for i in range(64)]
    state = ControllerState()
    state.commit({key: big_value(0) for key in keys})
    target = tmp_path / "raft.snapshot"
    written_snapshot(state, target)
    loaded, _ = read_snapshot(target)
    stop = threading.Event()
    reads, missing, failures = [0], [0], []

    def read() -> None:
        try:
            while not stop.is_set():
                for key in keys:
                    reads[0] += 1
                    missing[0] += loaded.get(key) is None
                assert all(value is not None for _, value in loaded.with_prefix("tiered/"))
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_, key in enumerate(keys * 6, start=1):  # each key leaves its chunk, then changes again
            loaded.commit({key: big_value(round_)})
            state.commit({key: big_value(round_)})
    finally:
        stop.set()
        reader.join(10.0)
    assert not failures, failures
    assert missing[0] == 0, f"{missing[0]} of {reads[0]} reads found a key missing"
    assert loaded.digest == state.digest == loaded.recompute_digest()


def test_a_flipped_byte_anywhere_in_a_format_2_snapshot_or_a_cut_is_refused(tmp_path):
    state = loaded_state(20)
    target = tmp_path / "raft.snapshot"
    written_snapshot(state, target)
    original = target.read_bytes()
    positions = sorted(set(range(0, len(original), max(1, len(original) // 150))) | {len(original) - 1})
    for position in positions:
        data = bytearray(original)
        data[position] ^= 0x01
        target.write_bytes(bytes(data))
        with pytest.raises(CorruptData):
            read_snapshot(target)
        with pytest.raises(CorruptData):
            snapshot.read_position(target)
    for length in (len(original) - 1, len(original) // 2, len(snapshot.MAGIC), 0):
        target.write_bytes(original[:length])
        with pytest.raises(CorruptData):
            read_snapshot(target)


def test_a_snapshot_that_does_not_add_up_to_its_digest_is_refused(tmp_path):
    state = loaded_state(20)
    frozen = state.freeze()
    items = list(frozen.items())
    key, value, entry_hash = items[0]
    items[0] = (key, dict(value, queue_count=99), entry_hash + 1)  # a changed value and hash
    meta = {"format": snapshot.FORMAT_1, "keys": len(items), "chunks": 1, "digest": frozen.digest}
    target = tmp_path / "raft.snapshot"
    with gzip.open(target, "wb") as out:
        out.write(pickle.dumps((meta, *TAIL)) + pickle.dumps(items))
    with pytest.raises(CorruptData, match="not the .* keys with digest"):
        read_snapshot(target)


def test_a_received_snapshot_cancels_the_writer_and_is_never_overwritten(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    state = loaded_state(30)
    snapshots, _ = snapshots_of(state)
    target = tmp_path / "raft.snapshot"
    snapshots.serialize(f"{target}.tmp", TAIL)
    gate.reached.wait(10.0)
    # pysyncobj renames the temp file right after serialize() returns: refused mid-write
    with pytest.raises(SnapshotInProgress):
        guarded_replace(f"{target}.tmp", str(target))
    # a snapshot from the leader arrives and is renamed into place
    received = tmp_path / "raft.snapshot.1.tmp"
    received.write_bytes(b"the leader's newer snapshot")
    guarded_replace(str(received), str(target))
    gate.opened.set()
    assert wait_for(lambda: snapshots.check() == SERIALIZER_STATE.FAILED, 10.0, "the writer to give up")
    assert target.read_bytes() == b"the leader's newer snapshot"
    assert not Path(f"{target}.tmp").exists()
