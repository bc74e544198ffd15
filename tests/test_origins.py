"""Exactly-once at a replication target (broker_agent.origins + the store's send path).

Properties checked:
- the origin table's chain rule: an origin offset at or below the head is a duplicate,
  one above it is stored only when it names the head as the offset it follows
  (ORIGIN_AHEAD when its predecessor is missing, OUT_OF_ORDER when it follows an older
  copy), a higher origin is never judged a duplicate, and within a
  batch origins must go up and follow each other;
- the store: a resent batch of copies stores nothing and is answered with the
  originals' positions and message ids; a partly new batch stores only the new part;
  copies keep the source's message id; the table survives reopen (checkpoint), a lost
  checkpoint and an old checkpoint without origins (rebuilt from the log), a slave fed
  by append_replicated holds the same table (it fails over with the data), and a
  truncation rolls the head back to what the log still holds;
- concurrent sends of the same origin queue (threads) never store a copy twice.
"""

from __future__ import annotations

import json
import threading

import pytest
from mqmeta.broker_agent import MessageStore
from mqmeta.broker_agent.origins import Incoming, OriginHead, OriginTable

from mqmeta.errors import FailedPrecondition, InvalidArgument
from mqmeta.formats import origin as origin_format
from mqmeta.formats.checksummed import dump_checksummed, load_checksummed
from mqmeta.formats.origin import NO_PREVIOUS, Origin, OriginKey, origin_of
from mqmeta.formats.records import Message

pytestmark = pytest.mark.timeout(60)

KEY = OriginKey("a", "broker-a", "Orders", 1)


def _copy(offset: int, previous: int, queue_id: int = 0, body: bytes = b"") -> Message:
    origin = Origin(KEY, offset, previous, 1000 + offset)
    source_id = f"{offset:032x}"
    properties = origin_format.replicated_properties({"user": "p"}, origin, 1000 + offset, source_id)
    return Message("Orders", queue_id, body or b"m%d" % offset, tags="t", keys="k", properties=properties)


def _chain(offsets: list[int], previous: int) -> list[Message]:
    messages = []
    for offset in offsets:
        messages.append(_copy(offset, previous))
        previous = offset
    return messages


def _incoming(offsets: list[int], previous: int) -> list[Incoming]:
    return [Incoming(origin_of(m.properties), m.topic, m.queue_id) for m in _chain(offsets, previous)]


def test_the_chain_rule_of_the_origin_table():
    table = OriginTable()
    assert table.judge(_incoming([3, 5], NO_PREVIOUS)) == [False, False]
    with pytest.raises(FailedPrecondition) as raised:
        table.judge(_incoming([5, 6], 4))  # says it follows 4, the table holds nothing
    assert raised.value.code == "ORIGIN_AHEAD"  # its predecessor may still arrive
    table.note(origin_of(_copy(3, NO_PREVIOUS).properties), _head_at(3, 0))
    table.note(origin_of(_copy(5, 3).properties), _head_at(5, 1))
    with pytest.raises(FailedPrecondition) as raised:
        table.judge(_incoming([6], 3))  # follows 3, but 5 is held: a stale chain, it never fits
    assert raised.value.code == "OUT_OF_ORDER"
    with pytest.raises(InvalidArgument):
        table.judge([*_incoming([5], NO_PREVIOUS), *_incoming([4], 5)])  # goes down within a batch


def _head_at(origin_offset: int, queue_offset: int) -> OriginHead:
    return OriginHead(origin_offset, "Orders", 0, queue_offset, queue_offset * 100, 100)


@pytest.fixture
def store(tmp_path):
    opened = MessageStore(tmp_path / "store", broker_name="target", fsync=False)
    opened.begin_epoch(1)
    yield opened
    opened.close()


def _records(store: MessageStore) -> list:
    return store.get_messages("Orders", 0, 0, 1024, store.max_offset)


def test_a_resend_stores_nothing_and_answers_the_original_positions(store):
    first = store.put_messages(_chain([0, 2, 3], NO_PREVIOUS), 1, 10)
    assert [r.duplicate for r in first] == [False] * 3
    assert [r.msg_id for r in first] == [f"{o:032x}" for o in (0, 2, 3)]  # the source's ids kept
    again = store.put_messages(_chain([0, 2, 3], NO_PREVIOUS), 1, 11)
    assert [(r.queue_offset, r.commit_offset, r.msg_id, r.duplicate) for r in again] == [
        (r.queue_offset, r.commit_offset, r.msg_id, True) for r in first
    ]
    mixed = store.put_messages(_chain([2, 3, 7, 8], 0), 1, 12)
    assert [r.duplicate for r in mixed] == [True, True, False, False]
    assert [r.queue_offset for r in mixed] == [1, 2, 3, 4]
    assert [origin_of(r.properties).offset for r in _records(store)] == [0, 2, 3, 7, 8]
    with pytest.raises(FailedPrecondition, match="resend"):
        store.put_messages(_chain([10], 9), 1, 13)  # 9 was never stored: not a duplicate, not skipped
    assert store.origin_head(KEY).offset == 8
    higher = store.put_messages(_chain([10], 8), 1, 14)
    assert not higher[0].duplicate and store.origin_head(KEY).offset == 10


def test_one_origin_queue_goes_to_one_target_queue(store):
    store.put_messages(_chain([0], NO_PREVIOUS), 1, 10)
    with pytest.raises(FailedPrecondition, match="replicated into Orders/0"):
        store.put_messages([_copy(1, 0, queue_id=1)], 1, 11)


def test_the_table_survives_reopen_a_lost_checkpoint_and_an_old_checkpoint(tmp_path):
    directory = tmp_path / "store"
    store = MessageStore(directory, broker_name="target", fsync=False)
    store.begin_epoch(1)
    store.put_messages(_chain([0, 1, 4], NO_PREVIOUS), 1, 10)
    store.put_messages([Message("Orders", 0, b"plain")], 1, 11)
    expected = store.origin_head(KEY)
    store.close()
    reopened = MessageStore(directory, broker_name="target", fsync=False)
    assert reopened.origin_head(KEY) == expected
    reopened.close()
    checkpoint = directory / "index" / "checkpoint.json"
    body = load_checksummed(checkpoint)
    assert body["origins"]
    del body["origins"]  # written by a version that kept no origins
    checkpoint.write_bytes(dump_checksummed(body))
    rebuilt = MessageStore(directory, broker_name="target", fsync=False)
    assert rebuilt.origin_head(KEY) == expected
    assert [r.duplicate for r in rebuilt.put_messages(_chain([1, 4], 0), 1, 12)] == [True, True]
    rebuilt.close()
    checkpoint.unlink()
    assert MessageStore(directory, broker_name="target", fsync=False).origin_head(KEY) == expected


def test_a_slave_holds_the_same_table_and_truncation_rolls_it_back(store, tmp_path):
    store.put_messages(_chain([0, 1], NO_PREVIOUS), 1, 10)
    cut_at = store.max_offset
    store.put_messages(_chain([5, 6], 1), 1, 11)
    slave = MessageStore(tmp_path / "slave", broker_name="target", fsync=False)
    slave.append_replicated(0, store.read_bytes(0, 1 << 20))
    assert slave.origin_head(KEY) == store.origin_head(KEY) and slave.origin_head(KEY).offset == 6
    slave.truncate(cut_at)
    assert slave.origin_head(KEY).offset == 1
    slave.close()
    slave = MessageStore(tmp_path / "slave", broker_name="target", fsync=False)
    assert slave.origin_head(KEY).offset == 1  # and the checkpoint says so too
    slave.begin_epoch(2)
    assert [r.duplicate for r in slave.put_messages(_chain([5, 6], 1), 2, 12)] == [False, False]
    slave.close()


def test_concurrent_resends_of_one_origin_queue_store_each_copy_once(store):
    batches = [_chain(list(range(i, i + 10)), i - 1) for i in range(0, 200, 10)]
    errors: list[Exception] = []

    def send_all() -> None:
        for batch in batches:  # every thread sends the whole stream; some batches race
            for _ in range(200):
                try:
                    store.put_messages(batch, 1, 10)
                    break
                except FailedPrecondition as error:  # OUT_OF_ORDER: an earlier batch is not in yet
                    if error.code not in ("OUT_OF_ORDER", "ORIGIN_AHEAD"):
                        errors.append(error)
                        return

    threads = [threading.Thread(target=send_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert [origin_of(r.properties).offset for r in _records(store)] == list(range(200))


def test_malformed_origin_properties_are_refused(store):
    properties = dict(_copy(0, NO_PREVIOUS).properties)
    del properties[origin_format.QUEUE]
    with pytest.raises(InvalidArgument, match="__ORIGIN_QUEUE missing"):
        store.put_messages([Message("Orders", 0, b"x", properties=properties)], 1, 10)
    assert store.max_offset == 0 and json.dumps(store.origin_head(KEY)) == "null"


def test_a_source_consumer_offset_translates_to_the_target_queue_offset(store):
    """Mode full: "everything below O consumed" at the source becomes the target queue
    offset below which exactly the copies of origin offsets below O lie."""
    store.put_messages([Message("Orders", 0, b"direct")], 1, 9)  # target queue offset 0: not a copy
    store.put_messages(_chain([2, 3, 5, 9], NO_PREVIOUS), 1, 10)  # at target queue offsets 1..4
    other = OriginKey("a", "broker-a", "Orders", 7)
    assert store.translate_origin(other, 3) is None  # nothing of that origin: unknown
    # offsets 0, 1, 4, 6-8 were filtered out at the source (never sent)
    assert [store.translate_origin(KEY, o) for o in (0, 2, 3, 4, 5, 6, 9, 10, 50)] == [
        1,
        1,
        2,
        3,
        3,
        4,
        4,
        5,
        5,
    ]


def test_resent_copies_are_found_by_search_not_by_walking_the_queue(store, monkeypatch):
    """A worker resending what another already stored (two workers on one task) is answered
    with the originals after a few reads per copy: the walk back from the head, under the
    store's lock, stalled a master for seconds (no heartbeats, a needless failover)."""
    stream = _chain(list(range(3000)), NO_PREVIOUS)
    for i in range(0, 3000, 250):
        store.put_messages(stream[i : i + 250], 1, 10)
    reads = 0
    read_record_at = store.log.read_record_at

    def counted(*args):
        nonlocal reads
        reads += 1
        return read_record_at(*args)

    monkeypatch.setattr(store.log, "read_record_at", counted)
    again = store.put_messages(stream[:250], 1, 11)
    assert [r.queue_offset for r in again] == list(range(250)) and all(r.duplicate for r in again)
    assert reads <= 250 * 4, f"{reads} records read to answer 250 resent copies"


def test_the_search_finds_copies_among_gaps_and_other_origin_queues(store):
    """Copies of two origin queues interleaved in one target queue, with offsets filtered
    out at the source: every resend is answered with its own copy, every translation with
    the position a walk of the whole queue gives."""
    other = OriginKey("a", "broker-a", "Orders", 2)
    stored: dict[tuple[OriginKey, int], int] = {}
    previous = {KEY: NO_PREVIOUS, other: NO_PREVIOUS}
    for step in range(400):
        key = other if step % 3 == 0 else KEY
        offset = step * 2 + (step % 5 == 0)  # gaps of 1 or 2 in each origin queue
        origin = Origin(key, offset, previous[key], 1000 + offset)
        properties = origin_format.replicated_properties({}, origin, 1000 + offset, f"{step:032x}")
        (result,) = store.put_messages([Message("Orders", 0, b"m", properties=properties)], 1, 10)
        stored[(key, offset)] = result.queue_offset
        previous[key] = offset
    for (key, offset), queue_offset in stored.items():
        origin = Origin(key, offset, NO_PREVIOUS, 0)
        assert store._original_of(origin).queue_offset == queue_offset
    for key in (KEY, other):
        copies = sorted((o, q) for (k, o), q in stored.items() if k == key)
        for consumed in range(0, 2 * 400 + 3):
            below = [q for o, q in copies if o < consumed]
            expected = below[-1] + 1 if below else copies[0][1]
            assert store.translate_origin(key, consumed) == expected, (key, consumed)
