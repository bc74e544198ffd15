#!/usr/bin/env python
"""Benchmark of the tiered uploader: upload throughput in-process, and promotion to first upload.

    .venv/bin/python -m bench.tiered_bench [--quick] [--only upload,promotion,defaults]

Prints ONE JSON document on stdout; progress goes to stderr. Phases:

upload      in-process, no cluster. A real MessageStore (fsync=True) filled with ~256 MiB
            (64 MiB with --quick) of 1 KiB-body messages over 4 queues (begin_epoch(1),
            put_messages in batches of 256). Then the uploader's own code
            (broker_agent.tiered: TieredUploader._upload without the controller RPCs
            TieredUploadStart and TieredCommit) is timed range by range for ranges of 4 MiB
            and of 64 MiB (the --tiered-upload-bytes default and maximum):
                store.open_bulk (a FileRange) -> prepare_upload (index objects sliced from
                the store's index; lineage) -> marker put -> write_upload (the kernel
                copies the range into the object's temporary file; every record's CRC-32
                and the object's CRC32C are checked over a map of it as the copy
                progresses and while it is fsynced; published only then) -> verify_stored
                (size only on a LocalBackend with fsync; CRC32C re-read when fsync is off)
            with the time of every step, once with a LocalBackend that fsyncs (as brokers
            run) and once without; "{size}_before" runs the pre-P11 write path in the same
            run (read_bulk into memory, CRC-32 pass + SHA-256, put from the buffer).
            paired_64MiB: each 64 MiB range copied with fsync and then uploaded, back to
            back, for both paths (the fairest same-run ratio on a machine whose writeback
            state drifts; a first small upload, not timed, creates the store's directories
            as a running broker has them); --profile adds py-spy (all threads) over both
            paths. Baselines in the same run, median of 3: shutil.copyfile
            of the store's commit-log segment files (the same bytes) to another directory,
            without and with fsync (file + directory). Target: upload >= 50 % of the copy,
            measured like for like: fsync upload vs copy + fsync (ratios "{size}_vs_copy_
            fsync"); "{size}_nofsync_vs_copy" pairs the page-cache variants and
            "{size}_vs_copy" the fsync upload with the plain copy.
promotion   a real cluster: 3 controllers, a nameserver, one broker set of 3 replicas with
            the flags of tests/test_tiered.py (upload every 8 KiB / 200 ms), topic with 4
            queues, a producer thread sending continuously. Once uploads happen, K rounds
            (5; 2 with --quick): kill -9 the master, then measure
              (a) fault -> a surviving broker reports writable (role MASTER of a newer
                  epoch and a valid lease; the time it first reports role MASTER, when
                  its uploader starts, is recorded too),
              (b) fault -> the checkpoint's checkpoint_epoch increases (first commit of the
                  new master),
              (c) (b) - (a): promotion -> first upload committed (it came out slightly
                  negative in some runs: on 2 busy cores the status poll of the new
                  master can lag its first commit by a few tens of ms);
            each survivor and the checkpoint are polled every 10 ms over their own
            channels, so the times are good to ~10-20 ms; the new master's own log gives
            (c) too ('master at epoch N' -> first 'uploaded [' line, ms timestamps);
            restart the killed broker and wait for a SyncStateSet of 3 between rounds.
defaults    (full run only) the same rounds (4) with the broker defaults for uploads
            (--tiered-upload-bytes 4 MiB, --tiered-upload-interval-ms 2000), to check how
            the upload interval bounds (c): before rounds 1 and 3 every survivor's process
            is at least 3 s old (older than the interval), rounds 2 and 4 follow the
            previous restore at once. Each round records the survivors' process ages.

Every loop is bounded in count and time, everything listens on 127.0.0.1, every child
process is stopped and the temporary directory removed on exit (also on exceptions,
SIGTERM and Ctrl-C); a watchdog ends the run with the JSON gathered so far if it
overruns its budget. Rates are MiB/s (2^20 bytes per second).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import (
    _r,
    _ratio,
    make_log,
    percentile,
    profile_start,
    profile_stop,
    run_main,
    seconds_summary,
    stop_clusters,
)

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# The broker processes run `python -m mqmeta.cli` and import broker_agent: make the repo
# importable for them whatever the working directory.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

MiB = 1 << 20
CLUSTER_NAME = "DefaultCluster"
BROKER_NAME = "broker-a"
TOPIC = "Orders"
QUEUES = 4
BODY_BYTES = 1024
PUT_BATCH = 256
UPLOAD_SIZES = {"4MiB": 4 * MiB, "64MiB": 64 * MiB}
TEST_FLAGS = [
    "--ha-max-time-slave-not-catchup-ms",
    "1500",
    "--send-timeout-ms",
    "3000",
    "--tiered-upload-bytes",
    "8192",
    "--tiered-upload-interval-ms",
    "200",
]
DEFAULT_FLAGS = ["--ha-max-time-slave-not-catchup-ms", "1500", "--send-timeout-ms", "3000"]
TARGETS = {"upload_vs_copy_min": 0.50}
COPY_TRIALS = 3  # per baseline, before and again after the upload runs
PROFILE_RATE_HZ = 200
WARMUP_BYTES = 64 << 10  # paired_run's first, untimed upload
PROFILE_REPEATS = 4
POLL_S = 0.01  # status and checkpoint polling period of the failover watchers


log = make_log("tiered-bench")


def mib_per_s(nbytes: int, seconds: float) -> float | None:
    return _r(nbytes / MiB / seconds, 2) if seconds > 0 else None


# Phase 1: upload throughput in-process ---------------------------------------------------


def fill_store(store_dir: Path, target_bytes: int, deadline: float) -> tuple[Any, dict[str, Any]]:
    from mqmeta.broker_agent.store import MessageStore

    from mqmeta.formats.records import Message

    store = MessageStore(store_dir, fsync=True, broker_name=BROKER_NAME)
    store.begin_epoch(1)
    body = bytes(range(256)) * (BODY_BYTES // 256)
    count = 0
    t0 = time.perf_counter()
    max_batches = target_bytes // (PUT_BATCH * BODY_BYTES) + 16
    for _ in range(max_batches):
        if store.max_offset >= target_bytes or time.monotonic() > deadline:
            break
        now_ms = int(time.time() * 1000)
        store.put_messages(
            [Message(topic=TOPIC, queue_id=(count + i) % QUEUES, body=body) for i in range(PUT_BATCH)],
            1,
            now_ms,
        )
        count += PUT_BATCH
    elapsed = time.perf_counter() - t0
    size = store.max_offset
    return store, {
        "messages": count,
        "body_bytes": BODY_BYTES,
        "queues": QUEUES,
        "batch": PUT_BATCH,
        "log_bytes": size,
        "record_bytes_avg": _r(size / count, 1) if count else None,
        "fill_s": _r(elapsed, 3),
        "fill_mib_per_s": mib_per_s(size, elapsed),
        "commitlog_files": len(list((store_dir / "commitlog").glob("*.log"))),
    }


STEPS = ["read", "prepare", "put_marker", "write_upload", "verify"]
PATHS = ("p11", "before")


def legacy_write_upload(backend: Any, upload: Any) -> Any:
    """The uploader's write before P11, kept here as the same-run "before": the segment read
    into memory (read_bulk), a CRC-32 pass over every record in this thread while workers
    compute a SHA-256 and put the segment from that buffer and the other objects."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import wait as wait_all

    from mqmeta.broker_agent.commitlog import check_whole_records

    from mqmeta.errors import CorruptData

    data = upload.segment.read()
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="tiered-put") as pool:
        digest = pool.submit(lambda: hashlib.sha256(data).hexdigest())
        objects = [(upload.segment_key, data), *upload.objects]
        puts = [pool.submit(backend.put, key, body) for key, body in objects]
        try:
            records = check_whole_records(data, upload.base_offset)
        finally:
            wait_all([digest, *puts])
    for future in puts:
        future.result()
    if records != upload.record_count:
        raise CorruptData("record count differs from the index")
    return upload.meta(digest.result())


def _upload_range(
    store: Any, backend: Any, position: int, limit: int, path: str
) -> tuple[list[float], int, int, int]:
    """One range of upload_run: the time marks between its steps (STEPS), and its record
    count, object count and stored size."""
    import uuid

    from mqmeta.broker_agent.tiered import prepare_upload, write_upload
    from mqmeta.broker_agent.tiered_objects import verify_stored

    from mqmeta.formats.tiered import upload_marker_key

    marks = [time.perf_counter()]
    with store.open_bulk(position, limit - position) as source:
        segment = source if path == "p11" else store.read_bulk(position, limit - position, check=False)
        marks.append(time.perf_counter())
        upload = prepare_upload(store, segment, position, cluster=CLUSTER_NAME, broker_name=BROKER_NAME)
        marks.append(time.perf_counter())
        backend.put(
            upload_marker_key(CLUSTER_NAME, BROKER_NAME, uuid.uuid4().hex),
            json.dumps({"keys": upload.keys(), "epoch": 1}).encode(),
        )
        marks.append(time.perf_counter())
        meta = write_upload(backend, upload) if path == "p11" else legacy_write_upload(backend, upload)
        marks.append(time.perf_counter())
    verify_stored(backend, meta)
    marks.append(time.perf_counter())
    return marks, meta.record_count, len(upload.objects), meta.size


def upload_run(
    store: Any,
    backend_dir: Path,
    range_bytes: int,
    deadline: float,
    fsync: bool = True,
    path: str = "p11",
    only: int | None = None,
) -> dict[str, Any]:
    """TieredUploader._upload's own code over the whole log, range by range, without the
    controller RPCs (TieredUploadStart, TieredCommit). path "p11" (today's uploader):
    store.open_bulk (a FileRange of the segment file) -> prepare_upload (index and lineage
    objects from the store's index) -> marker put -> write_upload (the kernel copies the
    range into the object's temporary file; every record's CRC-32 and the object's CRC32C
    are checked over a map of it while it is fsynced; then it is published) ->
    verify_stored (size only on a LocalBackend with fsync; CRC32C re-read without).
    path "before": read_bulk(check=False) into memory -> the same prepare and marker ->
    legacy_write_upload (the pre-P11 write: CRC-32 pass + SHA-256 + put from the buffer)
    -> verify_stored."""
    from mqmeta.broker_agent.tiered_backend import LocalBackend

    backend = LocalBackend(backend_dir, fsync=fsync)
    steps = dict.fromkeys(STEPS, 0.0)
    end_of_log = store.max_offset
    first = position = only or 0
    uploads, index_objects, records = 0, 0, 0
    per_upload: list[float] = []
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    truncated = False
    for _ in range(end_of_log // 4096 + 2):  # bounded
        if position >= end_of_log:
            break
        if time.monotonic() > deadline:
            truncated = True
            break
        limit = min(end_of_log, position + range_bytes)
        marks, record_count, objects, size = _upload_range(store, backend, position, limit, path)
        for step, (t0, t1) in zip(STEPS, zip(marks, marks[1:], strict=False), strict=True):
            steps[step] += t1 - t0
        per_upload.append(marks[-1] - marks[0])
        records += record_count
        index_objects += objects - 1
        uploads += 1
        position += size
        if only is not None:  # one range (paired_run)
            break
    counts = {
        "uploads": uploads,
        "bytes": position - first,
        "records": records,
        "index_objects": index_objects,
    }
    return _run_summary(
        {"path": path, "range_bytes": range_bytes, "fsync": fsync, **counts},
        steps,
        per_upload,
        time.perf_counter() - wall0,
        time.process_time() - cpu0,
        truncated,
    )


def _run_summary(
    head: dict[str, Any],
    steps: dict[str, float],
    per_upload: list[float],
    wall: float,
    cpu: float,
    truncated: bool,
) -> dict[str, Any]:
    total = sum(steps.values())
    return {
        **head,
        "elapsed_s": _r(wall, 3),
        "mib_per_s": mib_per_s(head["bytes"], wall),
        "cpu_s": _r(cpu, 3),
        "cpu_share_of_wall": _r(cpu / wall, 3) if wall else None,
        "per_upload_p50_s": _r(percentile(per_upload, 50), 4),
        "per_upload_max_s": _r(max(per_upload), 4) if per_upload else None,
        "steps_s": {k: _r(v, 3) for k, v in steps.items()},
        "steps_share": {k: _r(v / total, 3) if total else None for k, v in steps.items()},
        "dominant_step": max(steps, key=steps.get) if total else None,
        "truncated_by_deadline": truncated,
    }


def cost_breakdown(store: Any, sample_bytes: int) -> dict[str, Any]:
    """The per-byte costs of an upload on a sample range: the raw pread of the segment
    file, store.read_bulk(check=False) (pread of whole records), the CRC-32 pass over
    every record alone (check_whole_records), SHA-256 (before P11) and CRC32C (since)."""
    import hashlib

    from mqmeta.broker_agent.commitlog import check_whole_records

    from mqmeta.formats.checksum import crc32c

    path = sorted((Path(store.directory) / "commitlog").glob("*.log"))[0]
    timings: dict[str, float] = {}
    t = time.perf_counter()
    with open(path, "rb") as f:
        raw = os.pread(f.fileno(), sample_bytes, 0)
    timings["pread_only"] = time.perf_counter() - t
    t = time.perf_counter()
    data = store.read_bulk(0, min(store.max_offset, sample_bytes), check=False)
    timings["read_bytes_unchecked"] = time.perf_counter() - t
    t = time.perf_counter()
    check_whole_records(data, 0)
    timings["crc_pass"] = time.perf_counter() - t
    t = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    timings["sha256"] = time.perf_counter() - t
    t = time.perf_counter()
    crc32c(data)
    timings["crc32c"] = time.perf_counter() - t
    return {
        "sample_bytes": len(data),
        "raw_bytes": len(raw),
        "seconds": {k: _r(v, 4) for k, v in timings.items()},
        "mib_per_s": {k: mib_per_s(len(data), v) for k, v in timings.items()},
    }


def copy_baseline(store_dir: Path, dest: Path, fsync: bool) -> dict[str, Any]:
    from mqmeta.formats.atomic import fsync_dir

    files = sorted((store_dir / "commitlog").glob("*.log"))
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    t0 = time.perf_counter()
    for path in files:
        target = dest / path.name
        shutil.copyfile(path, target)
        if fsync:
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        total += path.stat().st_size
    if fsync:
        fsync_dir(dest)
    elapsed = time.perf_counter() - t0
    return {
        "files": len(files),
        "bytes": total,
        "elapsed_s": _r(elapsed, 3),
        "mib_per_s": mib_per_s(total, elapsed),
        "fsync": fsync,
    }


def run_variants(store: Any, root: Path, deadline: float, runs: dict[str, Any]) -> None:
    """fsync on both sides (the uploader's LocalBackend fsyncs every object) is the like-
    for-like pair; the no-fsync upload beside the plain copy is the other pair. "_before"
    runs are the pre-P11 write path (legacy_write_upload), same run."""
    variants = [(label, size, True, "p11") for label, size in UPLOAD_SIZES.items()]
    variants += [(f"{label}_before", size, True, "before") for label, size in UPLOAD_SIZES.items()]
    variants += [(f"{label}_nofsync", size, False, "p11") for label, size in UPLOAD_SIZES.items()]
    for name, size, fsync, path in variants:
        log(f"upload: {name}: ranges of {size // MiB} MiB, fsync {fsync}, path {path}")
        backend_dir = root / f"tiered-{name}"
        runs[name] = upload_run(store, backend_dir, size, deadline, fsync=fsync, path=path)
        shutil.rmtree(backend_dir, ignore_errors=True)
        log(
            f"upload: {name}: {runs[name]['mib_per_s']} MiB/s, dominant step "
            f"{runs[name]['dominant_step']} ({runs[name]['steps_share']})"
        )


def paired_run(store: Any, root: Path, range_bytes: int, path: str, deadline: float) -> dict[str, Any]:
    """Each range twice, back to back: copied with fsync (os.copy_file_range of the same
    bytes of the segment file into a new file, fsync of the file and of its directory: what
    the copy baseline does) and then uploaded (upload_run's steps, fsync on). The machine's
    writeback state drifts during a run (other processes write too), so pairing each
    upload with a copy of the same bytes made just before it compares like with like;
    ratio = total copy time / total upload time."""
    from mqmeta.broker_agent.commitlog import COPY_CHUNK_BYTES

    from mqmeta.formats.atomic import fsync_dir

    copy_dir = root / f"paired-copy-{path}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    backend_dir = root / f"paired-{path}"
    warm = upload_run(store, backend_dir, WARMUP_BYTES, deadline, path=path, only=0)  # makes the dirs
    copy_s = upload_s = 0.0
    position, pairs = warm["bytes"], 0
    for _ in range(store.max_offset // 4096 + 2):  # bounded
        if position >= store.max_offset or time.monotonic() > deadline:
            break
        with store.open_bulk(position, min(range_bytes, store.max_offset - position)) as source:
            length = source.length
            t0 = time.perf_counter()
            fd = os.open(copy_dir / f"{position:020d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                copied = 0
                while copied < length:
                    count = min(COPY_CHUNK_BYTES, length - copied)
                    copied += os.copy_file_range(source.fd, fd, count, source.position + copied, copied)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(copy_dir)
            copy_s += time.perf_counter() - t0
        one = upload_run(
            store, root / f"paired-{path}-{position}", range_bytes, deadline, path=path, only=position
        )
        shutil.rmtree(root / f"paired-{path}-{position}", ignore_errors=True)
        upload_s += one["elapsed_s"]
        position += one["bytes"]
        pairs += 1
    shutil.rmtree(copy_dir, ignore_errors=True)
    shutil.rmtree(backend_dir, ignore_errors=True)
    position -= warm["bytes"]
    return {
        "path": path,
        "range_bytes": range_bytes,
        "pairs": pairs,
        "bytes": position,
        "copy_fsync_s": _r(copy_s, 3),
        "upload_s": _r(upload_s, 3),
        "copy_fsync_mib_per_s": mib_per_s(position, copy_s),
        "upload_mib_per_s": mib_per_s(position, upload_s),
        "upload_vs_copy_fsync": _r(copy_s / upload_s, 4) if upload_s else None,
    }


def measure_copies(root: Path, trials: dict[str, list[dict[str, Any]]], when: str) -> None:
    for fsync in (False, True):
        name = "copy_fsync" if fsync else "copy"
        for i in range(COPY_TRIALS):
            dest = root / f"{name}-{when}-{i}"
            trials[name].append(copy_baseline(root / "store", dest, fsync))
            shutil.rmtree(dest, ignore_errors=True)


def profile_uploads(store: Any, root: Path, deadline: float) -> dict[str, Any]:
    """py-spy on this process (all threads, 200 Hz) while each path uploads the log in
    64 MiB ranges PROFILE_REPEATS times (fsync on): where the time goes, self and
    inclusive. Separate from the measured runs (sampling costs CPU here)."""
    out: dict[str, Any] = {"rate_hz": PROFILE_RATE_HZ, "repeats": PROFILE_REPEATS}
    for path in PATHS:
        target = root / f"pyspy-{path}.txt"
        spy = profile_start(os.getpid(), target, rate_hz=PROFILE_RATE_HZ)
        time.sleep(0.5)  # py-spy attaches
        try:
            for i in range(PROFILE_REPEATS):
                backend_dir = root / f"tiered-profile-{path}-{i}"
                upload_run(store, backend_dir, UPLOAD_SIZES["64MiB"], deadline, path=path)
                shutil.rmtree(backend_dir, ignore_errors=True)
        finally:
            out[path] = profile_stop(spy, target, top=15)
    return out


def upload_phase(
    root: Path, args: argparse.Namespace, deadline: float, out: dict[str, Any]
) -> dict[str, Any]:
    from mqmeta.broker_agent.commitlog import BULK_READ_BYTES_MAX as READ_BYTES_MAX
    from mqmeta.broker_agent.commitlog import SEGMENT_BYTES_DEFAULT

    from mqmeta.errors import MqmetaError

    target = (64 if args.quick else 256) * MiB
    out["loadavg_before"] = os.getloadavg()
    log(f"upload: filling a MessageStore (fsync=True) with {target // MiB} MiB")
    store, out["store"] = fill_store(root / "store", target, deadline)
    try:
        out["store"]["commitlog_segment_bytes"] = SEGMENT_BYTES_DEFAULT
        log(
            f"upload: {out['store']['log_bytes'] / MiB:.1f} MiB, {out['store']['messages']} "
            f"messages in {out['store']['fill_s']} s"
        )
        # The uploader reads its range with one store.read_bulk call.
        try:
            got = store.read_bulk(0, min(64 * MiB, store.max_offset))
            single = {"ok": True, "bytes": len(got)}
            del got
        except MqmetaError as exc:
            single = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out["uploader_single_read_of_64MiB"] = dict(single, read_bytes_max=READ_BYTES_MAX)
        # Baselines before and after the uploads (the store's files are in the page cache
        # for every variant; the disk's writeback state drifts during a run)
        trials: dict[str, list[dict[str, Any]]] = {"copy": [], "copy_fsync": []}
        measure_copies(root, trials, "before")
        out["cost_breakdown"] = cost_breakdown(store, 16 * MiB)
        runs: dict[str, Any] = {}
        out["upload"] = runs  # filled as it goes (an interrupted run keeps what it has)
        run_variants(store, root, deadline, runs)
        measure_copies(root, trials, "after")
        for name, done in trials.items():
            median = sorted(done, key=lambda c: c["elapsed_s"])[len(done) // 2]
            out[name] = dict(
                median,
                trials_mib_per_s=[c["mib_per_s"] for c in done],
                reported=f"median of the {len(done)} trials, half before and half after the uploads",
            )
            log(f"upload: baseline {name}: {out[name]['mib_per_s']} MiB/s")
        ratios = {}
        for name, run in runs.items():
            ratios[f"{name}_vs_copy"] = _ratio(run["mib_per_s"], out["copy"]["mib_per_s"], 4)
            ratios[f"{name}_vs_copy_fsync"] = _ratio(run["mib_per_s"], out["copy_fsync"]["mib_per_s"], 4)
        out["ratios"] = ratios
        paired: dict[str, Any] = {}
        out["paired_64MiB"] = paired  # filled as it goes
        for path in PATHS:
            log(f"upload: paired copy+fsync / upload of each 64 MiB range, path {path}")
            paired[path] = paired_run(store, root, UPLOAD_SIZES["64MiB"], path, deadline)
            log(f"upload: paired {path}: ratio {paired[path]['upload_vs_copy_fsync']}")
        if args.profile:
            out["profile"] = profile_uploads(store, root, deadline)
        out["target_measured_against"] = (
            "copy_fsync: the uploader fsyncs every object (LocalBackend fsync=True), so the "
            "like-for-like baseline is shutil.copyfile + fsync of the same segment files; "
            "{size}_nofsync_vs_copy is the page-cache pair, {size}_vs_copy the mixed one"
        )
        out["loadavg_after"] = os.getloadavg()
        out["peak_rss_mib"] = _r(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    finally:
        store.close()
        shutil.rmtree(root / "store", ignore_errors=True)
    return out


# Phase 2: promotion to first upload ------------------------------------------------------

CLUSTERS: list[Any] = []


class Load(threading.Thread):
    """A producer sending small batches continuously; remembers when acks arrived."""

    def __init__(self, namesrv: str, max_sends: int = 200_000) -> None:
        super().__init__(daemon=True, name="load")
        from mqmeta.broker_client import Producer

        self.producer = Producer(namesrv, timeout_s=5.0)
        self.stop_event = threading.Event()
        self.max_sends = max_sends
        self.acked = 0
        self.failed = 0
        self.last_ack = 0.0
        self.lock = threading.Lock()
        # (send started, acked) monotonic times of each acknowledged send (bounded below)
        self.acks: list[tuple[float, float]] = []

    def run(self) -> None:
        from mqmeta.errors import MqmetaError

        for i in range(self.max_sends):
            if self.stop_event.is_set():
                break
            started = time.monotonic()
            try:
                self.producer.send(TOPIC, [f"v{i}-{k}".encode() * 8 for k in range(4)])
                now = time.monotonic()
                with self.lock:
                    self.acked += 4
                    self.last_ack = now
                    if len(self.acks) < 400_000:
                        self.acks.append((started, now))
            except MqmetaError:
                self.failed += 1
                self.stop_event.wait(0.02)

    def first_ack_after(self, t: float) -> float | None:
        """When the first send started after `t` was acknowledged (a send in flight at `t`
        may still be acknowledged by the old master)."""
        import bisect

        with self.lock:
            i = bisect.bisect_right(self.acks, (t, float("inf")))
            return self.acks[i][1] if i < len(self.acks) else None

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=15)
        self.producer.close()


def get_checkpoint(client: Any, timeout_s: float = 2.0):
    from mqmeta.pb import controller_pb2 as pb

    return client.get_tiered_checkpoint(
        pb.BrokerSetRef(cluster=CLUSTER_NAME, broker_name=BROKER_NAME),
        timeout_s=timeout_s,
    )


def wait_in_sync(cluster: Any, members: int, timeout_s: float) -> str:
    """The master once its SyncStateSet has `members` brokers (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            master = cluster.master_of(BROKER_NAME, timeout_s=min(5.0, max(0.5, deadline - time.monotonic())))
            if len(cluster.broker_status(master).sync_state_set) == members:
                return master
        except Exception:  # MqmetaError, gRPC errors while a broker restarts
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the SyncStateSet never reached {members} members in {timeout_s}s")


def wait_uploads(client: Any, at_least_commits: int, timeout_s: float) -> Any:
    """Waits until `at_least_commits` checkpoint commits have happened (by segment count)."""
    deadline = time.monotonic() + timeout_s
    current = get_checkpoint(client)
    start = len(current.segments)
    while time.monotonic() < deadline:
        current = get_checkpoint(client)
        if len(current.segments) >= start + at_least_commits and current.uploaded_offset > 0:
            return current
        time.sleep(0.05)
    raise TimeoutError(
        f"no {at_least_commits} uploads within {timeout_s}s (uploaded {current.uploaded_offset})"
    )


def _settle_before_fault(started_at: dict[str, float], survivors: list[str], settle_age_s: float) -> None:
    """Waits until every survivor's process is `settle_age_s` old (its uploader's age
    clock, last_upload, starts with the process), and lets a steady state of uploads run
    so the kill lands anywhere in the upload cycle."""
    youngest = max(started_at[n] for n in survivors)
    settle = max(0.3, settle_age_s - (time.monotonic() - youngest))
    time.sleep(min(settle, 10.0))


def _watch_survivor(
    cluster: Any,
    name: str,
    old_epoch: int,
    timeout_s: float,
    stop: threading.Event,
    found: dict[str, Any],
    found_lock: threading.Lock,
) -> None:
    """Polls one survivor over its own channel: when it first reports role MASTER of a
    newer epoch (the uploader runs from then on) and when it is writable (MASTER and a
    valid lease: it accepts sends)."""
    import grpc

    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(cluster.broker(name).grpc) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        while time.monotonic() < deadline and not stop.is_set() and "writable_at" not in found:
            try:
                status = stub.GetHaStatus(broker_pb2.HaStatusRequest(), timeout=0.5)
            except grpc.RpcError:
                time.sleep(POLL_S)
                continue
            now = time.monotonic()
            if status.role == "MASTER" and status.master_epoch > old_epoch:
                with found_lock:
                    found.setdefault("master_role_at", now)
                    if status.writable and "writable_at" not in found:
                        found["writable_at"] = now
                        found["new_master"] = name
                        found["new_epoch"] = status.master_epoch
                        return
            time.sleep(POLL_S)


def _watch_checkpoint(
    cluster: Any, before: Any, timeout_s: float, stop: threading.Event, found: dict[str, Any]
) -> None:
    """Polls the controller over its own client until the tiered checkpoint's epoch moves
    past `before`: the first commit of the new master."""
    from mqmeta.client import ControllerClient

    deadline = time.monotonic() + timeout_s
    with ControllerClient([n.grpc for n in cluster.layout.controllers], timeout_s=2.0) as own:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                current = get_checkpoint(own, 1.0)
            except Exception:
                time.sleep(0.02)
                continue
            if current.checkpoint_epoch > before.checkpoint_epoch:
                found["committed_at"] = time.monotonic()
                found["checkpoint_epoch"] = current.checkpoint_epoch
                found["uploaded_after"] = current.uploaded_offset
                found["first_new_segment"] = next(
                    (
                        [s.base_offset, s.end_offset]
                        for s in current.segments
                        if s.base_offset >= before.uploaded_offset
                    ),
                    None,
                )
                return
            time.sleep(POLL_S)


def _kill_and_watch(
    cluster: Any, old: str, old_epoch: int, survivors: list[str], before: Any, timeout_s: float
) -> tuple[float, dict[str, Any]]:
    """kill -9 the master with one watcher thread per survivor and one on the checkpoint;
    the fault's time and what the watchers found."""
    found: dict[str, Any] = {}
    found_lock = threading.Lock()
    stop = threading.Event()
    watchers = [
        threading.Thread(
            target=_watch_survivor,
            args=(cluster, name, old_epoch, timeout_s, stop, found, found_lock),
            daemon=True,
        )
        for name in survivors
    ]
    watchers.append(
        threading.Thread(
            target=_watch_checkpoint, args=(cluster, before, timeout_s, stop, found), daemon=True
        )
    )
    fault = time.monotonic()
    cluster.kill(old)
    for w in watchers:
        w.start()
    for w in watchers:
        w.join(timeout_s + 5)
    stop.set()
    return fault, found


def _fault_timings(found: dict[str, Any], fault: float, started_at: dict[str, float]) -> dict[str, Any]:
    """The intervals between the fault and what the watchers found."""
    out: dict[str, Any] = {}
    if "writable_at" in found:
        out["fault_to_writable_s"] = _r(found["writable_at"] - fault, 4)
    if "committed_at" in found:
        out["fault_to_first_commit_s"] = _r(found["committed_at"] - fault, 4)
    if "master_role_at" in found:
        out["fault_to_master_role_s"] = _r(found["master_role_at"] - fault, 4)
    if "writable_at" in found and "committed_at" in found:
        out["promotion_to_first_commit_s"] = _r(found["committed_at"] - found["writable_at"], 4)
    if "master_role_at" in found and "committed_at" in found:
        out["master_role_to_first_commit_s"] = _r(found["committed_at"] - found["master_role_at"], 4)
    if "new_master" in found and found["new_master"] in started_at:
        # the uploader's age clock (last_upload) starts with the process
        out["new_master_process_age_at_promotion_s"] = _r(
            found["writable_at"] - started_at[found["new_master"]], 3
        )
    return out


def _restore_killed(cluster: Any, old: str, started_at: dict[str, float]) -> float:
    """Restarts the killed broker and waits for a SyncStateSet of 3; the seconds taken."""
    t = time.monotonic()
    cluster.start_broker(old)
    started_at[old] = time.monotonic()
    wait_in_sync(cluster, 3, timeout_s=30)
    return _r(time.monotonic() - t, 3)


def failover_round(
    cluster: Any,
    client: Any,
    load: Load,
    started_at: dict[str, float],
    timeout_s: float,
    settle_age_s: float = 0.0,
) -> dict[str, Any]:
    """kill -9 the master; (a) fault -> new master writable, (b) fault -> first commit
    of the new master, (c) = (b) - (a)."""
    old = wait_in_sync(cluster, 3, timeout_s=30)
    old_status = cluster.broker_status(old)
    survivors = [b.name for b in cluster.layout.brokers if b.name != old]
    _settle_before_fault(started_at, survivors, settle_age_s)
    before = get_checkpoint(client)
    result: dict[str, Any] = {
        "old_master": old,
        "old_epoch": old_status.master_epoch,
        "survivor_process_ages_at_fault_s": {n: _r(time.monotonic() - started_at[n], 2) for n in survivors},
        "checkpoint_epoch_before": before.checkpoint_epoch,
        "uploaded_before": before.uploaded_offset,
    }
    fault, found = _kill_and_watch(cluster, old, old_status.master_epoch, survivors, before, timeout_s)
    result.update({k: v for k, v in found.items() if not k.endswith("_at")})
    result.update(_fault_timings(found, fault, started_at))
    first_ack = load.first_ack_after(fault)
    if first_ack is not None:  # of a send started after the fault
        result["fault_to_first_send_ack_s"] = _r(first_ack - fault, 4)
    if "new_master" in found:
        result.update(broker_log_promotion_to_upload(cluster, found["new_master"], found["new_epoch"]) or {})
    if "new_epoch" in found and "checkpoint_epoch" in found:
        result["commit_by_new_master"] = found["checkpoint_epoch"] == found["new_epoch"]
    result["restart_to_in_sync_s"] = _restore_killed(cluster, old, started_at)
    return result


ROUND_KEYS = (
    "fault_to_master_role_s",
    "fault_to_writable_s",
    "fault_to_first_commit_s",
    "promotion_to_first_commit_s",
    "master_role_to_first_commit_s",
    "master_log_to_upload_log_s",
    "fault_to_first_send_ack_s",
)


def summarize_rounds(out: dict[str, Any]) -> None:
    rounds_done = out.get("rounds", [])
    for key in ROUND_KEYS:
        out[key] = seconds_summary([r[key] for r in rounds_done if r.get(key) is not None], with_p99=False)
    out["failed_rounds"] = sum(1 for r in rounds_done if r.get("promotion_to_first_commit_s") is None)


def broker_log_promotion_to_upload(cluster: Any, name: str, epoch: int) -> dict[str, Any] | None:
    """From the new master's own log (asctime, ms): 'master at epoch N' -> the first
    'uploaded [' line after it (logged right after TieredCommit returned)."""
    from datetime import datetime

    path = cluster.root / "logs" / f"{name}.log"

    def stamp(line: str) -> float | None:
        try:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            return None

    for _ in range(20):  # bounded: the lines may still be on their way to the file
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return None
        promoted = uploaded = None
        for line in lines:
            if promoted is None and f"master at epoch {epoch} from offset" in line:
                promoted = stamp(line)
            elif promoted is not None and "uploaded [" in line:
                uploaded = stamp(line)
                break
        if promoted is not None and uploaded is not None:
            return {"master_log_to_upload_log_s": _r(uploaded - promoted, 3)}
        time.sleep(0.05)
    return None


def _controller_liveness() -> dict[str, Any]:
    """The controller liveness settings the promotion phase runs with, and the defaults."""
    from mqmeta.controller.state_machine import CONFIG_SCHEMA

    liveness = ("broker_heartbeat_interval_ms", "broker_dead_after_ms", "lease_ms")
    return {
        "used": "mqmeta.harness.Cluster.configure_controller: heartbeat 200 ms, dead after "
        "1000 ms, lease 500 ms (margin 200 ms)",
        "controller_defaults_ms": {k: CONFIG_SCHEMA[k][1] for k in liveness},
    }


def _failover_rounds(
    cluster: Any,
    client: Any,
    load: Load,
    started_at: dict[str, float],
    rounds: int,
    label: str,
    deadline: float,
    settle_every_other_s: float,
    results: list[dict[str, Any]],
) -> None:
    """Up to `rounds` failover rounds (every other one settled), appended to `results` as
    they finish, until `deadline`."""
    for i in range(rounds):
        if time.monotonic() > deadline:
            log(f"{label}: out of time before round {i + 1}")
            break
        log(f"{label}: round {i + 1}/{rounds}: kill -9 the master")
        settle = settle_every_other_s if i % 2 == 0 else 0.0
        r = failover_round(cluster, client, load, started_at, timeout_s=30, settle_age_s=settle)
        results.append(r)
        log(
            f"{label}: round {i + 1}: writable {r.get('fault_to_writable_s')} s, "
            f"first commit {r.get('fault_to_first_commit_s')} s, promotion->commit "
            f"{r.get('promotion_to_first_commit_s')} s, restored "
            f"{r.get('restart_to_in_sync_s')} s"
        )


def promotion_phase(
    root: Path,
    flags: list[str],
    rounds: int,
    label: str,
    deadline: float,
    out: dict[str, Any],
    settle_every_other_s: float = 0.0,
) -> dict[str, Any]:
    from mqmeta.cluster.harness import Cluster

    from mqmeta.pb import controller_pb2 as pb

    out.update(
        {"broker_flags": flags, "rounds_planned": rounds, "controller_liveness": _controller_liveness()}
    )
    t0 = time.monotonic()
    cluster = Cluster(root, broker_sets=1, replicas=3, broker_flags=flags)
    CLUSTERS.append(cluster)
    log(f"{label}: starting 3 controllers, a nameserver and 3 brokers in {root}")
    out["loadavg_before"] = os.getloadavg()
    try:
        started = time.monotonic()
        cluster.start()
        started_at = {b.name: started for b in cluster.layout.brokers}
        with cluster.client() as client:
            client.create_topic(pb.TopicSpec(name=TOPIC, queue_count=QUEUES))
            master = wait_in_sync(cluster, 3, timeout_s=30)
            out["start_to_in_sync_s"] = _r(time.monotonic() - t0, 2)
            load = Load(cluster.namesrv)
            load.start()
            try:
                t = time.monotonic()
                first = wait_uploads(client, 2, timeout_s=30)
                out["load_to_two_uploads_s"] = _r(time.monotonic() - t, 3)
                log(f"{label}: uploads running (uploaded {first.uploaded_offset}, master {master})")
                out["rounds"] = []  # filled as it goes
                _failover_rounds(
                    cluster,
                    client,
                    load,
                    started_at,
                    rounds,
                    label,
                    deadline,
                    settle_every_other_s,
                    out["rounds"],
                )
                final = get_checkpoint(client)
                out["final_uploaded_offset"] = final.uploaded_offset
                out["final_segments"] = len(final.segments)
            finally:
                load.stop()
                out["load"] = {"acked_messages": load.acked, "failed_sends": load.failed}
        out["loadavg_after"] = os.getloadavg()
        out["poll_interval_s"] = POLL_S
        summarize_rounds(out)
    finally:
        log(f"{label}: stopping the cluster")
        cluster.stop()
        CLUSTERS.remove(cluster)
        shutil.rmtree(root, ignore_errors=True)
    return out


# Run -------------------------------------------------------------------------------------


def run(args: argparse.Namespace, root: Path, result: dict[str, Any], t_start: float) -> None:
    budget_end = t_start + args.budget_s
    if "upload" in args.phases:
        # leave time for the cluster phases
        share = 0.35 if args.quick else 0.40
        upload_phase(
            root / "upload",
            args,
            time.monotonic() + args.budget_s * share,
            result.setdefault("phase1_upload", {}),
        )
    if "promotion" in args.phases:
        rounds = args.rounds or (2 if args.quick else 5)
        out = result.setdefault("phase2_promotion", {"upload_bytes": 8192, "upload_interval_ms": 200})
        promotion_phase(
            root / "cluster",
            TEST_FLAGS,
            rounds,
            "promotion",
            budget_end - (25 if "defaults" in args.phases else 8),
            out,
        )
    if "defaults" in args.phases:
        # rounds 1, 3: every survivor older than interval + 1 s before the kill; rounds 2, 4:
        # right after the previous restore (the restarted broker is often the one promoted)
        out = result.setdefault("phase2_defaults", {"upload_bytes": 4 << 20, "upload_interval_ms": 2000})
        promotion_phase(
            root / "cluster-defaults",
            DEFAULT_FLAGS,
            args.default_rounds,
            "defaults",
            budget_end - 8,
            out,
            settle_every_other_s=3.0,
        )


def summarize(result: dict[str, Any]) -> None:
    from mqmeta.broker_agent.tiered import STEP_INTERVAL_S, TieredConfig

    defaults = TieredConfig(url="x")
    result["default_settings"] = {
        "tiered_upload_bytes": defaults.upload_bytes,
        "tiered_upload_interval_ms": defaults.upload_interval_ms,
        "uploader_step_interval_ms": int(STEP_INTERVAL_S * 1000),
        "used_in_phase2_promotion": {"tiered_upload_bytes": 8192, "tiered_upload_interval_ms": 200},
    }
    met: dict[str, Any] = {}
    findings: list[str] = []
    _summarize_upload(result, met, findings)
    for key in ("phase2_promotion", "phase2_defaults"):
        p2 = result.get(key)
        if p2 and p2.get("rounds"):
            _summarize_promotion(key, p2, findings)
    result["uploader_interval_note"] = (
        "TieredUploader.step uploads when pending >= upload_bytes or when upload_interval_ms "
        "has passed since self.last_upload; last_upload is set when the uploader is "
        "constructed (broker start) and after each of its own commits, and is not reset on "
        "promotion. A slave promoted more than one interval after its start is therefore "
        "already 'due': promotion -> first upload is bounded below by the 100 ms step, the "
        "GetTieredCheckpoint resume RPC and the upload itself (UploadStart + puts + verify + "
        "Commit), not by the interval; the interval bounds it only for a broker promoted "
        "within one interval of its own start (or when pending is 0). "
        "See promotion_to_first_commit_vs_interval for the measured samples: [promotion -> "
        "first commit, age of the new master's process at promotion] per round (the age is "
        "counted from the process launch; the uploader is built a little later)."
    )
    result["targets"] = TARGETS
    result["targets_met"] = met
    result["findings"] = findings


def _summarize_upload(result: dict[str, Any], met: dict[str, Any], findings: list[str]) -> None:
    """Phase 1: each upload size against a plain copy (with and without fsync), before and after P11."""
    p1 = result.get("phase1_upload", {})
    ratios = p1.get("ratios", {})
    for label in UPLOAD_SIZES:
        like = ratios.get(f"{label}_vs_copy_fsync")
        if like is not None:  # the target: both sides fsync
            met[f"upload_{label}_ge_50pct_of_copy_fsync"] = like >= TARGETS["upload_vs_copy_min"]
        cache = ratios.get(f"{label}_nofsync_vs_copy")
        if cache is not None:
            met[f"upload_{label}_nofsync_ge_50pct_of_copy"] = cache >= TARGETS["upload_vs_copy_min"]
    result["before_after_vs_copy_fsync"] = {
        label: {
            "before_p11": ratios.get(f"{label}_before_vs_copy_fsync"),
            "after": ratios.get(f"{label}_vs_copy_fsync"),
        }
        for label in UPLOAD_SIZES
    }
    paired = p1.get("paired_64MiB", {})
    result["before_after_vs_copy_fsync"]["64MiB_paired"] = {
        "before_p11": paired.get("before", {}).get("upload_vs_copy_fsync"),
        "after": paired.get("p11", {}).get("upload_vs_copy_fsync"),
    }
    if paired.get("p11", {}).get("upload_vs_copy_fsync") is not None:
        met["upload_64MiB_paired_ge_50pct_of_copy_fsync"] = (
            paired["p11"]["upload_vs_copy_fsync"] >= TARGETS["upload_vs_copy_min"]
        )
    runs = p1.get("upload", {})
    if runs:
        parts = [
            f"{name}: {run_['mib_per_s']} MiB/s (dominant {run_['dominant_step']})"
            for name, run_ in runs.items()
        ]
        findings.append(
            "upload: " + "; ".join(parts) + f"; plain copy {p1['copy']['mib_per_s']} "
            f"MiB/s, copy+fsync {p1['copy_fsync']['mib_per_s']} MiB/s"
        )
    single = p1.get("uploader_single_read_of_64MiB")
    if single and not single["ok"]:
        findings.append("store.read_bulk refused a 64 MiB read: " + single["error"][:120])


def _summarize_promotion(key: str, p2: dict[str, Any], findings: list[str]) -> None:
    """Phase 2: promotion -> first commit against the upload interval and the new master's age."""
    summarize_rounds(p2)
    c = p2["promotion_to_first_commit_s"]
    interval_s = p2["upload_interval_ms"] / 1000
    below = [s for s in c["samples_s"] if s is not None and s < interval_s]
    p2["promotion_to_first_commit_vs_interval"] = {
        "upload_interval_s": interval_s,
        "samples_below_interval": len(below),
        "samples": c["count"],
        "per_round_commit_s_and_new_master_process_age_s": [
            [r.get("promotion_to_first_commit_s"), r.get("new_master_process_age_at_promotion_s")]
            for r in p2.get("rounds", [])
        ],
    }
    role = p2.get("master_role_to_first_commit_s", {})
    old_young: dict[str, list[float]] = {"older": [], "younger": []}
    for r in p2.get("rounds", []):
        age, value = r.get("new_master_process_age_at_promotion_s"), r.get("promotion_to_first_commit_s")
        if age is not None and value is not None:
            old_young["older" if age >= interval_s + 1.0 else "younger"].append(value)
    p2["promotion_to_first_commit_by_new_master_age"] = {
        "older_than_interval_plus_1s": seconds_summary(old_young["older"], with_p99=False),
        "younger": seconds_summary(old_young["younger"], with_p99=False),
    }
    findings.append(
        f"{key}: promotion->first commit p50 "
        f"{_r(percentile(old_young['older'], 50))} s "
        f"when the new master's process was older than interval + 1 s "
        f"({len(old_young['older'])} rounds), "
        f"{_r(percentile(old_young['younger'], 50))}"
        f" s when younger ({len(old_young['younger'])} rounds)"
    )
    findings.append(f"{key}: role MASTER->first commit p50 {role.get('p50_s')} s (max {role.get('max_s')})")
    findings.append(
        f"{key}: fault->writable p50 {p2['fault_to_writable_s']['p50_s']} s "
        f"(max {p2['fault_to_writable_s']['max_s']}), fault->first commit p50 "
        f"{p2['fault_to_first_commit_s']['p50_s']} s (max "
        f"{p2['fault_to_first_commit_s']['max_s']}), promotion->first commit "
        f"p50 {c['p50_s']} s (max {c['max_s']}) with an upload interval of "
        f"{interval_s} s; {len(below)}/{c['count']} samples below the interval"
    )


def cleanup() -> None:
    stop_clusters(CLUSTERS, log)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--only", default="", help="comma list of phases: upload,promotion,defaults")
    p.add_argument("--rounds", type=int, default=0, help="failover rounds (default 5, quick 2)")
    p.add_argument("--default-rounds", type=int, default=4)
    p.add_argument("--profile", action="store_true", help="py-spy the upload paths (adds ~10 s)")
    args = p.parse_args(argv)
    phases = {"upload", "promotion"} | (set() if args.quick else {"defaults"})
    args.phases = set(args.only.split(",")) if args.only else phases
    args.budget_s = 50.0 if args.quick else 165.0
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqmeta-tiered-bench-"))
    result: dict[str, Any] = {
        "bench": "mqmeta tiered uploader",
        "quick": args.quick,
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "host": "127.0.0.1",
            "tmp": str(root.parent),
            "loadavg_before_start": os.getloadavg(),
        },
        "units": "MiB/s = 2^20 bytes per second; times in seconds (monotonic clock)",
    }
    return run_main(
        args,
        root,
        result,
        lambda t0: run(args, root, result, t0),
        summarize,
        cleanup,
        log,
        watchdog_grace_s=4.0,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
