"""The broker's on-disk storage (broker_agent: records, epoch_file, commitlog, store).

Properties checked:
- records: every field round-trips through encode/decode; limits are refused with
  InvalidArgument; a short buffer is a TornRecord, a flipped byte CorruptData;
  message ids are 32 hex characters, deterministic in (broker, offset, epoch);
- epoch file: epochs strictly increase, an entry at the same start offset replaces the
  last one (an epoch that wrote nothing), truncate_from keeps entries starting before
  the offset, a corrupt file is refused; consistent_point: identical, empty, slave
  behind, slave ahead in an old epoch ("old master comes back"), divergent tails, no
  common epoch, start mismatch; and, over seeded random histories of elections
  (clean and unclean), writes and partial replication, the consistent point is exactly
  the longest common prefix of the two logs (the failure message names the seed);
- commit log: records never span segments (small segments) and reads work across
  them; read() returns whole checksummed records within max_bytes (at least one);
  a flipped byte is CorruptData at read (naming file and offset) and at reopen
  (middle of the last segment, or any non-last segment); a torn tail -- short bytes,
  a record's start followed by zeros, or a corrupt last record with nothing valid after
  it (the documented choice) -- is cut at reopen and appends continue after it; with
  fsync, appends go over zeros written ahead (the file grows by PREALLOCATE_BYTES at a
  time, not per append), which a reopen after kill -9 reads as the end quietly; a full
  segment is cut to its records before the next one exists, and close() cuts the last
  one; append_raw refuses a
  wrong offset, corrupt or partial data and writes nothing then; truncate and
  delete_segments_before survive reopen; a failed write leaves the log unchanged;
- store: put/get round trip with per-queue offsets; puts need the current epoch;
  get_messages stops at the confirm offset, max_count and max_bytes and verifies
  checksums; the index and consumer offsets survive reopen, a crash before any
  checkpoint, a deleted index directory or queue file; truncate (also interrupted
  by a crash) keeps the index, consumer offsets and epochs consistent; a slave fed by
  read_bytes -> append_replicated ends byte-identical with the same index, epochs and
  consumer offsets, and refuses records of an older epoch; an old master that comes
  back truncates to the consistent point and converges; concurrent puts get dense,
  unique queue offsets.
"""

from __future__ import annotations

import json
import os
import random
import struct
import threading
import zlib
from pathlib import Path

import pytest
from mqmeta.broker_agent import CONSUMER_OFFSET_TOPIC, CommitLog, MessageStore, commitlog

from mqmeta.errors import CorruptData, FailedPrecondition, FencedEpoch, InvalidArgument
from mqmeta.formats.epochs import EpochFile, consistent_point
from mqmeta.formats.records import (
    CRC_AT,
    PREFIX_BYTES,
    PROPERTIES_BYTES_MAX,
    RECORD_BODY_MAX,
    Message,
    TornRecord,
    decode_record,
    encode_record,
    is_msg_id_of,
    iter_records,
    legacy_msg_id,
    make_msg_id,
    scan_records,
    split_records,
)

pytestmark = pytest.mark.timeout(30)

SEGMENT = 4096


def msg(i: int, topic: str = "T", queue_id: int = 0, size: int = 200) -> Message:
    return Message(
        topic=topic,
        queue_id=queue_id,
        body=bytes([i % 251]) * size,
        tags=f"tag{i}",
        keys=f"k{i} k{i + 1}",
        properties={"n": str(i), "ü": "ß"},
        producer_id="p-1",
        producer_seq=i,
    )


def record(i: int, epoch: int = 1, size: int = 200, queue_offset: int | None = None) -> bytes:
    return encode_record(
        msg(i, size=size),
        epoch,
        1_000 + i,
        i if queue_offset is None else queue_offset,
        make_msg_id("b", i, epoch),
    )


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x20
    path.write_bytes(bytes(data))


def segment_files(directory: Path) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(directory.glob("*.log"))]


def new_store(path: Path, **kwargs) -> MessageStore:
    kwargs.setdefault("segment_bytes", SEGMENT)
    kwargs.setdefault("fsync", False)
    return MessageStore(path, **kwargs)


def queue_view(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, str, str]]]:
    view = {}
    for topic, queue_id in store.queues():
        start = store.queue_min_offset(topic, queue_id)
        records: list[tuple[int, int, str, str]] = []
        while True:
            batch = store.get_messages(topic, queue_id, start + len(records), 1024, store.max_offset)
            if not batch:
                break
            records += [(r.queue_offset, r.commit_offset, r.msg_id, r.body_digest) for r in batch]
        view[(topic, queue_id)] = records
    return view


# Records ---------------------------------------------------------------------------------------


def test_record_round_trips_every_field():
    message = Message(
        topic="Topic_1|%-x",
        queue_id=7,
        body=b"\x00body\xff" * 10,
        tags="TagA",
        keys="key1 key2",
        properties={"b": "2", "a": "1", "ключ": "значение"},
        producer_id="producer-9",
        producer_seq=2**40 + 3,
    )
    msg_id = make_msg_id("broker-a", 4096, epoch=3)
    data = encode_record(
        message, epoch=3, store_timestamp_ms=1_700_000_000_123, queue_offset=42, msg_id=msg_id
    )
    stored = decode_record(b"pad" + data, 3, commit_offset=4096)
    assert (stored.commit_offset, stored.size, stored.epoch, stored.store_timestamp_ms) == (
        4096,
        len(data),
        3,
        1_700_000_000_123,
    )
    assert (stored.topic, stored.queue_id, stored.queue_offset, stored.msg_id) == (
        "Topic_1|%-x",
        7,
        42,
        msg_id,
    )
    assert (stored.producer_id, stored.producer_seq, stored.tags, stored.keys) == (
        "producer-9",
        2**40 + 3,
        "TagA",
        "key1 key2",
    )
    assert dict(stored.properties) == {"a": "1", "b": "2", "ключ": "значение"}
    assert stored.body == message.body and stored.end_offset == 4096 + len(data)
    import hashlib

    assert stored.body_digest == hashlib.sha256(message.body).hexdigest()
    assert hash(message) == hash(Message(**{**message.__dict__}))  # hashable despite the dict
    both = list(iter_records(data + data, 100))
    assert [r.commit_offset for r in both] == [100, 100 + len(data)]


def test_record_bytes_are_those_of_format_version_1():
    """The record format does not change with the encoder: two records (every field set,
    and the smallest) are byte for byte what format version 1 wrote (logs and tiered
    objects written before stay readable, and replicas of mixed versions agree)."""
    full = Message(
        topic="Golden",
        queue_id=5,
        body=b"body\x00\xff",
        tags="t",
        keys="k1 k2",
        properties={"b": "2", "a": "ü"},
        producer_id="p",
        producer_seq=7,
    )
    data = encode_record(full, 3, 1_700_000_000_000, 42, legacy_msg_id("broker-a", 4096, 3))
    assert data.hex() == (
        "4d510181000000de50367203000000000000000068e5cf8b010000050000002a00000000000000070000000000"
        "00000600476f6c64656e2000376432633462326434646266653637396433666466636435646664346665626601"
        "007001007405006b31206b320f0002000100610200c3bc01006201003206000000626f647900ff"
    )
    smallest = encode_record(Message(topic="T", queue_id=0, body=b""), 1, 0, 0, legacy_msg_id("b", 0, 1))
    assert smallest.hex() == (
        "4d510162000000227215d901000000000000000000000000000000000000000000000000000000000000000000"
        "000001005420006532396630666635303463643764653932323131623061386339643536646637000000000000"
        "0200000000000000"
    )


def _resealed(data: bytes) -> bytes:
    """`data` with its CRC-32 recomputed: a layout error the checksum does not catch."""
    return data[:CRC_AT] + struct.pack("<I", zlib.crc32(data[PREFIX_BYTES:])) + data[PREFIX_BYTES:]


def test_scan_records_accepts_and_refuses_exactly_what_decode_record_does():
    """The slave's append checks replicated records with scan_records (no StoredRecord per
    record): over every byte of three records (with properties, without, non-ASCII text),
    changed and resealed with a valid CRC so that only the layout checks can catch it,
    scan_records raises CorruptData exactly when decode_record does, and otherwise
    reports the same fields; a plain flipped byte or a cut buffer is CorruptData."""
    plain = Message(topic="T", queue_id=3, body=b"x" * 40, producer_id="p", producer_seq=9)
    records = [record(1, size=30), encode_record(plain, 2, 5, 7, make_msg_id("b", 1, 2)), record(2, size=0)]
    blob = b"".join(records)
    heads = scan_records(blob, 1000)
    expected = split_records(blob, 1000)
    assert [tuple(h) for h in heads] == [
        (
            r.commit_offset,
            r.size,
            r.epoch,
            r.topic,
            r.queue_id,
            r.queue_offset,
            r.properties,
            r.keys,
            r.msg_id,
        )
        for r in expected
    ]
    checked = 0
    for index, original in enumerate(records):
        start = sum(len(r) for r in records[:index])
        for position in range(PREFIX_BYTES, len(original)):
            for change in (0x01, 0x80, 0xFF):
                damaged = bytearray(original)
                damaged[position] ^= change
                resealed = _resealed(bytes(damaged))
                buf = blob[:start] + resealed + blob[start + len(original) :]
                try:
                    want = decode_record(resealed, 0, 1000 + start)
                except CorruptData:
                    with pytest.raises(CorruptData):
                        scan_records(buf, 1000)
                    checked += 1
                    continue
                got = scan_records(buf, 1000)[index]
                assert (got.size, got.epoch, got.topic, got.queue_id, got.queue_offset, got.properties) == (
                    want.size,
                    want.epoch,
                    want.topic,
                    want.queue_id,
                    want.queue_offset,
                    want.properties,
                )
            flipped = bytearray(blob)
            flipped[start + position] ^= 0x20
            with pytest.raises(CorruptData):
                scan_records(bytes(flipped), 1000)
    assert checked > 100  # the layout checks were reached, not only the CRC
    with pytest.raises(CorruptData, match="record boundary"):
        scan_records(blob[:-3], 1000)
    assert scan_records(b"", 0) == []


def test_record_limits_are_refused():
    ok = make_msg_id("b", 0)
    bad = [
        Message("t" * 128, 0, b""),
        Message("bad/topic", 0, b""),
        Message("", 0, b""),
        Message("T", -1, b""),
        Message("T", 70_000, b""),
        Message("T", 0, b"x" * (RECORD_BODY_MAX + 1)),
        Message("T", 0, b"", properties={"k": "v" * PROPERTIES_BYTES_MAX}),
        Message("T", 0, b"", tags="t" * 2000),
        Message("T", 0, b"", producer_seq=-1),
    ]
    for message in bad:
        with pytest.raises(InvalidArgument):
            encode_record(message, 1, 0, 0, ok)
    with pytest.raises(InvalidArgument):
        encode_record(Message("T", 0, b""), 1, 0, 0, "not-an-id")
    assert len(encode_record(Message("T", 0, b"x" * RECORD_BODY_MAX), 1, 0, 0, ok)) > RECORD_BODY_MAX


def test_short_buffer_is_torn_and_flipped_byte_is_corrupt():
    data = record(1)
    for cut in (1, 5, 11, 30, len(data) - 1):
        with pytest.raises(TornRecord):
            decode_record(data[:cut], 0, 0)
    for position in (0, 2, 8, 12, 40, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        with pytest.raises(CorruptData):
            decode_record(bytes(damaged), 0, 0)
    with pytest.raises(CorruptData):
        decode_record(b"\x00" * 64, 0, 0)  # a zero-filled tail is not a record


def test_msg_ids_are_deterministic_hex():
    a = make_msg_id("broker-a", 100, 1)
    assert len(a) == 32 and int(a, 16) >= 0 and a == make_msg_id("broker-a", 100, 1)
    assert (
        len(
            {
                a,
                make_msg_id("broker-a", 101, 1),
                make_msg_id("broker-b", 100, 1),
                make_msg_id("broker-a", 100, 2),
            }
        )
        == 4
    )
    assert a.endswith(f"{100:016x}") and a[:16] == make_msg_id("broker-a", 7, 1)[:16]
    with pytest.raises(InvalidArgument):
        make_msg_id("broker-a", -1, 1)


def test_tiered_check_accepts_both_id_forms_and_nothing_else():
    """Records written before P11 carry a SHA-256 id of (broker, offset, epoch); both forms
    name their offset, and neither matches another offset, broker or epoch."""
    for form in (make_msg_id, legacy_msg_id):
        msg_id = form("broker-a", 4096, 3)
        assert is_msg_id_of(msg_id, "broker-a", 4096, 3)
        assert not is_msg_id_of(msg_id, "broker-a", 4097, 3)
        assert not is_msg_id_of(msg_id, "broker-b", 4096, 3)
        assert not is_msg_id_of(msg_id, "broker-a", 4096, 4)


# Epoch file -------------------------------------------------------------------------------------


def test_epoch_file_appends_replaces_truncates_and_persists(tmp_path):
    path = tmp_path / "epochs.json"
    epochs = EpochFile(path)
    assert epochs.entries == [] and epochs.last_epoch == 0
    epochs.append(1, 0)
    epochs.append(2, 100)
    epochs.append(3, 100)  # epoch 2 wrote nothing: replaced
    epochs.append(5, 250)
    assert epochs.entries == [(1, 0), (3, 100), (5, 250)]
    with pytest.raises(FailedPrecondition):
        epochs.append(5, 300)
    with pytest.raises(FailedPrecondition):
        epochs.append(6, 200)
    with pytest.raises(InvalidArgument):
        epochs.append(0, 300)
    assert epochs.end_offset_of(3, 400) == 250 and epochs.end_offset_of(5, 400) == 400
    assert epochs.end_offset_of(4, 400) is None
    assert [epochs.epoch_at(o) for o in (0, 99, 100, 249, 250, 10**9)] == [1, 1, 3, 3, 5, 5]
    assert EpochFile(path).entries == [(1, 0), (3, 100), (5, 250)]
    epochs.truncate_from(250)
    assert epochs.entries == [(1, 0), (3, 100)]
    epochs.truncate_from(101)
    assert EpochFile(path).entries == [(1, 0), (3, 100)]
    path.write_bytes(path.read_bytes().replace(b"100", b"101"))
    with pytest.raises(CorruptData):
        EpochFile(path)


@pytest.mark.parametrize(
    "slave, master, master_max, slave_max, expected",
    [
        ([], [], 0, 0, 0),  # empty
        ([], [(1, 0)], 500, 0, 0),
        ([(1, 0), (2, 100)], [(1, 0), (2, 100)], 300, 300, 300),  # identical
        ([(1, 0)], [(1, 0), (2, 100)], 300, 80, 80),  # slave behind
        ([(1, 0)], [(1, 0), (2, 100)], 300, 100, 100),  # slave at the end of the master's epoch
        ([(1, 0)], [(1, 0), (2, 150)], 300, 200, 150),  # old master comes back: ahead in epoch 1
        ([(1, 0), (2, 100)], [(1, 0), (3, 100)], 400, 180, 100),  # divergent tails at the same start
        ([(1, 0), (2, 100), (4, 200)], [(1, 0), (2, 100), (3, 150)], 500, 260, 150),  # divergent
        ([(1, 0), (3, 50)], [(2, 0)], 100, 90, 0),  # no common epoch
        ([(1, 0), (2, 60)], [(1, 0), (2, 50)], 100, 90, 50),  # same epoch, other start: older one
        ([(2, 60)], [(1, 0), (2, 50), (3, 80)], 100, 90, 0),
        ([(2, 40)], [(1, 0), (2, 40), (3, 70)], 100, 90, 70),
        ([(1, 0)], [(1, 0)], 10, 50, 10),  # slave ahead of the master within the same epoch
    ],
)
def test_consistent_point_cases(slave, master, master_max, slave_max, expected):
    assert consistent_point(slave, master, master_max, slave_max) == expected


class _Replica:
    """A log of (epoch, uid) records, one offset each, with an epoch list kept as the
    broker keeps it (EpochFile semantics, in memory)."""

    def __init__(self) -> None:
        self.log: list[tuple[int, int]] = []
        self.entries: list[tuple[int, int]] = []

    def add_entry(self, epoch: int, start: int) -> None:
        if self.entries and self.entries[-1][1] == start:
            self.entries.pop()
        self.entries.append((epoch, start))

    def truncate(self, offset: int) -> None:
        del self.log[offset:]
        self.entries = [e for e in self.entries if e[1] < offset]


def _common_prefix(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("seed", range(40))
def test_consistent_point_is_the_longest_common_prefix_in_random_histories(seed):
    rng = random.Random(seed)
    replicas = [_Replica() for _ in range(3)]
    uid = 0
    for epoch in range(1, 25):
        master = replicas[rng.randrange(3)]  # any replica: unclean elections included
        master.add_entry(epoch, len(master.log))
        for _ in range(rng.choice((0, 0, 1, 3, 8))):
            uid += 1
            master.log.append((epoch, uid))
        for slave in replicas:
            if slave is master or rng.random() < 0.3:
                continue
            point = consistent_point(slave.entries, master.entries, len(master.log), len(slave.log))
            assert point == _common_prefix(slave.log, master.log), (
                f"seed {seed} epoch {epoch}: slave {slave.entries} {slave.log} master "
                f"{master.entries} {master.log}"
            )
            slave.truncate(point)
            for offset in range(point, point + rng.randrange(len(master.log) - point + 1)):
                record_epoch = master.log[offset][0]
                if not slave.entries or record_epoch > slave.entries[-1][0]:
                    slave.add_entry(record_epoch, offset)
                slave.log.append(master.log[offset])


# Commit log ---------------------------------------------------------------------------------------


def test_segments_roll_and_reads_work_across_them(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    records = [record(i, size=150 + 37 * (i % 9)) for i in range(60)]
    offsets = log.append(records[:30]) + log.append(records[30:])
    assert offsets[0] == 0 and log.max_offset == sum(map(len, records))
    assert offsets == [sum(map(len, records[:i])) for i in range(60)]  # no gaps
    paths = log.segment_paths()
    assert len(paths) > 3
    for path in paths:  # every segment holds whole records only, within the size
        data = path.read_bytes()
        assert len(data) <= SEGMENT
        base = int(path.name[:20])
        assert sum(r.size for r in iter_records(data, base)) == len(data)
    for i in (0, 17, 59):
        assert log.read_record(offsets[i]).producer_seq == i
    big = log.append([record(99, size=6000)])  # larger than a segment: alone in its own
    assert log.read_record(big[0]).body == bytes([99]) * 6000
    log.close()
    reopened = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    assert reopened.max_offset == log.max_offset and reopened.read_record(offsets[45]).producer_seq == 45


def test_read_returns_whole_records_within_max_bytes(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=1 << 20, fsync=False)
    records = [record(i, size=300) for i in range(10)]
    offsets = log.append(records)
    size = len(records[0])
    assert log.read(0, size * 3 + size // 2) == b"".join(records[:3])
    assert log.read(offsets[2], 1) == records[2]  # at least one record, even past max_bytes
    assert log.read(offsets[9], 1 << 20) == records[9]
    assert log.read(log.max_offset, 100) == b""
    for bad_offset in (1, offsets[3] + 11, log.max_offset + 1):
        with pytest.raises(InvalidArgument):
            log.read(bad_offset, 1000)
    for bad_max in (0, (16 << 20) + 1):
        with pytest.raises(InvalidArgument):
            log.read(0, bad_max)
    small = CommitLog(tmp_path / "small", segment_bytes=SEGMENT, fsync=False)
    small_offsets = small.append(records)
    ends = [int(p.name[:20]) for p in small.segment_paths()[1:]] + [small.max_offset]
    assert len(ends) >= 2
    assert small.read(0, 1 << 20) == b"".join(records[: small_offsets.index(ends[0])])
    assert small.read(ends[0], 1 << 20) == b"".join(  # stops at the segment end
        r for r, o in zip(records, small_offsets, strict=True) if ends[0] <= o < ends[1]
    )


def test_flipped_byte_is_never_served_and_refused_at_reopen(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    offsets = log.append([record(i, size=300) for i in range(26)])
    last_path = log.segment_paths()[-1]
    victim = offsets[-3]  # in the last segment, with valid records after it
    assert victim > int(last_path.name[:20])
    flip(last_path, victim - int(last_path.name[:20]) + 60)
    with pytest.raises(CorruptData, match=rf"{last_path.name}.*offset {victim}.*never served"):
        log.read_record(victim)
    with pytest.raises(CorruptData, match="never served"):
        log.read(victim, 10_000)
    log.close()
    with pytest.raises(CorruptData, match=rf"{last_path.name}.*{victim}.*valid records follow"):
        CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)


def test_corrupt_last_record_of_a_non_last_segment_is_refused(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    log.append([record(i, size=300) for i in range(20)])
    first = log.segment_paths()[0]
    log.close()
    flip(first, first.stat().st_size - 5)
    with pytest.raises(CorruptData, match=rf"{first.name}.*not the last segment"):
        CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)


def test_the_scrub_finds_a_flipped_byte_anywhere_and_passes_a_good_log(tmp_path):
    """P16: the scrub walks every record against the disk's bytes, in bounded steps, and
    names the first bad record: in the first, a middle or the last segment."""
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    offsets = log.append([record(i, size=300) for i in range(26)])

    def scrub_all(step_bytes: int) -> tuple[int, int | None]:
        position, steps = 0, 0
        while position < log.max_offset:
            position, bad = log.scrub(position, step_bytes)
            steps += 1
            assert steps < 10_000
            if bad is not None:
                return position, bad
        return position, None

    assert scrub_all(1000) == (log.max_offset, None)
    assert scrub_all(10) == (log.max_offset, None), "a step smaller than a record reads it whole"
    for victim in (offsets[0], offsets[11], offsets[-3]):
        path = next(p for p in reversed(log.segment_paths()) if int(p.name[:20]) <= victim)
        flip(path, victim - int(path.name[:20]) + 60)
        assert scrub_all(1000)[1] == victim
        flip(path, victim - int(path.name[:20]) + 60)  # put it back
    log.close()


def test_a_corrupt_record_is_cut_at_open_when_the_replica_can_fetch_it_again(tmp_path):
    """P16: with cut_corruption a bad record below valid ones (not a torn tail) cuts the
    log there, later segments included, instead of refusing to start; a store then drops
    the epoch entries and index past the cut and takes appends from there."""
    store = new_store(tmp_path)
    store.begin_epoch(1)
    store.put_messages([msg(i, size=300) for i in range(26)], 1, 1)
    first = store.log.segment_paths()[0]
    offsets_before = store.max_offset
    store.close()
    flip(first, 60)  # the first record of the first segment
    with pytest.raises(CorruptData):
        new_store(tmp_path)
    cut = new_store(tmp_path, cut_corruption=True)
    assert cut.log.corruption_cut_at == 0 and cut.max_offset == 0 < offsets_before
    assert [p.name for p in cut.log.segment_paths()] == [first.name]
    cut.begin_epoch(2)
    cut.put_messages([msg(99)], 2, 2)
    assert cut.max_offset > 0
    cut.close()


@pytest.mark.parametrize("damage", ["short", "zeros_torn", "flipped_last_record"])
def test_torn_tail_is_cut_and_appends_continue(tmp_path, damage, caplog):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    offsets = log.append([record(i, size=300) for i in range(12)])
    last_path = log.segment_paths()[-1]
    base = int(last_path.name[:20])
    log.close()
    data = last_path.read_bytes()
    if damage == "short":  # the last append was interrupted
        last_path.write_bytes(data[:-7])
    elif damage == "zeros_torn":  # the last record's end never reached the disk
        last_path.write_bytes(data[: offsets[-1] - base + 40] + b"\x00" * 500)
    else:  # the documented choice: indistinguishable from a half-written last record
        flip(last_path, len(data) - 10)
    reopened = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    assert "torn tail" in caplog.text
    assert reopened.max_offset == offsets[-1]
    assert last_path.stat().st_size == offsets[-1] - base
    new = reopened.append([record(50, size=300)])
    assert new == [offsets[-1]]
    reopened.close()
    again = CommitLog(tmp_path, segment_bytes=SEGMENT)
    assert again.read_record(new[0]).producer_seq == 50
    assert again.read_record(offsets[-2]).producer_seq == 10


def test_append_raw_checks_offset_and_data_and_writes_nothing_when_refused(tmp_path):
    source = CommitLog(tmp_path / "src", segment_bytes=SEGMENT, fsync=False)
    source.append([record(i, size=250) for i in range(30)])
    target = CommitLog(tmp_path / "dst", segment_bytes=SEGMENT, fsync=False)
    chunk = source.read(0, 2000)
    with pytest.raises(FailedPrecondition, match="starts at 5 but this log ends at 0"):
        target.append_raw(5, chunk)
    damaged = bytearray(chunk)
    damaged[len(chunk) - 40] ^= 1
    with pytest.raises(CorruptData):
        target.append_raw(0, bytes(damaged))
    with pytest.raises(CorruptData, match="record boundary"):
        target.append_raw(0, chunk[:-3])
    assert target.max_offset == 0 and segment_files(tmp_path / "dst") == [("0" * 20 + ".log", b"")]
    offset = 0
    while offset < source.max_offset:
        offset = target.append_raw(offset, source.read(offset, 1500))
    assert segment_files(tmp_path / "dst") == segment_files(tmp_path / "src")


def test_truncate_and_retention_survive_reopen(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    offsets = log.append([record(i, size=300) for i in range(40)])
    bases = [int(p.name[:20]) for p in log.segment_paths()]
    with pytest.raises(InvalidArgument):
        log.truncate(offsets[20] + 1)
    log.truncate(offsets[25])  # mid-segment: later segments deleted
    assert log.max_offset == offsets[25]
    assert all(int(p.name[:20]) <= offsets[25] for p in log.segment_paths())
    at_base = next(b for b in bases if 0 < b < offsets[25])
    log.truncate(at_base)  # exactly at a segment start: that segment is kept, empty
    assert log.max_offset == at_base and log.segment_paths()[-1].stat().st_size == 0
    log.close()
    log = CommitLog(tmp_path, segment_bytes=SEGMENT)
    assert log.max_offset == at_base
    assert log.append([record(77, size=300)]) == [at_base]
    assert log.delete_segments_before(at_base) == bases.index(at_base)
    assert log.min_offset == at_base
    with pytest.raises(InvalidArgument):
        log.read_record(0)
    log.close()
    log = CommitLog(tmp_path, segment_bytes=SEGMENT)
    assert (log.min_offset, log.read_record(at_base).producer_seq) == (at_base, 77)


def test_record_starts_remembered_from_appends_are_forgotten_by_truncate(tmp_path):
    """is_boundary answers the latest appends' record starts from memory (a slave's fetch
    offset, without reading lengths): after a truncation the log grows with other records,
    and a start of the cut records is no record start any more."""
    log = CommitLog(tmp_path, segment_bytes=1 << 20, fsync=False)
    offsets = log.append([record(i, size=300) for i in range(8)])
    assert all(log.is_boundary(offset) for offset in offsets)
    assert not log.is_boundary(offsets[3] + 1)
    log.truncate(offsets[2])
    grown = log.append([record(9, size=450) for _ in range(4)])  # longer records from offsets[2]
    assert offsets[3] not in grown and grown[-1] > offsets[3]
    assert not log.is_boundary(offsets[3]), "a start of the truncated records is still trusted"
    assert all(log.is_boundary(offset) for offset in grown)
    with pytest.raises(InvalidArgument, match="not the start of a record"):
        log.read(offsets[3], 1 << 10)
    log.close()


def test_failed_write_leaves_the_log_unchanged(tmp_path, monkeypatch):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    log.append([record(i, size=300) for i in range(5)])
    before = (log.max_offset, segment_files(tmp_path))
    real_pwrite = os.pwrite
    calls = []

    def failing_pwrite(fd, data, position):
        calls.append(position)
        if len(calls) == 2:  # the second segment of a batch that rolls
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    with pytest.raises(OSError):
        log.append([record(i, size=300) for i in range(20)])
    monkeypatch.undo()
    assert len(calls) == 2
    assert (log.max_offset, segment_files(tmp_path)) == before
    assert log.append([record(9, size=300)]) == [before[0]]


def _counting_fdatasync(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    return calls


def test_appends_go_over_zeros_written_ahead_which_end_the_log_quietly_after_a_kill(tmp_path, caplog):
    log = CommitLog(tmp_path, segment_bytes=64 << 20, fsync=True)
    path = log.segment_paths()[0]
    first = log.append([record(0, size=300)])
    size = path.stat().st_size
    assert size == log.max_offset + commitlog.PREALLOCATE_BYTES
    offsets = first + log.append([record(i, size=300) for i in range(1, 40)])
    assert path.stat().st_size == size, "an append within the zeros written ahead does not grow the file"
    end = log.max_offset
    assert path.read_bytes()[end:].count(0) == size - end
    # kill -9: the log is not closed
    caplog.clear()
    with caplog.at_level("WARNING", logger=commitlog.__name__):
        reopened = CommitLog(tmp_path, segment_bytes=64 << 20, fsync=True)
    assert reopened.max_offset == end and not caplog.records
    assert path.stat().st_size == size
    assert reopened.append([record(99, size=300)]) == [end]
    assert [reopened.read_record(o).producer_seq for o in offsets[-2:]] == [38, 39]
    reopened.close()
    assert path.stat().st_size == reopened.max_offset, "close cuts the zeros written ahead"
    assert CommitLog(tmp_path, segment_bytes=64 << 20).read_record(end).producer_seq == 99


def test_a_full_segment_ends_where_its_records_do_before_the_next_exists(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    for i in range(30):  # one append at a time: each leaves zeros ahead in the last segment
        log.append([record(i, size=300)])
    paths = log.segment_paths()
    bases = [int(p.stem) for p in paths]
    assert len(paths) >= 3
    for path, base, next_base in zip(paths[:-1], bases, bases[1:], strict=False):
        assert path.stat().st_size == next_base - base, f"{path.name} holds only its records"
    assert paths[-1].stat().st_size > log.max_offset - bases[-1], "the last one has zeros ahead"


def test_a_log_written_with_fsync_and_reopened_without_still_cuts_a_full_segment(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    log.append([record(0, size=300)])  # zeros ahead, to the segment's size
    del log  # as after kill -9: not closed
    again = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    offsets = [o for i in range(1, 20) for o in again.append([record(i, size=300)])]
    assert len(again.segment_paths()) >= 2
    reopened = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=False)
    assert [reopened.read_record(o).producer_seq for o in offsets] == list(range(1, 20))


def _append_unsynced(log: CommitLog, records: list[bytes]) -> list[int]:
    return log.append_verified(b"".join(records), [len(r) for r in records], sync=False)


def test_group_commit_one_fdatasync_covers_every_append_before_it(tmp_path, monkeypatch):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    calls = _counting_fdatasync(monkeypatch)
    for i in range(3):
        _append_unsynced(log, [record(i, size=300)])
    assert calls == [] and log.durable_offset == 0 < log.max_offset, "written, not durable"
    first_end = log.max_offset
    assert log.sync() == first_end and len(calls) == 1 and log.durable_offset == first_end
    assert log.sync(first_end) == first_end and len(calls) == 1, "already durable: no second fdatasync"
    _append_unsynced(log, [record(3, size=300)])
    assert log.sync(first_end) == first_end and len(calls) == 1, "what the caller waits for is durable"
    assert log.sync() == log.max_offset and len(calls) == 2
    log.append([record(4, size=300)])  # a synced append makes everything before it durable too
    assert log.durable_offset == log.max_offset and len(calls) == 3


def test_group_commit_syncs_a_segment_before_the_next_one_exists(tmp_path, monkeypatch):
    """Only the last segment may hold unsynced bytes, as only it may end torn."""
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    calls = _counting_fdatasync(monkeypatch)
    _append_unsynced(log, [record(i, size=300) for i in range(20)])  # rolls at least once
    bases = [int(p.stem) for p in sorted(tmp_path.glob("*.log"))]
    assert len(bases) >= 2 and calls, "the rolled segments were synced"
    assert log.durable_offset == bases[-1] < log.max_offset


def test_group_commit_truncation_and_reopen(tmp_path):
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    offsets = _append_unsynced(log, [record(i, size=300) for i in range(3)])
    log.sync()
    _append_unsynced(log, [record(3, size=300)])
    log.truncate(offsets[1])
    assert log.durable_offset == offsets[1] == log.max_offset, "durable never past the end"
    _append_unsynced(log, [record(4, size=300)])
    end = log.max_offset
    log.close()  # as a kill -9 would leave it: written, never synced by this process
    reopened = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    assert reopened.max_offset == end == reopened.durable_offset, "opening syncs what it finds"


def test_a_failed_group_fdatasync_closes_the_log(tmp_path, monkeypatch):
    """A failed fdatasync may have dropped the dirty pages (a retry could then succeed
    for bytes that are gone), so the log refuses everything after it. The failure is
    injected: a real EIO cannot be produced on this machine."""
    log = CommitLog(tmp_path, segment_bytes=SEGMENT, fsync=True)
    _append_unsynced(log, [record(0, size=300)])

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        log.sync()
    monkeypatch.undo()
    assert log.durable_offset == 0
    with pytest.raises(FailedPrecondition, match="closed"):
        log.append([record(1, size=300)])
    with pytest.raises(FailedPrecondition, match="closed"):
        log.sync()


def test_a_group_commit_store_syncs_before_its_checkpoint_and_epoch(tmp_path):
    store = new_store(tmp_path, fsync=True, group_commit=True, index_checkpoint_bytes=1 << 30)
    store.begin_epoch(1)
    store.put_messages([msg(i) for i in range(3)], 1, 1)
    assert store.durable_offset < store.max_offset
    store.checkpoint()
    assert store.durable_offset == store.max_offset, "a checkpoint never names unsynced bytes"
    store.put_messages([msg(3)], 1, 1)
    store.begin_epoch(2)
    assert store.durable_offset == store.max_offset == store.epochs.entries[-1][1]
    store.close()


# Store -------------------------------------------------------------------------------------------------


def test_put_and_get_round_trip_with_queue_offsets(tmp_path):
    store = new_store(tmp_path)
    with pytest.raises(FailedPrecondition, match="begin_epoch"):
        store.put_messages([msg(0)], 1, 0)
    store.begin_epoch(1)
    results = store.put_messages([msg(i, queue_id=i % 2) for i in range(6)], 1, 5_000)
    assert [(r.queue_id, r.queue_offset) for r in results] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert len({r.msg_id for r in results}) == 6
    records = store.get_messages("T", 1, 0, 10, store.max_offset)
    assert [(r.queue_offset, r.commit_offset, r.msg_id) for r in records] == [
        (r.queue_offset, r.commit_offset, r.msg_id) for r in results if r.queue_id == 1
    ]
    assert records[0].body == msg(1).body and records[0].store_timestamp_ms == 5_000
    assert records[0].epoch == 1 and dict(records[0].properties) == {"n": "1", "ü": "ß"}
    assert store.queue_max_offset("T", 0) == 3 and store.queue_min_offset("T", 0) == 0
    assert store.queue_max_offset("nope", 0) == 0 and store.get_messages("nope", 0, 0, 5, 10**9) == []
    store.begin_epoch(2)
    with pytest.raises(FencedEpoch):
        store.put_messages([msg(0)], 1, 0)
    with pytest.raises(InvalidArgument):
        store.put_messages([Message(CONSUMER_OFFSET_TOPIC, 0, b"{}")], 2, 0)
    with pytest.raises(InvalidArgument):
        store.get_messages("T", 0, 0, 1025, store.max_offset)
    assert store.put_messages([msg(9)], 2, 6_000)[0].queue_offset == 3
    assert store.epochs.entries == [
        (1, 0),
        (2, results[-1].commit_offset + len(store.read_bytes(results[-1].commit_offset, 1))),
    ]
    store.close()


def test_get_messages_stops_at_the_confirm_offset_and_bounds(tmp_path):
    store = new_store(tmp_path)
    store.begin_epoch(1)
    results = store.put_messages([msg(i, size=1000) for i in range(10)], 1, 0)
    ends = [r.commit_offset for r in results[1:]] + [store.max_offset]
    confirm = ends[3]  # exactly the end of queue offset 3
    assert [r.queue_offset for r in store.get_messages("T", 0, 0, 100, confirm)] == [0, 1, 2, 3]
    assert [r.queue_offset for r in store.get_messages("T", 0, 0, 100, confirm - 1)] == [0, 1, 2]
    assert store.readable_queue_max_offset("T", 0, confirm) == 4
    assert store.readable_queue_max_offset("T", 0, store.max_offset) == 10
    assert store.get_messages("T", 0, 4, 100, confirm) == []
    assert len(store.get_messages("T", 0, 0, 3, store.max_offset)) == 3
    assert len(store.get_messages("T", 0, 0, 100, store.max_offset, max_bytes=2500)) == 2
    assert len(store.get_messages("T", 0, 0, 100, store.max_offset, max_bytes=1)) == 1
    store.close()


def test_flipped_byte_is_caught_by_get_messages(tmp_path):
    store = new_store(tmp_path)
    store.begin_epoch(1)
    results = store.put_messages([msg(i, size=500) for i in range(6)], 1, 0)
    path = store.log.segment_paths()[0]
    flip(path, results[2].commit_offset + 100)
    assert len(store.get_messages("T", 0, 0, 2, store.max_offset)) == 2
    with pytest.raises(CorruptData, match=f"{path.name}.*{results[2].commit_offset}"):
        store.get_messages("T", 0, 0, 10, store.max_offset)
    store.close()
    with pytest.raises(CorruptData):
        new_store(tmp_path)


def fill(store: MessageStore, epoch: int, count: int, start: int = 0) -> None:
    for i in range(start, start + count, 7):
        store.put_messages(
            [
                msg(j, topic=f"T{j % 3}", queue_id=j % 4, size=100 + j % 50)
                for j in range(i, min(i + 7, start + count))
            ],
            epoch,
            1000 + i,
        )
        store.commit_consumer_offset("g1", "T0", 0, i, epoch, 2000 + i)


def test_index_and_consumer_offsets_survive_reopen_and_crash(tmp_path):
    store = new_store(tmp_path / "a", index_checkpoint_bytes=3000)
    store.begin_epoch(1)
    fill(store, 1, 120)
    store.commit_consumer_offset("g2", "T1", 3, 77, 1, 0)
    view, end = queue_view(store), store.max_offset
    store.close()
    store = new_store(tmp_path / "a")  # clean reopen: from the checkpoint
    assert queue_view(store) == view and store.max_offset == end
    assert store.consumer_offset("g1", "T0", 0) == 119 and store.consumer_offset("g2", "T1", 3) == 77
    assert store.consumer_offset("g9", "T0", 0) is None
    store.put_messages([msg(500, topic="T0")], 1, 0)  # no close(): as after kill -9
    view = queue_view(store)
    again = new_store(tmp_path / "a")
    assert queue_view(again) == view and again.queue_max_offset("T0", 0) == view[("T0", 0)][-1][0] + 1
    again.close()


@pytest.mark.parametrize("loss", ["index_dir", "one_queue_file", "checkpoint_corrupt"])
def test_index_is_rebuilt_from_the_commit_log(tmp_path, loss):
    store = new_store(tmp_path)
    store.begin_epoch(1)
    fill(store, 1, 80)
    view = queue_view(store)
    store.close()
    index = tmp_path / "index"
    if loss == "index_dir":
        import shutil

        shutil.rmtree(index)
    elif loss == "one_queue_file":
        (index / "T1" / "1").unlink()
    else:
        flip(index / "checkpoint.json", 30)
    store = new_store(tmp_path)
    assert queue_view(store) == view and store.consumer_offset("g1", "T0", 0) == 77
    store.close()


def test_truncate_keeps_index_consumer_offsets_and_epochs_consistent(tmp_path):
    store = new_store(tmp_path, index_checkpoint_bytes=2000)
    store.begin_epoch(1)
    fill(store, 1, 40)
    cut = store.max_offset
    view = queue_view(store)
    store.begin_epoch(2)
    fill(store, 2, 40, start=40)
    store.begin_epoch(3)
    fill(store, 3, 5, start=80)
    assert store.consumer_offset("g1", "T0", 0) == 80
    store.truncate(cut)
    assert store.max_offset == cut and store.epochs.entries == [(1, 0)]
    assert queue_view(store) == view and store.consumer_offset("g1", "T0", 0) == 35
    assert store.queue_max_offset("T0", 0) == view[("T0", 0)][-1][0] + 1
    store.close()
    store = new_store(tmp_path)
    assert store.max_offset == cut and store.epochs.entries == [(1, 0)]
    assert queue_view(store) == view and store.consumer_offset("g1", "T0", 0) == 35
    with pytest.raises(InvalidArgument):
        store.truncate(cut - 1)
    store.begin_epoch(4)
    result = store.put_messages([msg(1, topic="T0")], 4, 0)[0]
    assert result.commit_offset == cut and result.queue_offset == view[("T0", 0)][-1][0] + 1
    store.close()


@pytest.mark.parametrize("crash_point", ["before_commit_log", "before_index"])
def test_truncate_interrupted_by_a_crash_is_finished_at_open(tmp_path, monkeypatch, crash_point):
    store = new_store(tmp_path, index_checkpoint_bytes=2000)
    store.begin_epoch(1)
    fill(store, 1, 30)
    cut = store.max_offset
    view = queue_view(store)
    store.begin_epoch(2)
    fill(store, 2, 30, start=30)

    def crash(*args):
        raise KeyboardInterrupt(f"crash {crash_point}")

    if crash_point == "before_commit_log":
        monkeypatch.setattr(store.log, "truncate", crash)
    else:
        monkeypatch.setattr(store, "_write_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        store.truncate(cut)
    monkeypatch.undo()
    assert store.epochs.entries == [(1, 0)]  # half done
    assert (store.log.max_offset > cut) == (crash_point == "before_commit_log")
    store.log.close()
    store = new_store(tmp_path)
    assert store.max_offset == cut and store.epochs.entries == [(1, 0)]
    assert queue_view(store) == view and store.consumer_offset("g1", "T0", 0) == 28
    assert all(store.queue_max_offset(*key) == len(records) for key, records in view.items())
    assert not (tmp_path / "truncate.json").exists()
    store.close()


def test_epoch_entries_must_cover_the_log(tmp_path):
    store = new_store(tmp_path)
    store.begin_epoch(1)
    fill(store, 1, 10)
    end = store.max_offset
    store.close()
    EpochFile(tmp_path / "epochs.json").append(2, end + 500)  # as a crash before the records
    store = new_store(tmp_path)
    assert store.epochs.entries == [(1, 0)]
    store.close()
    (tmp_path / "epochs.json").unlink()
    with pytest.raises(CorruptData, match="epoch file"):
        new_store(tmp_path)


def replicate(master: MessageStore, slave: MessageStore, chunk: int) -> None:
    offset = slave.max_offset
    while offset < master.max_offset:  # unchecked, as the master serves a fetch
        offset = slave.append_replicated(offset, master.read_bytes(offset, chunk, check=False))


def test_a_record_corrupt_on_the_masters_disk_is_refused_by_the_slave(tmp_path):
    """The master serves fetches without checking CRCs (read_bytes(check=False)); a byte
    flipped on its disk is then refused by the slave's append (CorruptData), which
    writes nothing, while a checked read still refuses to serve it."""
    master = new_store(tmp_path / "m", broker_name="a", segment_bytes=1 << 20)
    slave = new_store(tmp_path / "s", broker_name="a", segment_bytes=1 << 20)
    master.begin_epoch(1)
    fill(master, 1, 20)
    replicate(master, slave, 1 << 20)
    before = segment_files(tmp_path / "s" / "commitlog")
    offset = slave.max_offset
    fill(master, 1, 10, start=20)
    (segment,) = (tmp_path / "m" / "commitlog").glob("*.log")
    flip(segment, offset + (master.max_offset - offset) // 2)
    data = master.read_bytes(offset, 1 << 20, check=False)
    assert len(data) == master.max_offset - offset
    with pytest.raises(CorruptData):
        slave.append_replicated(offset, data)
    with pytest.raises(CorruptData, match="never served"):
        master.read_bytes(offset, 1 << 20)
    assert slave.max_offset == offset and segment_files(tmp_path / "s" / "commitlog") == before
    master.close()
    slave.close()


def test_slave_fed_by_read_bytes_ends_byte_identical(tmp_path):
    master = new_store(tmp_path / "m", broker_name="a")
    slave = new_store(tmp_path / "s", broker_name="a", index_checkpoint_bytes=5000)
    master.begin_epoch(1)
    fill(master, 1, 60)
    replicate(master, slave, 1)  # one record at a time
    master.begin_epoch(3)
    fill(master, 3, 60, start=60)
    replicate(master, slave, 3000)
    assert segment_files(tmp_path / "s" / "commitlog") == segment_files(tmp_path / "m" / "commitlog")
    assert len(segment_files(tmp_path / "m" / "commitlog")) > 5
    assert slave.epochs.entries == master.epochs.entries
    assert queue_view(slave) == queue_view(master)
    assert slave.consumer_offset("g1", "T0", 0) == master.consumer_offset("g1", "T0", 0) == 116
    slave.close()
    slave = new_store(tmp_path / "s")
    assert queue_view(slave) == queue_view(master) and slave.epochs.entries == master.epochs.entries
    with pytest.raises(FailedPrecondition, match="ends at"):
        slave.append_replicated(0, master.read_bytes(0, 1000))
    master.begin_epoch(4)
    fill(master, 4, 7, start=200)
    data = bytearray(master.read_bytes(slave.max_offset, 100_000))
    data[-20] ^= 4
    with pytest.raises(CorruptData):
        slave.append_replicated(slave.max_offset, bytes(data))
    assert slave.epochs.last_epoch == 3  # nothing was written
    master.close()
    slave.close()


def test_slave_refuses_records_of_an_older_epoch(tmp_path):
    master = new_store(tmp_path / "m")
    slave = new_store(tmp_path / "s")
    master.begin_epoch(1)
    fill(master, 1, 10)
    slave.begin_epoch(5)  # as a stale entry: the slave must truncate first
    with pytest.raises(FailedPrecondition, match="truncate to the consistent point"):
        replicate(master, slave, 10_000)
    slave.truncate(0)
    replicate(master, slave, 10_000)
    assert slave.epochs.entries == [(1, 0)]


def test_old_master_comes_back_and_converges(tmp_path):
    a, b = new_store(tmp_path / "a"), new_store(tmp_path / "b")
    a.begin_epoch(1)
    fill(a, 1, 30)
    replicate(a, b, 1500)
    fill(a, 1, 20, start=30)  # never reached b: a dies
    b.begin_epoch(2)  # b is elected
    fill(b, 2, 25, start=100)
    point = consistent_point(a.epochs.entries, b.epochs.entries, b.max_offset, a.max_offset)
    assert point == b.epochs.entries[1][1] < a.max_offset
    a.truncate(point)
    replicate(b, a, 2000)
    assert segment_files(tmp_path / "a" / "commitlog") == segment_files(tmp_path / "b" / "commitlog")
    assert a.epochs.entries == b.epochs.entries == [(1, 0), (2, point)]
    assert queue_view(a) == queue_view(b)
    assert a.consumer_offset("g1", "T0", 0) == b.consumer_offset("g1", "T0", 0) == 121


def test_concurrent_puts_get_dense_unique_queue_offsets(tmp_path):
    store = new_store(tmp_path, segment_bytes=1 << 20)
    store.begin_epoch(1)
    results = []

    def worker(n: int) -> None:
        for i in range(20):
            results.extend(store.put_messages([msg(n * 100 + i, queue_id=n % 2)] * 3, 1, 0))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for queue_id in (0, 1):
        offsets = sorted(r.queue_offset for r in results if r.queue_id == queue_id)
        assert offsets == list(range(180))
    assert len({r.commit_offset for r in results}) == 360
    view = queue_view(store)
    store.close()
    assert queue_view(new_store(tmp_path, segment_bytes=1 << 20)) == view


def test_consumer_offset_records_are_canonical_json(tmp_path):
    store = new_store(tmp_path)
    store.begin_epoch(1)
    result = store.commit_consumer_offset("grp", "T", 2, 41, 1, 0)
    (stored,) = store.get_messages(CONSUMER_OFFSET_TOPIC, 0, 0, 1, store.max_offset)
    assert stored.commit_offset == result.commit_offset
    assert stored.body == b'{"group":"grp","offset":41,"queue_id":2,"topic":"T"}'
    assert json.loads(stored.body)["offset"] == 41
    for bad in (("", "T", 0, 1), ("g", "T/x", 0, 1), ("g", "T", -1, 1), ("g", "T", 0, -1)):
        with pytest.raises(InvalidArgument):
            store.commit_consumer_offset(*bad, 1, 0)


@pytest.mark.parametrize("seed", range(12))
def test_random_puts_commits_truncations_and_reopens_match_a_model(tmp_path, seed):
    """Seeded: after every step the store's queues and consumer offsets equal a replay of
    a plain list of what was written and not truncated."""
    rng = random.Random(seed)
    store = new_store(tmp_path, index_checkpoint_bytes=rng.choice((1500, 5000, 1 << 20)))
    epoch = 1
    store.begin_epoch(epoch)
    model: list[tuple[int, str, int, int]] = []  # commit offset, kind/topic, queue or group, value
    for step in range(60):
        action = rng.random()
        if action < 0.45:
            batch = [
                msg(
                    rng.randrange(1000),
                    topic=f"T{rng.randrange(2)}",
                    queue_id=rng.randrange(3),
                    size=rng.randrange(10, 600),
                )
                for _ in range(rng.randrange(1, 6))
            ]
            for result in store.put_messages(batch, epoch, step):
                model.append((result.commit_offset, result.topic, result.queue_id, result.queue_offset))
        elif action < 0.7:
            group = rng.randrange(3)
            value = rng.randrange(10**6)
            result = store.commit_consumer_offset(f"g{group}", "T0", 0, value, epoch, step)
            model.append((result.commit_offset, "offset", group, value))
        elif action < 0.85 and model:
            cut = rng.choice(model)[0]
            store.truncate(cut)
            model = [m for m in model if m[0] < cut]
            epoch += 1
            store.begin_epoch(epoch)
        else:
            if rng.random() < 0.5:
                store.close()
            else:
                store.log.close()  # as after kill -9: no final checkpoint
            store = new_store(tmp_path)
        expected_offsets: dict[int, int] = {}
        expected_queues: dict[tuple[str, int], int] = {}
        for _, kind, number, value in model:
            if kind == "offset":
                expected_offsets[number] = value
            else:
                expected_queues[(kind, number)] = value + 1
        for group in range(3):
            assert store.consumer_offset(f"g{group}", "T0", 0) == expected_offsets.get(group), (
                f"seed {seed} step {step}"
            )
        for topic in ("T0", "T1"):
            for queue_id in range(3):
                assert store.queue_max_offset(topic, queue_id) == expected_queues.get((topic, queue_id), 0), (
                    f"seed {seed} step {step}"
                )
    view = queue_view(store)
    assert sum(len(v) for k, v in view.items() if k[0] != CONSUMER_OFFSET_TOPIC) == sum(
        1 for m in model if m[1] != "offset"
    ), f"seed {seed}"
    store.close()


@pytest.mark.parametrize("deferred", [False, True], ids=["synced", "deferred"])
def test_a_replicated_append_is_durable_once_synced_and_its_failed_fdatasync_fences(
    tmp_path, monkeypatch, deferred
):
    """A slave's append writes, indexes, then fdatasyncs last: durable on return; with
    sync=False (the fetch loop's, which builds its next fetch first) not until
    sync_replicated returns, which says how far the log is durable. A failed fdatasync
    closes the log and is an I/O error even when the kernel says ENOSPC: a full disk's
    refusal (which lets the broker go on) would claim the write undone, and it is not.
    The failure is injected."""
    master = new_store(tmp_path / "m")
    master.begin_epoch(1)
    fill(master, 1, 3)
    slave = new_store(tmp_path / "s", fsync=True)
    end = slave.append_replicated(0, master.read_bytes(0, 1 << 20), sync=not deferred)
    if deferred:
        assert slave.durable_offset == 0 < end, "synced before the caller asked"
        assert slave.sync_replicated() == slave.durable_offset == end
    assert slave.durable_offset == end == master.max_offset
    fill(master, 1, 2, start=3)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full)
    with pytest.raises(OSError) as raised:
        slave.append_replicated(end, master.read_bytes(end, 1 << 20), sync=not deferred)
        slave.sync_replicated()
    monkeypatch.undo()
    assert raised.value.errno == 5, "a failed fdatasync must fence the broker, not refuse as a full disk"
    assert slave.log_closed and slave.durable_offset == end
    master.close()


def test_a_checkpoints_failed_fdatasync_fences_rather_than_skips_the_checkpoint(tmp_path, monkeypatch):
    """A checkpoint syncs the log first; when that fdatasync fails (ENOSPC included) the
    log is closed and the write is an I/O error (the broker fences itself), not a skipped
    checkpoint with a closed log behind it. The failure is injected."""
    store = new_store(tmp_path, fsync=True, group_commit=True, index_checkpoint_bytes=1)
    store.begin_epoch(1)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full)
    with pytest.raises(OSError) as raised:
        store.put_messages([msg(0)], 1, 1)
    monkeypatch.undo()
    assert raised.value.errno == 5 and store.log_closed
