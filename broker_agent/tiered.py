"""The tiered uploader: the master copies confirmed commit-log ranges to the tiered store.

Rules (docs/tiered.md; RocketMQ never finished this, Kafka KIP-405 is the model):
- only the current master uploads, and only bytes below its confirm offset (T1); a
  stalled slave stalls the confirm offset and so the upload;
- uploads are batched by size (`upload_bytes`) and by age (`upload_interval_ms`);
- each upload is two-phase and fenced by the master epoch: a marker object naming what
  it will write -> "upload started" in the controller -> the objects (segment, per-queue
  index, epoch lineage; the segment is published only once every record's CRC-32 in the
  bytes as stored checked out, and its CRC32C taken from those bytes: write_upload) ->
  verify what is stored -> commit the checkpoint in the controller. A stale master's
  start or commit is refused there;
- demotion stops the uploader at once: it re-checks role and epoch between steps and
  commits nothing once they changed;
- a new master resumes from the controller's checkpoint only if its own epoch lineage
  agrees with the uploaded range's lineage (KAFKA-15241); otherwise it refuses;
- objects of abandoned uploads (listed by the controller) are deleted, then forgotten;
- local segments go only once committed and past local retention, on the master and
  on slaves alike (a slave learns the checkpoint from the controller, at a bounded rate);
- a failed step (the tiered store's disk full or failing: ENOSPC, EIO; the controller
  away) commits nothing: a put that fails leaves no object (LocalBackend removes its
  temp file), what the abandoned upload did publish is collected as garbage when the
  uploader resumes, and the checkpoint names only segments verified after their put.
  The step is retried after a capped exponential backoff (UPLOAD_RETRY) and counted
  by reason (`failures`, the broker's `tiered_upload_failures` metric).
"""

from __future__ import annotations

import bisect
import errno
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from mqmeta.broker_agent.commitlog import BULK_READ_BYTES_MAX, check_whole_records
from mqmeta.broker_agent.core import UploadStarting
from mqmeta.broker_agent.ha import Role
from mqmeta.broker_agent.tiered_backend import (
    BytesSource,
    Check,
    ObjectSource,
    Ready,
    TieredBackend,
    open_backend,
)
from mqmeta.broker_agent.tiered_objects import verify_stored

from mqmeta.backoff import Attempts, Backoff
from mqmeta.errors import CorruptData, FailedPrecondition, InvalidArgument, MqmetaError
from mqmeta.formats.checksum import checksum_matches, crc32c, crc32c_checksum
from mqmeta.formats.epochs import EpochEntry, consistent_point, epoch_covering
from mqmeta.formats.records import RECORD_BYTES_MAX, StoredRecord, decode_record, valid_run
from mqmeta.formats.tiered import (
    INDEX_ENTRY_BYTES,
    SegmentMeta,
    broker_prefix,
    build_epoch_lineage,
    build_index_objects,
    parse_index_segment,
    segment_key,
    upload_marker_key,
)
from mqmeta.pb import controller_pb2 as cpb

if TYPE_CHECKING:
    from mqmeta.broker_agent.seams import BrokerHost
    from mqmeta.broker_agent.store import MessageStore

log = logging.getLogger(__name__)

STEP_INTERVAL_S = 0.1
UPLOAD_BYTES_MAX = BULK_READ_BYTES_MAX  # one upload is one commit-log read (64 MiB)
# After a failed step: 0.5 s, doubling to 30 s while it keeps failing (a full tiered
# store is retried twice a minute, not ten times a second); a success starts over.
UPLOAD_RETRY = Backoff(first_pause_s=0.5, pause_max_s=30.0)
SLAVE_RETENTION_INTERVAL_S = 1.0  # how often a slave asks the controller for the checkpoint
PUT_WORKERS_MAX = 4  # an upload's objects are put concurrently: their fsyncs overlap


@dataclass(frozen=True)
class TieredConfig:
    url: str
    upload_bytes: int = 4 << 20
    upload_interval_ms: int = 2000
    local_retention_bytes: int = 0  # 0 = keep every local segment

    def validate(self) -> None:
        if not 1 << 10 <= self.upload_bytes <= UPLOAD_BYTES_MAX:
            raise InvalidArgument(
                f"tiered upload bytes must be from 1 KiB to {UPLOAD_BYTES_MAX} (one read of the commit log)"
            )
        if not 10 <= self.upload_interval_ms <= 3_600_000:
            raise InvalidArgument("tiered upload interval must be from 10 ms to 1 hour")
        if self.local_retention_bytes < 0:
            raise InvalidArgument("local retention bytes must be 0 (keep all) or positive")


T = TypeVar("T")


def failure_reason(error: BaseException) -> str:
    """The metric's reason for a failed step: the errno's name of an OSError (enospc,
    eio), also when a backend wrapped it; else the error's class (unavailable, ...)."""
    cause = error if isinstance(error, OSError) else error.__cause__
    if isinstance(cause, OSError) and cause.errno:
        return errno.errorcode.get(cause.errno, "oserror").lower()
    return type(error).__name__.lower()


class Demoted(Exception):
    """The role or epoch changed during an upload: stop, commit nothing."""


class TieredUploader:
    def __init__(self, host: BrokerHost, config: TieredConfig) -> None:
        config.validate()
        self.host = host
        self.config = config
        self.backend = open_backend(config.url)
        self.checkpoint: cpb.TieredCheckpoint | None = None
        self.checkpoint_epoch = 0
        self.refused = ""  # why this master will not upload (lineage disagreement)
        self.last_upload = time.monotonic()
        self.next_slave_retention = 0.0
        self.failures: dict[str, int] = {}  # failed steps by reason: enospc, eio, unavailable, ...
        self._attempts = Attempts(UPLOAD_RETRY)
        self._thread = threading.Thread(target=self._loop, name="tiered", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self.host.stopping.wait(STEP_INTERVAL_S):
            try:
                self.step()
            except Demoted:
                log.info("tiered upload stopped: this broker is no longer the master")
                self.checkpoint = None
            except (OSError, MqmetaError) as error:  # the backends raise Unavailable from an OSError
                self._failed(failure_reason(error), f"{error}; nothing of it is committed")
            except Exception:  # the uploader must outlive any one failed step
                log.exception("tiered upload step failed")
                self._failed("bug", "")

    def _failed(self, reason: str, why: str) -> None:
        """Counts a failed step, forgets the checkpoint (resuming re-reads it and collects
        what the abandoned upload wrote) and waits the backoff's pause."""
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.checkpoint = None
        pause_s = self._attempts.failed()
        if why:
            log.warning("tiered upload: %s; retrying in %.1f s", why, pause_s)
        self.host.stopping.wait(pause_s)

    # One step ---------------------------------------------------------------------------
    def _role(self) -> tuple[int, int]:
        """(master epoch, confirm offset) while master; Demoted otherwise."""
        view = self.host.view()
        if view.role != Role.MASTER:
            raise Demoted()
        return view.master_epoch, view.confirm_offset

    def _still(self, epoch: int) -> None:
        if self._role()[0] != epoch:
            raise Demoted()

    def step(self) -> None:
        role = self.host.view().role
        if role != Role.MASTER:
            self.checkpoint = None
            if role == Role.SLAVE:
                self._slave_retention()
            return
        epoch, confirm = self._role()
        if self.checkpoint_epoch != epoch or (self.checkpoint is None and not self.refused):
            self._resume(epoch)  # a refusal is re-examined only when the epoch changes
        if self.refused or self.checkpoint is None:
            return
        uploaded = self.checkpoint.uploaded_offset
        pending = confirm - uploaded
        due = time.monotonic() - self.last_upload >= self.config.upload_interval_ms / 1000
        if pending > 0 and (pending >= self.config.upload_bytes or due):
            self._upload(epoch, uploaded, min(confirm, uploaded + self.config.upload_bytes))

    def _resume(self, epoch: int) -> None:
        """Promotion: adopt the controller's checkpoint if this log agrees with it."""
        checkpoint = self._controller(
            "GetTieredCheckpoint",
            cpb.BrokerSetRef(cluster=self.host.cluster, broker_name=self.host.broker_name),
        )
        lineage = [(e.epoch, e.start_offset) for e in checkpoint.epochs]
        store = self.host.store
        agreed = (
            consistent_point(lineage, store.epochs.entries, store.max_offset, checkpoint.uploaded_offset)
            if checkpoint.uploaded_offset
            else 0
        )
        self.checkpoint_epoch = epoch
        if agreed < checkpoint.uploaded_offset:
            self.refused = (
                f"the tiered store holds [0, {checkpoint.uploaded_offset}) but this "
                f"master's log agrees with it only up to {agreed}; not uploading"
            )
            log.error("%s", self.refused)
            return
        self.refused = ""
        self.checkpoint, self.checkpoint_epoch = checkpoint, epoch
        self._collect_garbage(epoch)

    def _controller(self, method: str, request):
        return self.host.call_controller(method, request)

    def _upload(self, epoch: int, base: int, limit: int) -> None:
        host, store = self.host, self.host.store
        with store.open_bulk(base, limit - base) as source:  # write_upload checks the bytes
            end = base + source.length
            if not source.length or end > limit:
                raise FailedPrecondition(f"cannot read whole records in [{base}, {limit})")
            with host.lock:
                self._still(epoch)
                # T1: the core refuses an end past the confirm offset; else the audit's
                # evidence of the confirm offset is written before the upload starts
                host.feed(UploadStarting(end))
            upload = prepare_upload(store, source, base, cluster=host.cluster, broker_name=host.broker_name)
            upload_id = self._start_upload(epoch, upload)
            meta = write_upload(_FencedWrites(self, epoch), upload)  # checks before publishing
        verify_stored(self.backend, meta)
        self._still(epoch)
        self.checkpoint = self._controller(
            "TieredCommit",
            cpb.TieredCommitRequest(
                cluster=host.cluster,
                broker_name=host.broker_name,
                master_broker_id=host.view().broker_id,
                master_epoch=epoch,
                upload_id=upload_id,
                segments=[
                    cpb.TieredSegment(
                        key=meta.key,
                        base_offset=meta.base_offset,
                        end_offset=meta.end_offset,
                        size=meta.size,
                        sha256=meta.sha256,  # the checksum (crc32c:...), see SegmentMeta
                        record_count=meta.record_count,
                        first_epoch=meta.first_epoch,
                        last_epoch=meta.last_epoch,
                    )
                ],
                epochs=[cpb.TieredEpoch(epoch=e, start_offset=s) for e, s in upload.epochs],
            ),
        )
        self.last_upload = time.monotonic()
        self._attempts.succeeded()
        log.info("uploaded [%d, %d) to %s", base, meta.end_offset, meta.key)
        self._apply_retention()

    def _start_upload(self, epoch: int, upload: PreparedUpload) -> str:
        """Phase one: the marker naming every key, then "upload started" in the controller."""
        cluster, name = self.host.cluster, self.host.broker_name
        upload_id = uuid.uuid4().hex
        self.backend.put(
            upload_marker_key(cluster, name, upload_id),
            json.dumps({"keys": upload.keys(), "epoch": epoch}).encode(),
        )
        self._controller(
            "TieredUploadStart",
            cpb.TieredUploadStartRequest(
                cluster=cluster,
                broker_name=name,
                master_broker_id=self.host.view().broker_id,
                master_epoch=epoch,
                upload_id=upload_id,
                base_offset=upload.base_offset,
                end_offset=upload.end_offset,
            ),
        )
        return upload_id

    def _apply_retention(self) -> None:
        """Local segments go only once committed to the tiered store and past retention."""
        if self.config.local_retention_bytes and self.checkpoint is not None:
            self._retain(self.checkpoint.uploaded_offset)

    def _retain(self, committed: int) -> None:
        store = self.host.store
        cutoff = min(committed, store.max_offset - self.config.local_retention_bytes)
        if cutoff > store.min_offset and store.delete_before(cutoff):
            log.info("local retention: the log now starts at %d", store.min_offset)

    def _slave_retention(self) -> None:
        """The master's rule on a slave: delete only what the controller's committed
        checkpoint covers, past local retention, and only where this log agrees with the
        uploaded lineage (a slave may still hold a divergent tail it has not truncated).
        The checkpoint is asked for at most every SLAVE_RETENTION_INTERVAL_S."""
        now = time.monotonic()
        if not self.config.local_retention_bytes or now < self.next_slave_retention:
            return
        self.next_slave_retention = now + SLAVE_RETENTION_INTERVAL_S
        store = self.host.store
        if store.max_offset - store.min_offset <= self.config.local_retention_bytes:
            return  # nothing could go: spare the controller the call
        checkpoint = self._controller(
            "GetTieredCheckpoint",
            cpb.BrokerSetRef(cluster=self.host.cluster, broker_name=self.host.broker_name),
        )
        uploaded = checkpoint.uploaded_offset
        if not uploaded:
            return
        lineage = [(e.epoch, e.start_offset) for e in checkpoint.epochs]
        agreed = consistent_point(lineage, store.epochs.entries, store.max_offset, uploaded)
        with self.host.lock:
            if self.host.view().role == Role.SLAVE:
                self._retain(min(uploaded, agreed))

    def read_queue(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> list[StoredRecord]:
        """Records of one queue that only the tiered store still holds (retention cut them
        locally). Only entries inside the committed range count, and each record read
        must be the one its index entry names."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            raise FailedPrecondition("the tiered store is not ready on this master yet; retry")
        cluster, name = self.host.cluster, self.host.broker_name
        prefix = f"{broker_prefix(cluster, name)}index/{topic}/{queue_id}/"
        keys = self.backend.list(prefix)
        firsts = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in keys]
        start = max(0, bisect.bisect_right(firsts, queue_offset) - 1)
        segments = sorted(checkpoint.segments, key=lambda s: s.base_offset)
        bases = [s.base_offset for s in segments]
        records: list[StoredRecord] = []
        for key, first in zip(keys[start:], firsts[start:], strict=True):
            for offset, commit, size in parse_index_segment(self.backend.get(key), queue_id, first):
                if offset < queue_offset or commit + size > checkpoint.uploaded_offset:
                    continue
                segment = segments[bisect.bisect_right(bases, commit) - 1]
                data = self.backend.get_range(segment.key, commit - segment.base_offset, size)
                record = decode_record(data, 0, commit)
                if (record.topic, record.queue_id, record.queue_offset) != (topic, queue_id, offset):
                    raise CorruptData(
                        f"tiered index {key} names {topic}/{queue_id}@{offset} at "
                        f"{commit}, but that record is {record.topic}/"
                        f"{record.queue_id}@{record.queue_offset}"
                    )
                records.append(record)
                if len(records) >= max_count:
                    return records
        return records

    def _put_over_garbage(self, key: str, put: Callable[[], T]) -> T:
        """Objects are immutable; a different object at a key above the checkpoint can only
        be left by an abandoned upload (only the fenced master writes there): replace it."""
        try:
            return put()
        except FailedPrecondition:
            assert self.checkpoint is not None
            assert key not in {s.key for s in self.checkpoint.segments}, key
            log.warning("replacing %s left by an abandoned upload", key)
            self.backend.delete(key)
            return put()

    def _collect_garbage(self, epoch: int) -> None:
        """Deletes what abandoned uploads wrote, except objects a committed segment uses."""
        assert self.checkpoint is not None
        abandoned = list(self.checkpoint.abandoned_upload_ids)
        if not abandoned:
            return
        cluster, name = self.host.cluster, self.host.broker_name
        committed = {s.key for s in self.checkpoint.segments}
        for upload_id in abandoned:
            marker = upload_marker_key(cluster, name, upload_id)
            if self.backend.exists(marker):
                for key in json.loads(self.backend.get(marker))["keys"]:
                    if key not in committed and "/commitlog/" in key:
                        self.backend.delete(key)
                self.backend.delete(marker)
        self.checkpoint = self._controller(
            "TieredForgetAbandoned",
            cpb.TieredForgetRequest(
                cluster=cluster,
                broker_name=name,
                master_broker_id=self.host.view().broker_id,
                master_epoch=epoch,
                upload_ids=abandoned,
            ),
        )
        log.info("deleted the objects of abandoned uploads %s", abandoned)


class _FencedWrites:
    """The uploader's writes for one upload: each re-checks role and epoch first, and
    replaces what an abandoned upload left at its key."""

    def __init__(self, uploader: TieredUploader, epoch: int) -> None:
        self.uploader, self.epoch = uploader, epoch

    def put(self, key: str, body: bytes) -> None:
        self.uploader._still(self.epoch)
        backend = self.uploader.backend
        self.uploader._put_over_garbage(key, lambda: backend.put(key, body))

    def put_checked(self, key: str, source: ObjectSource, check: Check[T]) -> T:
        self.uploader._still(self.epoch)
        backend = self.uploader.backend
        return self.uploader._put_over_garbage(key, lambda: backend.put_checked(key, source, check))


class UploadWrites(Protocol):
    """What write_upload needs of a backend (a TieredBackend has both)."""

    def put(self, key: str, body: bytes) -> None: ...

    def put_checked(self, key: str, source: ObjectSource, check: Check[T]) -> T: ...


@dataclass(frozen=True)
class PreparedUpload:
    """One upload before its segment is checked: the segment's key and source, the other
    objects (the per-queue index objects, then the epoch lineage) and what the segment
    meta needs."""

    base_offset: int
    record_count: int
    first_epoch: int
    last_epoch: int
    segment_key: str
    segment: ObjectSource
    objects: list[tuple[str, bytes]]
    epochs: list[EpochEntry]

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.segment.length

    def keys(self) -> list[str]:
        return [self.segment_key, *(key for key, _ in self.objects)]

    def meta(self, checksum: str) -> SegmentMeta:
        return SegmentMeta(
            key=self.segment_key,
            base_offset=self.base_offset,
            end_offset=self.end_offset,
            size=self.segment.length,
            sha256=checksum,
            record_count=self.record_count,
            first_epoch=self.first_epoch,
            last_epoch=self.last_epoch,
        )


def prepare_upload(
    store: MessageStore, segment: ObjectSource | bytes, base: int, *, cluster: str, broker_name: str
) -> PreparedUpload:
    """The objects for the segment bytes at `base` of this broker's own store (a
    FileRange from store.open_bulk, or bytes read from it). The store's index and epoch
    file describe the bytes: no record is decoded here."""
    source = BytesSource(segment) if isinstance(segment, bytes) else segment
    end = base + source.length
    runs = store.index_runs_between(base, end)
    epochs = [(e, s) for e, s in store.epochs.entries if s < end]
    indexes = build_index_objects(runs, cluster=cluster, broker_name=broker_name)
    lineage_key, lineage = build_epoch_lineage(epochs, end, cluster=cluster, broker_name=broker_name)
    record_count = sum(len(packed) for _, packed in runs.values()) // INDEX_ENTRY_BYTES
    return PreparedUpload(
        base,
        record_count,
        epoch_covering(epochs, base),
        epochs[-1][0],
        segment_key(cluster, broker_name, base, end),
        source,
        [*indexes.items(), (lineage_key, lineage)],
        epochs,
    )


def write_upload(writes: UploadWrites | TieredBackend, upload: PreparedUpload) -> SegmentMeta:
    """Puts every object of `upload` and returns the segment's meta once all succeeded.

    The segment's bytes were never checked (store.open_bulk): they are copied to the
    store and checked there, as stored, before they are published (put_checked; the
    checks follow the copy as it progresses): framing and every record's CRC-32 (the
    check_whole_records loop, this thread), the record count against the store's index,
    and the object's CRC32C (another thread, the GIL released), all over the same
    memory. A corrupt record raises CorruptData and nothing is published at the
    segment's key; the index and lineage objects, put meanwhile by worker threads, stay
    unreachable garbage (readers follow only committed checkpoints; a retry replaces
    them, see _put_over_garbage) - corrupt bytes are never uploaded silently.
    """
    with ThreadPoolExecutor(max_workers=PUT_WORKERS_MAX, thread_name_prefix="tiered-put") as pool:
        puts = [pool.submit(writes.put, k, body) for k, body in upload.objects]

        def check(view: memoryview, ready: Ready) -> str:
            digest = pool.submit(_crc32c_following, view, ready)
            try:
                records = _check_records_following(view, ready, upload.base_offset)
            finally:
                wait_all([digest])
            if records != upload.record_count:
                raise CorruptData(
                    f"{upload.segment_key}: {records} records in the commit log, "
                    f"{upload.record_count} in the store's index"
                )
            return crc32c_checksum(digest.result())

        try:
            checksum = writes.put_checked(upload.segment_key, upload.segment, check)
        finally:
            wait_all(puts)
    for future in puts:
        future.result()
    return upload.meta(checksum)


def _check_records_following(view: memoryview, ready: Ready, base_offset: int) -> int:
    """check_whole_records over `view` as its bytes arrive: every record's framing and CRC-32;
    the number of records, or CorruptData."""
    length = len(view)
    position = available = records = 0
    for _ in range(2 * length // RECORD_STEP_BYTES + 4):  # bounded: each pass advances or waits
        if available < length and available - position < RECORD_STEP_BYTES:
            available = ready(position + RECORD_STEP_BYTES)
        found: list[int] = []
        stop = min(available, position + RECORD_STEP_BYTES + RECORD_BYTES_MAX)
        reached = valid_run(view[:stop], position, found)  # type: ignore[arg-type]
        records += len(found)
        if reached == position and stop == available:  # nothing more to read here
            if available == length:
                break
            available = ready(available + 1)
        position = reached
    if position != length:  # names what is wrong there (CorruptData)
        check_whole_records(view[position:], base_offset + position)  # type: ignore[arg-type]
        raise AssertionError(f"no record error found at {base_offset + position}")
    return records


def _crc32c_following(view: memoryview, ready: Ready) -> int:
    """CRC32C of `view` as its bytes arrive (the GIL is released while it runs)."""
    value = done = 0
    for _ in range(len(view) // CHECK_STEP_BYTES + 2):  # bounded like the records' check
        if done == len(view):
            break
        available = ready(done + CHECK_STEP_BYTES)
        value = crc32c(view[done:available], value)
        done = available
    return value


# The checks follow the copy in steps: the CRC32C thread in steps of the copy's, the records'
# check (which holds the GIL) in smaller ones. Measured on 64 MiB ranges (2 busy cores): the
# copy waits for the GIL between its steps, so smaller steps (4 MiB copies, 1 MiB checks,
# even yielding the GIL after each) were slower; 16/4 MiB overlapped best, about level with
# copying everything first and checking afterwards.
CHECK_STEP_BYTES = 16 << 20
RECORD_STEP_BYTES = 4 << 20


def bootstrap_from_tiered(
    host: BrokerHost, tiered_url: str, master_min_offset: int, still_current: Callable[[], bool]
) -> None:
    """A slave whose next offset the master no longer holds copies the tiered range.

    Segments are verified (size and checksum) and appended like replicated bytes, so the
    store rebuilds its index, epoch entries and consumer offsets from the records.
    Stopping half-way is safe: the next handshake starts from wherever the log ends.
    """
    if not tiered_url:
        raise FailedPrecondition(
            "the master no longer holds this slave's next offset and this "
            "broker has no --tiered-store to bootstrap from"
        )
    backend = open_backend(tiered_url)
    checkpoint = host.call_controller(
        "GetTieredCheckpoint", cpb.BrokerSetRef(cluster=host.cluster, broker_name=host.broker_name)
    )
    store = host.store
    if checkpoint.uploaded_offset < master_min_offset:
        raise FailedPrecondition(
            f"the tiered store ends at {checkpoint.uploaded_offset} but the "
            f"master's log starts at {master_min_offset}: cannot bootstrap"
        )
    start = store.max_offset
    log.info("bootstrapping [%d, %d) from the tiered store", start, checkpoint.uploaded_offset)
    for segment in sorted(checkpoint.segments, key=lambda s: s.base_offset):
        if segment.end_offset <= store.max_offset:
            continue
        if not still_current():
            log.info("bootstrap stopped at %d: the master changed", store.max_offset)
            return
        if segment.base_offset > store.max_offset:
            raise FailedPrecondition(f"the tiered store has no segment at {store.max_offset}")
        data = backend.get(segment.key)  # without the host's lock: it may be large and slow
        if len(data) != segment.size or not checksum_matches(data, segment.sha256):
            raise CorruptData(f"tiered segment {segment.key} does not match its checksum")
        offset = store.max_offset
        for piece in _pieces(data[offset - segment.base_offset :], BOOTSTRAP_APPEND_BYTES):
            with host.lock:
                if not still_current():
                    log.info("bootstrap stopped at %d: the master changed", offset)
                    return
                store.append_replicated(offset, piece)
            offset += len(piece)
    log.info("bootstrapped [%d, %d) from the tiered store", start, store.max_offset)


BOOTSTRAP_APPEND_BYTES = 4 << 20


def _pieces(data: bytes, size: int) -> list[bytes]:
    """Splits whole records into runs of at most `size` bytes (a larger record alone)."""
    from mqmeta.formats.records import peek_length

    pieces, start, position = [], 0, 0
    while position < len(data):
        length = peek_length(data, position, position)
        if position > start and position + length - start > size:
            pieces.append(data[start:position])
            start = position
        position += length
    if start < len(data):
        pieces.append(data[start:])
    return pieces
