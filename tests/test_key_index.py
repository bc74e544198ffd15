"""The key index and the store's message queries (broker_agent/key_index.py, store.py).

Properties checked:
- a query by key returns exactly the records that carry the key, newest first, also
  for records added by a slave's append and by the rebuild at open; a hash collision
  (two keys, one hash) is filtered out by reading the record;
- a query by id finds the record the store gave that id, and through the index a
  RocketMQ client's id; an id of another store is not found;
- the index survives a close and reopen (loaded, not rebuilt), a crash after the last
  checkpoint (the tail re-added from the log), a truncation (entries past it gone);
  a key file whose bytes no longer match the checkpoint's CRC is rebuilt, not trusted;
- the index is bounded: past entries_max the oldest half goes and covered_from rises;
- the first queue offset at or after a store time is found by binary search.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mqmeta.broker_agent import MessageStore
from mqmeta.broker_agent.key_index import KeyIndex

from mqmeta.formats import key_index as key_format
from mqmeta.formats.properties import MESSAGE_ID
from mqmeta.formats.records import Message

pytestmark = pytest.mark.timeout(60)


def _store(path: Path) -> MessageStore:
    store = MessageStore(path, fsync=False, broker_name="b1", index_checkpoint_bytes=1 << 30)
    if not store.epochs.entries:
        store.begin_epoch(1)
    return store


def _put(store: MessageStore, count: int, start_ms: int = 1000, queue_id: int = 0) -> list:
    messages = [Message("T", queue_id, f"body-{i}".encode(), keys=f"order-{i % 5} all") for i in range(count)]
    results = []
    for i, message in enumerate(messages):
        results += store.put_messages([message], store.epochs.last_epoch, start_ms + i)
    return results


def _keys_of(records) -> list[int]:
    return [r.commit_offset for r in records]


def test_query_by_key_and_id_survive_reopen_crash_and_truncation(tmp_path):
    store = _store(tmp_path / "s")
    results = _put(store, 20)
    order_1 = [r.commit_offset for i, r in enumerate(results) if i % 5 == 1]
    assert _keys_of(store.records_by_key("T", "order-1")) == order_1[::-1]
    assert len(store.records_by_key("T", "all")) == 20
    assert store.records_by_key("T", "order-9") == [] and store.records_by_key("U", "all") == []
    assert _keys_of(store.records_by_id(results[3].msg_id)) == [results[3].commit_offset]
    assert store.records_by_id("0" * 32) == []
    store.close()

    store = _store(tmp_path / "s")  # loaded from the checkpoint
    assert _keys_of(store.records_by_key("T", "order-1")) == order_1[::-1]
    more = _put(store, 5, start_ms=5000)  # past the last checkpoint: then a "crash"
    store.log.close()  # no checkpoint written: like kill -9
    store = _store(tmp_path / "s")
    assert len(store.records_by_key("T", "all")) == 25
    assert _keys_of(store.records_by_key("T", "order-1"))[0] == more[1].commit_offset

    store.truncate(more[0].commit_offset)
    assert len(store.records_by_key("T", "all")) == 20
    store.close()


def test_a_key_file_that_does_not_match_its_crc_is_rebuilt(tmp_path):
    store = _store(tmp_path / "s")
    results = _put(store, 10)
    store.close()
    key_file = tmp_path / "s" / "keys" / "T"
    data = bytearray(key_file.read_bytes())
    # point the first entry at another record: a lookup would find the wrong one
    data[key_format.KEY_INDEX_HEADER.size + 8] ^= 0xFF
    key_file.write_bytes(bytes(data))
    store = _store(tmp_path / "s")
    assert _keys_of(store.records_by_key("T", "order-0")) == [
        results[5].commit_offset,
        results[0].commit_offset,
    ]
    assert key_file.read_bytes() != bytes(data)
    store.close()


def test_slave_append_indexes_keys_and_client_ids(tmp_path):
    master = _store(tmp_path / "m")
    master.put_messages([Message("T", 0, b"x", keys="k1", properties={MESSAGE_ID: "CLIENT-ID-1"})], 1, 10)
    _put(master, 3)
    slave = MessageStore(tmp_path / "sl", fsync=False, broker_name="b1")
    slave.append_replicated(0, master.read_bytes(0, 1 << 20))
    for store in (master, slave):
        (found,) = store.records_by_id("CLIENT-ID-1")
        assert found.body == b"x" and found.commit_offset == 0
        assert _keys_of(store.records_by_key("T", "k1")) == [0]
        assert len(store.records_by_key("T", "all")) == 3
    master.close()
    slave.close()


def test_a_hash_collision_is_filtered_by_reading_the_record(tmp_path, monkeypatch):
    from mqmeta.broker_agent import key_index

    for module in (key_format, key_index):  # every name one hash
        monkeypatch.setattr(module, "name_hash", lambda kind, name: 7)
    store = _store(tmp_path / "s")
    store.put_messages([Message("T", 0, b"a", keys="alpha"), Message("T", 0, b"b", keys="beta")], 1, 10)
    assert [r.body for r in store.records_by_key("T", "beta")] == [b"b"]
    store.close()


def test_the_index_is_bounded(tmp_path):
    index = KeyIndex(tmp_path / "keys", entries_max=8)
    for offset in range(0, 1000, 100):
        index.add("T", "k", "", offset, {})
    assert index.topics["T"].count <= 8
    assert index.covered_from("T") > 0
    assert index.find("T", key_format.KEY_KIND, "k") == [900, 800, 700, 600, 500, 400]


def test_first_offset_at_or_after_a_time(tmp_path):
    store = _store(tmp_path / "s")
    _put(store, 50, start_ms=1000)
    assert store.queue_offset_at_time("T", 0, 0) == 0
    assert store.queue_offset_at_time("T", 0, 1017) == 17
    assert store.queue_offset_at_time("T", 0, 1049) == 49
    assert store.queue_offset_at_time("T", 0, 9999) == 50
    assert store.queue_offset_at_time("T", 3, 1000) == 0
    # bounded by what consumers may read (the confirm offset): the end of that when later
    confirm = store.record_at("T", 0, 30).commit_offset  # records 0..29 end by it
    assert store.queue_offset_at_time("T", 0, 1017, confirm) == 17
    assert store.queue_offset_at_time("T", 0, 1040, confirm) == 30
    assert store.record_at("T", 0, 17).store_timestamp_ms == 1017
    assert store.record_at("T", 0, 50) is None
    store.close()
    assert os.path.exists(tmp_path / "s" / "keys" / "T")
