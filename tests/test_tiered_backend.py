"""Tiered storage: the object backends (tiered_backend), the object layout (formats.tiered, tiered_objects).

Properties checked:
- every backend (LocalBackend in a temporary directory; FsspecBackend on memory://,
  with a unique root per test, in both its rename and its direct-put mode, and on
  file://) round-trips put/get/size/exists, reads ranges with pread semantics (short
  at the end, InvalidArgument past it), lists sorted keys under a string prefix,
  deletes idempotently, and reports a missing key as NotFound;
- objects are immutable: the same bytes again is a no-op, different bytes (same or
  other length) FailedPrecondition, and the first object stays; two local writers
  racing for one key: exactly one wins, the loser is refused (no silent replacement);
- a put is atomic: when the write fails half-way (a simulated crash), nothing is at
  the key, the failure is Unavailable (no OSError or fsspec error leaks), no temporary
  is left behind, and a temporary a real crash left is never listed;
- keys are validated (empty, absolute, empty/'.'/'..' segments, bad characters, too
  long, the temporary mark) with InvalidArgument; limits on object size and listing
  length raise; open_backend picks LocalBackend for paths and file://, FsspecBackend
  for memory://, and refuses unknown schemes and chained URLs with a clear sentence;
- layout: a segment built from a real MessageStore's bytes is those bytes (T2),
  verifies, and matches the store's epoch lineage; a flipped byte or a truncated
  object fails verification with CorruptData; build_segment refuses a torn tail, a
  start off a record boundary and an empty range; read_range over two segments
  returns exactly the store's bytes, whatever max_bytes (including smaller than one
  record), and refuses offsets outside the segments or off a record start; the
  per-queue index objects match the store's index and detect corruption; the epoch
  lineage round-trips and detects corruption; gaps and overlaps (also duplicates and
  nesting) are each reported; SegmentMeta round-trips through to_dict/from_dict;
- the uploader's fast path (prepare_upload + write_upload over store.open_bulk, a
  FileRange the kernel copies, and over bytes from read_bulk(check=False)) makes exactly
  the objects and meta of the decoding twins (build_segment, build_index_segments), for
  every range cut and every backend; a flipped byte in the log file or in the bytes read
  raises CorruptData from write_upload (never a meta to commit) and nothing is published
  at the segment's key, as does a record count that disagrees with the index;
  check_whole_records agrees with split_records and names a torn tail; read_bulk serves up
  to 64 MiB and checks CRCs unless told not to (a flipped byte on disk is CorruptData from
  read and read_bulk); verify_stored is size-only on a fsyncing LocalBackend and
  re-checksums on fsspec (a replaced object fails);
- put_checked (every backend) runs its check over exactly the bytes it stores (a check
  that follows the copy sees every byte once the copy is done), publishes nothing and
  leaves no temporary when the check raises or the source is short, and keeps
  immutability; a source larger than one copy step (several steps followed) is checked
  whole;
- checksums (P11): new segments carry crc32c:<8 hex digits>, equal to google_crc32c's
  value whatever buffer it is taken over (bytes, memoryview, bytearray, a memory map);
  segments uploaded before with SHA-256 still verify (verify_segment, verify_stored,
  checksum_matches), and a flipped byte fails either format.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
import zlib
from collections.abc import Iterator

import fsspec
import google_crc32c
import mqmeta.broker_agent.tiered_backend as tiered_backend
import pytest
from mqmeta.broker_agent import MessageStore
from mqmeta.broker_agent.commitlog import COPY_CHUNK_BYTES
from mqmeta.broker_agent.tiered_backend import (
    TEMP_MARK,
    FsspecBackend,
    LocalBackend,
    TieredBackend,
    open_backend,
)
from mqmeta.broker_agent.tiered_objects import read_range, verify_segment, verify_stored

from mqmeta.errors import CorruptData, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from mqmeta.formats.records import Message, split_records
from mqmeta.formats.tiered import (
    SegmentMeta,
    build_epoch_lineage,
    build_index_segments,
    build_segment,
    epochs_key,
    find_gaps_and_overlaps,
    index_key,
    parse_epoch_lineage,
    parse_index_segment,
    parse_segment_key,
    segment_key,
    upload_marker_key,
)

pytestmark = pytest.mark.timeout(30)

CLUSTER, BROKER = "c1", "broker-a"


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://tiered-{uuid.uuid4().hex}"
    yield url
    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture(params=["local", "memory", "memory-direct", "fsspec-file"])
def backend(request, tmp_path, memory_url) -> TieredBackend:
    if request.param == "local":
        return LocalBackend(tmp_path / "objects")
    if request.param == "fsspec-file":
        return FsspecBackend(f"file://{tmp_path / 'objects'}")
    made = FsspecBackend(memory_url)
    made.direct_put = request.param == "memory-direct"  # the object-store path
    return made


# Backends ----------------------------------------------------------------------------------------


def test_put_get_size_exists_delete(backend):
    assert not backend.exists("a/b/x.seg")
    backend.put("a/b/x.seg", b"hello world")
    assert backend.exists("a/b/x.seg") and not backend.exists("a/b")
    assert backend.get("a/b/x.seg") == b"hello world"
    assert backend.size("a/b/x.seg") == 11
    backend.put("empty", b"")
    assert backend.get("empty") == b"" and backend.size("empty") == 0
    backend.delete("a/b/x.seg")
    backend.delete("a/b/x.seg")  # idempotent
    assert not backend.exists("a/b/x.seg")
    for call in (backend.get, backend.size):
        with pytest.raises(NotFound):
            call("a/b/x.seg")
    with pytest.raises(NotFound):
        backend.get_range("a/b/x.seg", 0, 1)


def test_objects_are_immutable(backend):
    backend.put("k/obj", b"first")
    backend.put("k/obj", b"first")  # same bytes: a retried upload is a no-op
    for other in (b"other", b"longer bytes", b""):
        with pytest.raises(FailedPrecondition, match="immutable"):
            backend.put("k/obj", other)
    assert backend.get("k/obj") == b"first"
    assert backend.list("k/") == ["k/obj"]


def test_get_range_has_pread_semantics(backend):
    data = bytes(range(256)) * 4
    backend.put("r", data)
    assert backend.get_range("r", 0, 10) == data[:10]
    assert backend.get_range("r", 1000, 100) == data[1000:]  # short at the end
    assert backend.get_range("r", 1024, 5) == b""
    assert backend.get_range("r", 5, 0) == b""
    with pytest.raises(InvalidArgument):
        backend.get_range("r", 1025, 1)
    for start, length in ((-1, 1), (0, -1), (True, 1), (0, 2 << 30)):
        with pytest.raises(InvalidArgument):
            backend.get_range("r", start, length)


def test_list_by_prefix_sorted(backend):
    keys = [
        "c/b/commitlog/00000000000000000100-00000000000000000200.seg",
        "c/b/commitlog/00000000000000000000-00000000000000000100.seg",
        "c/b/epochs/00000000000000000200.json",
        "c/b2/commitlog/x",
        "top",
    ]
    for key in keys:
        backend.put(key, key.encode())
    assert backend.list("") == sorted(keys)
    assert backend.list("c/b/commitlog/") == sorted(keys[:2])
    assert backend.list("c/b") == sorted(keys[:4])  # a plain string prefix, not a directory
    assert backend.list("c/b/") == sorted(keys[:3])
    assert backend.list("c/b/epochs/000") == [keys[2]]
    assert backend.list("nothing/here/") == [] and backend.list("top/") == []


def test_list_and_object_limits(backend, monkeypatch):
    for i in range(4):
        backend.put(f"p/{i}", b"x")
    monkeypatch.setattr(tiered_backend, "LIST_KEYS_MAX", 3)
    with pytest.raises(FailedPrecondition, match="narrower prefix"):
        backend.list("p/")
    monkeypatch.setattr(tiered_backend, "OBJECT_BYTES_MAX", 8)
    backend.put("small", b"12345678")
    with pytest.raises(InvalidArgument, match="limit"):
        backend.put("big", b"123456789")
    assert not backend.exists("big")


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/abs",
        "a//b",
        "a/../b",
        "..",
        "a/./b",
        "a b",
        "a\\b",
        "a/b/",
        "x" + TEMP_MARK + "1",
        "é",
        "a/" + "x" * 256,
        "k" * 1025,
        7,
    ],
)
def test_bad_keys_are_refused(backend, key):
    for call in (
        lambda: backend.put(key, b"x"),
        lambda: backend.get(key),
        lambda: backend.exists(key),
        lambda: backend.delete(key),
        lambda: backend.size(key),
    ):
        with pytest.raises(InvalidArgument):
            call()
    with pytest.raises(InvalidArgument):
        backend.list("../")


def test_a_failed_local_put_leaves_nothing(tmp_path, monkeypatch):
    local = LocalBackend(tmp_path / "objects")

    def half_then_crash(self, tmp, data):
        tmp.write_bytes(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LocalBackend, "_write_temp", half_then_crash)
    with pytest.raises(Unavailable, match="No space left"):
        local.put("a/b/seg", b"x" * 1000)
    assert not local.exists("a/b/seg") and local.list("") == []
    assert [f for _, _, files in os.walk(tmp_path / "objects") for f in files] == []
    monkeypatch.undo()
    local.put("a/b/seg", b"x" * 1000)  # the retry works
    assert local.get("a/b/seg") == b"x" * 1000


@pytest.mark.parametrize("direct", [False, True])
def test_a_failed_fsspec_put_leaves_nothing(memory_url, monkeypatch, direct):
    backend = FsspecBackend(memory_url)
    backend.direct_put = direct
    real_pipe = backend.fs.pipe_file

    def half_then_crash(path, data, **kwargs):
        if not direct:  # a rename-mode put writes only its temporary: a partial one is harmless
            real_pipe(path, data[: len(data) // 2])
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(backend.fs, "pipe_file", half_then_crash)
    with pytest.raises(Unavailable, match="connection reset"):
        backend.put("a/b/seg", b"y" * 1000)
    assert not backend.exists("a/b/seg") and backend.list("") == []
    assert backend.fs.find(backend.root) == []
    monkeypatch.undo()
    if not direct:

        def failing_move(*args, **kwargs):
            raise OSError("the move failed")

        monkeypatch.setattr(backend.fs, "mv", failing_move)
        with pytest.raises(Unavailable):
            backend.put("a/b/seg", b"y" * 1000)
        assert backend.fs.find(backend.root) == []
        monkeypatch.undo()
    backend.put("a/b/seg", b"y" * 1000)
    assert backend.get("a/b/seg") == b"y" * 1000


def test_a_crash_leftover_temporary_is_never_listed(tmp_path, memory_url):
    local = LocalBackend(tmp_path / "objects")
    (tmp_path / "objects" / "a").mkdir()
    (tmp_path / "objects" / "a" / f"seg{TEMP_MARK}deadbeef").write_bytes(b"partial")
    remote = FsspecBackend(memory_url)
    remote.fs.pipe_file(f"{remote.root}/a/seg{TEMP_MARK}deadbeef", b"partial")
    for backend in (local, remote):
        assert backend.list("") == [] and not backend.exists("a/seg")
        backend.put("a/seg", b"whole")
        assert backend.list("a/") == ["a/seg"] and backend.get("a/seg") == b"whole"


def test_racing_local_writers_one_wins(tmp_path):
    local = LocalBackend(tmp_path / "objects", fsync=False)
    for round_number in range(20):
        key = f"race/{round_number}"
        barrier = threading.Barrier(2)
        outcomes: dict[bytes, str] = {}

        def write(
            data: bytes,
            key: str = key,
            barrier: threading.Barrier = barrier,
            outcomes: dict[bytes, str] = outcomes,
        ) -> None:
            barrier.wait()
            try:
                local.put(key, data)
                outcomes[data] = "ok"
            except FailedPrecondition:
                outcomes[data] = "refused"

        threads = [threading.Thread(target=write, args=(d,)) for d in (b"A" * 4096, b"B" * 4096)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert sorted(outcomes.values()) == ["ok", "refused"], outcomes
        winner = next(d for d, outcome in outcomes.items() if outcome == "ok")
        assert local.get(key) == winner


def test_open_backend_picks_the_implementation(tmp_path, memory_url):
    assert isinstance(open_backend(str(tmp_path / "a")), LocalBackend)
    by_url = open_backend(f"file://{tmp_path / 'b'}")
    assert isinstance(by_url, LocalBackend) and by_url.root == tmp_path / "b"
    assert isinstance(open_backend(memory_url), FsspecBackend)
    for bad, message in (
        ("nosuch://bucket/x", "unknown scheme 'nosuch'"),
        ("", "empty"),
        ("simplecache::s3://b/x", "chained"),
        ("file://", "no directory"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            open_backend(bad)
    with pytest.raises(InvalidArgument):
        FsspecBackend(str(tmp_path))  # not a URL


# Layout ------------------------------------------------------------------------------------------


def _message(i: int, topic: str, queue_id: int) -> Message:
    return Message(
        topic=topic,
        queue_id=queue_id,
        body=bytes([i % 251]) * (100 + 37 * (i % 11)),
        tags=f"t{i}",
        keys=f"k{i}",
        properties={"n": str(i)},
        producer_id="p",
        producer_seq=i,
    )


@pytest.fixture
def store(tmp_path) -> Iterator[MessageStore]:
    """A store with two epochs, three queues and several 4 KiB commit-log files."""
    made = MessageStore(tmp_path / "store", segment_bytes=4096, fsync=False, broker_name=BROKER)
    for epoch, first in ((1, 0), (2, 30)):
        made.begin_epoch(epoch)
        for i in range(first, first + 30, 3):
            made.put_messages(
                [_message(j, "T", j % 2) for j in range(i, i + 2)] + [_message(i + 2, "U", 0)],
                epoch,
                1_000 + i,
            )
    made.commit_consumer_offset("g", "T", 0, 5, 2, 9_999)
    yield made
    made.close()


def _store_bytes(store: MessageStore) -> bytes:
    parts, offset = [], store.min_offset
    while offset < store.max_offset:
        parts.append(store.read_bytes(offset, 1 << 20))
        offset += len(parts[-1])
    return b"".join(parts)


def _split_at_boundary(data: bytes, near: int) -> int:
    """The first record start at or after `near`."""
    return next(r.commit_offset for r in split_records(data, 0) if r.commit_offset >= near)


def _upload(backend: TieredBackend, data: bytes, cut_points: list[int]) -> list[SegmentMeta]:
    metas = []
    edges = [0, *cut_points, len(data)]
    for base, end in zip(edges, edges[1:], strict=False):
        obj, meta = build_segment(data[base:end], base, cluster=CLUSTER, broker_name=BROKER)
        backend.put(meta.key, obj)
        metas.append(meta)
    return metas


def test_segment_is_the_store_bytes_and_verifies(tmp_path, store):
    data = _store_bytes(store)
    obj, meta = build_segment(data, 0, cluster=CLUSTER, broker_name=BROKER)
    assert obj == data  # T2: byte-identical to the replicas' commit log
    assert (meta.base_offset, meta.end_offset, meta.size) == (0, len(data), len(data))
    assert meta.sha256 == f"crc32c:{google_crc32c.value(data):08x}"
    assert meta.record_count == len(split_records(data, 0)) == 61
    assert (meta.first_epoch, meta.last_epoch) == (1, 2)
    assert meta.key == segment_key(CLUSTER, BROKER, 0, len(data))
    assert parse_segment_key(meta.key) == (0, len(data))
    backend = LocalBackend(tmp_path / "objects")
    backend.put(meta.key, obj)
    verify_segment(backend, meta)
    verify_segment(backend, meta, epochs=store.epochs.entries)
    with pytest.raises(CorruptData, match="lineage"):
        verify_segment(backend, meta, epochs=[(1, 0), (2, 100)])
    assert SegmentMeta.from_dict(meta.to_dict()) == meta


def test_a_flipped_or_cut_object_fails_verification(tmp_path, store):
    data = _store_bytes(store)
    backend = LocalBackend(tmp_path / "objects")
    (meta,) = _upload(backend, data, [])
    moved = SegmentMeta(**{**meta.to_dict(), "key": segment_key(CLUSTER, "broker-b", 0, len(data))})
    backend.put(moved.key, data)  # the right bytes under another broker set's name
    with pytest.raises(CorruptData, match="another broker"):
        verify_segment(backend, moved)
    path = tmp_path / "objects" / meta.key
    for mutate in (lambda b: b[:500] + bytes([b[500] ^ 0x01]) + b[501:], lambda b: b[:-1]):
        os.chmod(path, 0o644)
        path.write_bytes(mutate(data))
        with pytest.raises(CorruptData):
            verify_segment(backend, meta)
    backend.delete(meta.key)
    with pytest.raises(NotFound):
        verify_segment(backend, meta)


def test_build_segment_refuses_anything_but_whole_records(store):
    data = _store_bytes(store)
    second = split_records(data, 0)[1].commit_offset
    with pytest.raises(CorruptData):
        build_segment(data[:-3], 0, cluster=CLUSTER, broker_name=BROKER)  # torn tail
    with pytest.raises(CorruptData):
        build_segment(data[5:], 5, cluster=CLUSTER, broker_name=BROKER)  # off a boundary
    with pytest.raises(CorruptData):
        build_segment(data[second:], 0, cluster=CLUSTER, broker_name=BROKER)  # wrong base
    with pytest.raises(CorruptData, match="another broker"):
        build_segment(data, 0, cluster=CLUSTER, broker_name="broker-b")
    with pytest.raises(CorruptData):  # epochs go backwards: not one master's log
        build_segment(data[second:] + data[:second], second, cluster=CLUSTER, broker_name=BROKER)
    with pytest.raises(InvalidArgument):
        build_segment(b"", 0, cluster=CLUSTER, broker_name=BROKER)
    with pytest.raises(InvalidArgument):
        build_segment(data, 0, cluster="bad/name", broker_name=BROKER)


def test_read_range_across_segments_equals_the_store(tmp_path, store):
    data = _store_bytes(store)
    cut = _split_at_boundary(data, len(data) // 2)
    backend = FsspecBackend(f"file://{tmp_path / 'objects'}")
    metas = _upload(backend, data, [cut])
    assert read_range(backend, metas, 0, 16 << 20) == data
    starts = [r.commit_offset for r in split_records(data, 0)]
    for offset in (starts[3], cut, starts[-1]):
        assert read_range(backend, list(reversed(metas)), offset, 16 << 20) == data[offset:]
    for max_bytes in (1, 300, 1000, 4096):  # 1 and 300 are smaller than some records
        offset, pieces = 0, []
        while offset < len(data):
            piece = read_range(backend, metas, offset, max_bytes)
            assert piece and (len(piece) <= max_bytes or len(split_records(piece, offset)) == 1)
            assert (
                piece == store.read_bytes(offset, max_bytes)
                or offset + len(piece) == cut
                or len(piece) > len(store.read_bytes(offset, max_bytes))
            )  # store stops at its files
            pieces.append(piece)
            offset += len(piece)
        assert b"".join(pieces) == data
    assert read_range(backend, metas, len(data), 100) == b""
    with pytest.raises(InvalidArgument, match="not a record start"):
        read_range(backend, metas, starts[3] + 1, 1000)
    with pytest.raises(InvalidArgument, match="no tiered segment"):
        read_range(backend, metas[1:], 0, 1000)
    with pytest.raises(InvalidArgument, match="no tiered segment"):
        read_range(backend, metas, len(data) + 1, 1000)
    with pytest.raises(InvalidArgument, match="overlap"):
        read_range(backend, [*metas, *_upload(backend, data, [])], 0, 1000)


def test_read_range_stops_at_a_gap_and_detects_corruption(tmp_path, store):
    data = _store_bytes(store)
    first_cut = _split_at_boundary(data, len(data) // 3)
    second_cut = _split_at_boundary(data, 2 * len(data) // 3)
    backend = LocalBackend(tmp_path / "objects")
    metas = _upload(backend, data, [first_cut, second_cut])
    assert read_range(backend, [metas[0], metas[2]], 0, 16 << 20) == data[:first_cut]
    path = tmp_path / "objects" / metas[1].key
    path.write_bytes(data[first_cut : first_cut + 200] + b"\xff" + data[first_cut + 201 : second_cut])
    with pytest.raises(CorruptData, match="never served"):
        read_range(backend, metas, 0, 16 << 20)
    with pytest.raises(CorruptData, match="never served"):
        read_range(backend, metas, first_cut, 16 << 20)


def test_index_segments_match_the_store(store):
    data = _store_bytes(store)
    records = split_records(data, 0)
    objects = build_index_segments(records, cluster=CLUSTER, broker_name=BROKER)
    assert sorted(objects) == sorted(
        index_key(CLUSTER, BROKER, topic, queue_id, 0) for topic, queue_id in store.queues()
    )
    for topic, queue_id in store.queues():
        entries = parse_index_segment(objects[index_key(CLUSTER, BROKER, topic, queue_id, 0)], queue_id, 0)
        stored = store.get_messages(topic, queue_id, 0, 1024, store.max_offset, max_bytes=64 << 20)
        assert entries == [(r.queue_offset, r.commit_offset, r.size) for r in stored]
    later = [r for r in records if r.commit_offset >= records[20].commit_offset]
    first_t0 = next(r.queue_offset for r in later if (r.topic, r.queue_id) == ("T", 0))
    assert index_key(CLUSTER, BROKER, "T", 0, first_t0) in build_index_segments(
        later, cluster=CLUSTER, broker_name=BROKER
    )
    blob = objects[index_key(CLUSTER, BROKER, "T", 0, 0)]
    for bad, queue_id, first in (
        (blob[:-1] + bytes([blob[-1] ^ 1]), 0, 0),
        (blob[:-2], 0, 0),
        (blob, 1, 0),
        (blob, 0, 1),
        (b"", 0, 0),
    ):
        with pytest.raises(CorruptData):
            parse_index_segment(bad, queue_id, first)
    t0 = [r for r in records if (r.topic, r.queue_id) == ("T", 0)]
    with pytest.raises(CorruptData, match="expected"):  # a queue offset skipped
        build_index_segments([t0[0], t0[2]], cluster=CLUSTER, broker_name=BROKER)


def test_epoch_lineage_round_trips(store):
    end = store.max_offset
    key, blob = build_epoch_lineage(store.epochs.entries, end, cluster=CLUSTER, broker_name=BROKER)
    assert key == f"{CLUSTER}/{BROKER}/epochs/{end:020d}.json"
    assert parse_epoch_lineage(blob) == (end, store.epochs.entries)
    second_start = store.epochs.entries[1][1]
    _, early = build_epoch_lineage(store.epochs.entries, second_start, cluster=CLUSTER, broker_name=BROKER)
    assert parse_epoch_lineage(early) == (second_start, store.epochs.entries[:1])
    for bad in (blob.replace(b'"end_offset":', b'"end_offset":1'), blob[:-1], b"{}", b"\xff"):
        with pytest.raises(CorruptData):
            parse_epoch_lineage(bad)
    with pytest.raises(CorruptData):
        build_epoch_lineage([(2, 0), (1, 10)], 100, cluster=CLUSTER, broker_name=BROKER)


def _meta(base: int, end: int) -> SegmentMeta:
    return SegmentMeta(
        key=segment_key(CLUSTER, BROKER, base, end),
        base_offset=base,
        end_offset=end,
        size=end - base,
        sha256="0" * 64,
        record_count=1,
        first_epoch=1,
        last_epoch=1,
    )


def test_gaps_and_overlaps_are_reported():
    assert find_gaps_and_overlaps([]) == []
    assert find_gaps_and_overlaps([_meta(100, 200), _meta(0, 100), _meta(200, 350)]) == []
    (gap,) = find_gaps_and_overlaps([_meta(0, 100), _meta(150, 200)])
    assert gap.startswith("gap: [100, 150)")
    (overlap,) = find_gaps_and_overlaps([_meta(0, 100), _meta(90, 200)])
    assert overlap.startswith("overlap") and "starts at 90" in overlap
    assert len(find_gaps_and_overlaps([_meta(0, 100), _meta(0, 100)])) == 1  # a duplicate
    nested = find_gaps_and_overlaps([_meta(0, 300), _meta(100, 200), _meta(300, 400)])
    assert len(nested) == 1 and "starts at 100" in nested[0]  # nothing wrong after the nest
    problems = find_gaps_and_overlaps([_meta(0, 100), _meta(50, 120), _meta(200, 300)])
    assert [p.split(":")[0] for p in problems] == ["overlap", "gap"]


def test_keys_and_meta_are_validated():
    assert upload_marker_key(CLUSTER, BROKER, "u-1") == "c1/broker-a/uploads/u-1.json"
    assert index_key(CLUSTER, BROKER, "%CONSUMER_OFFSET%", 0, 7).endswith(
        "/index/%CONSUMER_OFFSET%/0/00000000000000000007.idx"
    )
    for call in (
        lambda: segment_key(CLUSTER, BROKER, 10, 10),
        lambda: segment_key(CLUSTER, "a/b", 0, 10),
        lambda: upload_marker_key(CLUSTER, BROKER, "../x"),
        lambda: index_key(CLUSTER, BROKER, "T", 70_000, 0),
        lambda: parse_segment_key("c1/broker-a/commitlog/1-2.seg"),
        lambda: _meta(0, 100).__class__(**{**_meta(0, 100).to_dict(), "size": 99}),
    ):
        with pytest.raises(InvalidArgument):
            call()
    for bad in ("nope", "crc32c:0123abc", "crc32c:0123abcg", "crc32:0123abcd", "0" * 63):
        with pytest.raises(CorruptData):
            SegmentMeta.from_dict({**_meta(0, 100).to_dict(), "sha256": bad})
    assert SegmentMeta.from_dict({**_meta(0, 100).to_dict(), "sha256": "crc32c:0123abcd"})
    with pytest.raises(CorruptData):
        SegmentMeta.from_dict({"key": "x"})


# The uploader's fast path ------------------------------------------------------------------------


def test_write_upload_makes_what_the_decoding_twins_make(tmp_path, store, backend, steps):
    from mqmeta.broker_agent.tiered import prepare_upload, write_upload

    data = _store_bytes(store)
    records = split_records(data, 0)
    for cut, from_file in ((0, True), (records[17].commit_offset, False), (records[40].commit_offset, True)):
        piece = store.read_bulk(cut, len(data) - cut, check=False)
        assert piece == data[cut : cut + len(piece)]
        with store.open_bulk(cut, len(data) - cut) as source:
            assert source.length == len(piece) and source.read() == piece
            upload = prepare_upload(
                store, source if from_file else piece, cut, cluster=CLUSTER, broker_name=BROKER
            )
            meta = write_upload(backend, upload)
        obj, expected = build_segment(piece, cut, cluster=CLUSTER, broker_name=BROKER)
        assert meta == expected and backend.get(meta.key) == obj
        indexes = build_index_segments(split_records(piece, cut), cluster=CLUSTER, broker_name=BROKER)
        for key, body in indexes.items():
            assert backend.get(key) == body
        verify_stored(backend, meta)
        verify_segment(backend, meta, epochs=store.epochs.entries)
        lineage = epochs_key(CLUSTER, BROKER, meta.end_offset)
        assert backend.exists(lineage) and set(upload.keys()) == {meta.key, *indexes, lineage}


@pytest.fixture(params=["whole", "small-steps"])
def steps(request, monkeypatch):
    """The uploader's checks follow the copy in steps; "small-steps" makes a range of this
    test store take many copy and check steps (records straddle every step's end)."""
    if request.param == "small-steps":
        import mqmeta.broker_agent.commitlog as commitlog
        import mqmeta.broker_agent.tiered as tiered

        monkeypatch.setattr(commitlog, "COPY_CHUNK_BYTES", 1000)
        monkeypatch.setattr(tiered_backend, "COPY_CHUNK_BYTES", 1000)
        monkeypatch.setattr(tiered, "RECORD_STEP_BYTES", 700)
        monkeypatch.setattr(tiered, "CHECK_STEP_BYTES", 900)
    return request.param


def test_write_upload_refuses_corrupt_bytes(tmp_path, store, steps):
    import dataclasses

    from mqmeta.broker_agent.tiered import prepare_upload, write_upload

    data = store.read_bulk(0, store.max_offset, check=False)
    flipped = data[:700] + bytes([data[700] ^ 0x10]) + data[701:]
    upload = prepare_upload(store, flipped, 0, cluster=CLUSTER, broker_name=BROKER)
    local = LocalBackend(tmp_path / "a")
    with pytest.raises(CorruptData, match="checksum"):
        write_upload(local, upload)
    assert not local.exists(upload.segment_key)  # never published
    miscounted = dataclasses.replace(
        prepare_upload(store, data, 0, cluster=CLUSTER, broker_name=BROKER), record_count=5
    )
    with pytest.raises(CorruptData, match="index"):
        write_upload(LocalBackend(tmp_path / "b"), miscounted)
    # a flipped byte in the log file itself, copied by the kernel (the uploader's path)
    first = store.log.segment_paths()[0]
    raw = first.read_bytes()
    flip_at = len(raw) - 100  # in the last step when the steps are small
    first.write_bytes(raw[:flip_at] + bytes([raw[flip_at] ^ 0x01]) + raw[flip_at + 1 :])
    for target in (LocalBackend(tmp_path / "c"), LocalBackend(tmp_path / "d", fsync=False)):
        with store.open_bulk(0, 1 << 20) as source:
            upload = prepare_upload(store, source, 0, cluster=CLUSTER, broker_name=BROKER)
            with pytest.raises(CorruptData, match="checksum"):
                write_upload(target, upload)
        assert not target.exists(upload.segment_key)
        assert [f for _, _, files in os.walk(target.root) for f in files if TEMP_MARK in f] == []


def test_check_whole_records_and_read_bulk(tmp_path, store):
    from mqmeta.broker_agent.commitlog import BULK_READ_BYTES_MAX, check_whole_records

    data = _store_bytes(store)
    assert check_whole_records(data, 0) == len(split_records(data, 0))
    assert check_whole_records(b"", 0) == 0
    with pytest.raises(CorruptData, match="record boundary"):
        check_whole_records(data[:-3], 0)
    assert store.read_bulk(0, 32 << 20) == store.read_bytes(0, 1 << 20)  # one 4 KiB file
    with pytest.raises(InvalidArgument):
        store.read_bytes(0, 32 << 20)
    with pytest.raises(InvalidArgument):
        store.read_bulk(0, BULK_READ_BYTES_MAX + 1)
    first = store.log.segment_paths()[0]
    raw = first.read_bytes()
    first.write_bytes(raw[:300] + bytes([raw[300] ^ 0x01]) + raw[301:])
    for read in (store.read_bytes, store.read_bulk):
        with pytest.raises(CorruptData, match="never served"):
            read(0, 1 << 20)
    assert store.read_bulk(0, 1 << 20, check=False)[300] == raw[300] ^ 0x01  # unchecked


def test_verify_stored_size_only_when_puts_are_verified(tmp_path, memory_url, store):
    from mqmeta.broker_agent.tiered import prepare_upload, write_upload

    data = store.read_bulk(0, store.max_offset)
    local = LocalBackend(tmp_path / "objects")
    assert local.puts_are_verified and not LocalBackend(tmp_path / "x", fsync=False).puts_are_verified
    meta = write_upload(local, prepare_upload(store, data, 0, cluster=CLUSTER, broker_name=BROKER))
    verify_stored(local, meta)
    remote = FsspecBackend(memory_url)
    assert not remote.puts_are_verified
    remote.put(meta.key, data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    with pytest.raises(CorruptData):
        verify_stored(remote, meta)


def test_put_checked_checks_what_it_stores_and_publishes_only_on_success(backend, tmp_path):
    from mqmeta.broker_agent.commitlog import FileRange
    from mqmeta.broker_agent.tiered_backend import BytesSource

    seen: list[bytes] = []

    def keep(view: memoryview, ready) -> int:
        assert ready(len(view)) == len(view)
        seen.append(bytes(view))
        return len(view)

    assert backend.put_checked("a/seg", BytesSource(b"abc" * 100), keep) == 300
    assert seen == [b"abc" * 100] and backend.get("a/seg") == b"abc" * 100
    path = tmp_path / "source.log"
    path.write_bytes(b"0123456789" * 50)
    with FileRange(os.open(path, os.O_RDONLY), 20, 100, path) as source:
        assert backend.put_checked("a/file", source, keep) == 100
    assert seen[-1] == (b"0123456789" * 50)[20:120] == backend.get("a/file")

    def refuse(view: memoryview, ready) -> int:
        raise CorruptData("a record failed its CRC")

    with pytest.raises(CorruptData, match="CRC"):
        backend.put_checked("a/bad", BytesSource(b"xyz" * 10), refuse)
    assert not backend.exists("a/bad") and backend.list("a/") == ["a/file", "a/seg"]
    assert backend.put_checked("a/seg", BytesSource(b"abc" * 100), keep) == 300  # same bytes: fine
    with pytest.raises(FailedPrecondition):
        backend.put_checked("a/seg", BytesSource(b"abd" * 100), keep)  # immutable
    assert backend.get("a/seg") == b"abc" * 100
    with FileRange(os.open(path, os.O_RDONLY), 450, 100, path) as short, pytest.raises(CorruptData):
        backend.put_checked("a/short", short, keep)  # the file ends 50 bytes early
    assert not backend.exists("a/short")
    big = os.urandom(3 * COPY_CHUNK_BYTES + 12345)
    path.write_bytes(big)
    steps: list[int] = []

    def follow(view: memoryview, ready) -> int:
        value = done = 0
        while done < len(view):
            available = ready(done + 1)
            steps.append(available)
            value = zlib.crc32(view[done:available], value)
            done = available
        return value

    with FileRange(os.open(path, os.O_RDONLY), 0, len(big), path) as source:
        assert backend.put_checked("a/big", source, follow) == zlib.crc32(big)
    assert backend.get("a/big") == big and steps[-1] == len(big)


def test_crc32c_over_any_buffer_and_sha256_segments_still_verify(tmp_path, memory_url, store):
    import dataclasses
    import mmap

    from mqmeta.formats.checksum import checksum_matches, crc32c, object_checksum

    data = _store_bytes(store)
    expected = google_crc32c.value(data)
    assert crc32c(data) == crc32c(memoryview(data)) == crc32c(bytearray(data)) == expected
    assert crc32c(memoryview(data)[10:99]) == google_crc32c.value(data[10:99])
    path = tmp_path / "mapped"
    path.write_bytes(data)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), len(data)) as mapped:
        view = memoryview(mapped)
        assert crc32c(view) == expected
        view.release()
    assert object_checksum(data) == f"crc32c:{expected:08x}"
    flipped = data[:9] + bytes([data[9] ^ 4]) + data[10:]
    for checksum in (object_checksum(data), hashlib.sha256(data).hexdigest()):
        assert checksum_matches(data, checksum) and not checksum_matches(flipped, checksum)
    # a segment uploaded before P11: its meta names a SHA-256, and it still verifies
    _, meta = build_segment(data, 0, cluster=CLUSTER, broker_name=BROKER)
    old = dataclasses.replace(meta, sha256=hashlib.sha256(data).hexdigest())
    assert SegmentMeta.from_dict(old.to_dict()) == old
    for backend in (LocalBackend(tmp_path / "objects"), FsspecBackend(memory_url)):
        backend.put(old.key, data)
        verify_segment(backend, old)
        verify_stored(backend, old)
    remote = FsspecBackend(memory_url)
    remote.delete(old.key)
    remote.put(old.key, flipped)
    for check in (verify_segment, verify_stored):
        with pytest.raises(CorruptData):
            check(remote, old)
