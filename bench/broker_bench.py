#!/usr/bin/env python
"""Benchmark of a real broker set (1 master + 2 slaves) behind the mqmeta controller.

    .venv/bin/python -m bench.broker_bench [--quick] [--profile] [--keep]

Prints ONE JSON document on stdout; progress goes to stderr. Phases (--only picks some):

raw         the baseline: MessageStore(tmpdir, fsync=True).put_messages of the same
            batches of 1 KB records in this process (no network, no replication), per
            batch size; fsync=False as a reference; and the machine's ceiling for a set:
            one such append per replica (3), in parallel processes, nothing else;
micro       CPU microseconds per message of each step of the write path (request
            build, message conversion, record encoding, the commit log's re-check, the
            response, the slave's decode), timed in this process without I/O;
throughput  a broker set of 3 replicas, acks from the whole SyncStateSet (the default),
            a topic of 8 queues. Once the master's SyncStateSet has 3 members, T
            producer threads of this process (each its own Producer, so its own gRPC
            channel) send batches of B 1 KB messages for a fixed window, for T in
            --threads and B in --batches. Per run: messages/s, MB/s (bodies), p50/p99
            ack latency per batch, CPU% (and its system part) of the master, the slaves,
            the controllers, the nameserver and this process, CPU us per message, the
            CPU other processes used, and whether the SyncStateSet stayed the same (its
            epoch) all along: only such runs count ("valid_all_3_acked"). This cluster
            uses --ha-max-time-slave-not-catchup-ms --tp-not-catchup-ms (15000, the
            broker default) because with the tests' 1500 ms the slaves are dropped from
            the set under sustained load (see load_eviction_check);
failover    a second cluster with the tests' flags (FLAGS) and the harness's test
            liveness settings (Cluster.configure_controller). First a sustained-load run
            that reports whether and when the SyncStateSet shrank
            (load_eviction_check); then R rounds of SIGKILL of the master and R rounds
            of SIGSTOP of the master. A probe thread sends 4 x 100 B batches in a loop
            (route from the nameserver, per-attempt gRPC timeout --attempt-timeout-s,
            20 ms pause after a failure); the sample is the time from the fault to the
            first send acknowledged with a master_epoch above the old master's. After
            SIGKILL the broker is restarted from its data, after SIGSTOP it gets
            SIGCONT; the next round starts once the SyncStateSet has 3 members again.

Targets are reported, never tuned for: throughput >= 20,000 msg/s; failover p99 <= 1.5 s
(SIGKILL) and <= 3 s (SIGSTOP).

--profile adds, per process (master, slave1, bench), one throughput run (--profile-run
THREADS,BATCH) with py-spy attached to it (--gil: only the thread holding the GIL, i.e.
where Python CPU goes; --profile-all-threads samples waiting threads too), and reports
the hottest leaf frames and the inclusive share of the functions on the write path.

Every loop is bounded in count and time, everything listens on 127.0.0.1, and every
child process is stopped on exit (also on exceptions, SIGTERM and Ctrl-C); a watchdog
ends the run with the JSON gathered so far if it overruns its budget.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.benchlib import (
    REPO,
    CpuMeter,
    _ratio,
    latency_summary,
    machine_busy,
    machine_busy_percent,
    make_log,
    run_main,
    seconds_summary,
    wait_quiet,
)
from bench.brokerlib import (
    BODY_BYTES,
    BROKER_SET,
    CALLS_MAX_PER_THREAD,
    CONTROLLER_CONFIG,
    FLAGS,
    QUEUES,
    REPLICAS,
    TARGETS,
    TOPIC,
    all_pids,
    cleanup,
    failover_round,
    start_cluster,
    stop_cluster,
    throughput_run,
)

log = make_log("broker-bench")


# Phase 2: raw local append ------------------------------------------------------------------


def raw_append(
    root: Path, batch: int, duration_s: float, fsync: bool, start_at_wall: float | None = None
) -> dict[str, Any]:
    """`start_at_wall`: start at this time.time() (copies in other processes start together)."""
    from mqmeta.broker_agent.store import MessageStore

    from mqmeta.formats.records import Message

    directory = Path(tempfile.mkdtemp(prefix=f"raw-{batch}-", dir=root))
    store = MessageStore(directory, fsync=fsync, broker_name=BROKER_SET)
    try:
        store.begin_epoch(1)
        body = os.urandom(BODY_BYTES)
        producer_id = uuid.uuid4().hex[:16]
        seq = 0
        lats: list[float] = []
        queue = 0
        if start_at_wall is not None:
            time.sleep(max(0.0, start_at_wall - time.time()))
        cpu0 = time.process_time()
        t_start = time.monotonic()
        end_at = t_start + duration_s
        for _ in range(CALLS_MAX_PER_THREAD):
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            queue = (queue + 1) % QUEUES
            messages = []
            for _ in range(batch):
                seq += 1
                messages.append(
                    Message(topic=TOPIC, queue_id=queue, body=body, producer_id=producer_id, producer_seq=seq)
                )
            store.put_messages(messages, 1, int(time.time() * 1000))
            lats.append(time.monotonic() - t0)
        elapsed = time.monotonic() - t_start
        cpu = time.process_time() - cpu0
        total = len(lats) * batch
        return {
            "batch": batch,
            "fsync": fsync,
            "duration_s": round(elapsed, 3),
            "messages": total,
            "msgs_per_s": round(total / elapsed, 1),
            "mb_per_s": round(total * BODY_BYTES / elapsed / 1e6, 2),
            "put_latency": latency_summary(lats, with_min=False),
            "cpu_percent": round(100 * cpu / elapsed, 1),
            "bytes_per_record": round(store.max_offset / max(1, total), 1),
        }
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def raw_append_copies(root: Path, batch: int, duration_s: float, copies: int) -> dict[str, Any]:
    """The machine's ceiling for a replicated set: `copies` raw appends (one per replica,
    each in its own process, fsync on, its own directory) run at the same time, and
    nothing else: no client building messages, no gRPC, no fetches, no controllers. Each
    replica of a set must at least do this work for every message, so the slowest copy's
    rate over one raw append's rate bounds the set's ratio to raw append on this machine."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=copies, mp_context=mp.get_context("spawn")) as pool:
        start_at = time.time() + 3.0  # the children import the store meanwhile
        futures = [pool.submit(raw_append, root, batch, duration_s, True, start_at) for _ in range(copies)]
        runs = [f.result(timeout=duration_s + 60.0) for f in futures]
    rates = [r["msgs_per_s"] for r in runs]
    return {
        "batch": batch,
        "copies": copies,
        "msgs_per_s_each": rates,
        "msgs_per_s_slowest": min(rates),
        "cpu_percent_each": [r["cpu_percent"] for r in runs],
    }


# Per-record CPU cost of the steps of the write path (this process, no I/O) ----------------------


def _send_cost_steps(batch: int, store: Any) -> dict[str, Callable[[], Any]]:
    """The steps cost_breakdown times, by name, each over one batch of `batch` messages;
    `store` is an open MessageStore in epoch 1."""
    from mqmeta.broker_agent.service import check_sent_messages, send_response

    from mqmeta.formats.records import (
        check_record,
        encode_record,
        make_msg_id,
        scan_records,
        split_records,
    )
    from mqmeta.pb import broker_pb2 as bpb

    body = os.urandom(BODY_BYTES)
    producer_id = uuid.uuid4().hex[:16]
    now = int(time.time() * 1000)

    def client_request() -> bytes:
        msgs = [
            bpb.Message(topic=TOPIC, queue_id=1, body=body, producer_id=producer_id, producer_seq=i)
            for i in range(batch)
        ]
        return bpb.SendRequest(messages=msgs).SerializeToString()

    wire = client_request()
    request = bpb.SendRequest.FromString(wire)
    messages = list(request.messages)
    ids = [make_msg_id(BROKER_SET, i * 1200, 1) for i in range(batch)]
    records = [encode_record(m, 1, now, i, ids[i]) for i, m in enumerate(messages)]
    blob = b"".join(records)

    put_results = store.put_messages(messages, 1, now)

    def response() -> bytes:
        return send_response(1, put_results).SerializeToString()

    def master_send_path() -> bytes:
        """The master's Python work for one Send, minus gRPC and fsync: parse, check,
        put_messages (encode, append, index), build the response (service.py's own
        functions)."""
        parsed = bpb.SendRequest.FromString(wire)
        check_sent_messages(parsed.messages)
        return send_response(1, store.put_messages(parsed.messages, 1, now)).SerializeToString()

    return {
        "master_send_path_in_process (parse, convert, put without fsync, respond)": master_send_path,
        "client_build_and_serialize_request": client_request,
        "server_parse_request": lambda: bpb.SendRequest.FromString(wire),
        "service_message_check (check_sent_messages; before P11: a Message per record, ~1.1)": lambda: (
            check_sent_messages(request.messages)
        ),
        "make_msg_id (one sha256 per broker and epoch; before P11: one per message, ~0.57)": lambda: [
            make_msg_id(BROKER_SET, i * 1200, 1) for i in range(batch)
        ],
        "encode_record (incl. validation, crc32)": lambda: [
            encode_record(m, 1, now, i, ids[i]) for i, m in enumerate(messages)
        ],
        "commitlog_append_recheck (check_record; before P11, now skipped)": lambda: [
            check_record(r, 0, -1) for r in records
        ],
        "build_and_serialize_response": response,
        "slave_split_records (full decode; before P11)": lambda: split_records(blob, 0),
        "slave_scan_records (what the slave runs: checks, no StoredRecord)": lambda: scan_records(blob, 0),
        "slave_header_walk (crc + fixed header only)": lambda: _header_walk(blob),
    }


def cost_breakdown(batch: int, budget_s: float) -> dict[str, Any]:
    """Microseconds per 1 KB message of each CPU step a Send goes through, timed on
    batches of `batch` in this process: what the broker processes spend per message
    besides fsync and waiting."""
    from mqmeta.broker_agent.store import MessageStore

    store_dir = tempfile.mkdtemp(prefix="mqmeta-micro-")
    store = MessageStore(store_dir, fsync=False, broker_name=BROKER_SET)
    store.begin_epoch(1)
    steps = _send_cost_steps(batch, store)
    out: dict[str, Any] = {"batch": batch, "what": __doc_cost__}
    out.update(_cpu_us_per_message(steps, batch, budget_s))
    store.close()
    shutil.rmtree(store_dir, ignore_errors=True)
    return out


def _header_walk(blob: bytes) -> None:
    """What a slave needs at least: CRC + the fixed header of each record."""
    import zlib

    from mqmeta.formats.records import _FIXED, PREFIX_BYTES

    pos = 0
    view = memoryview(blob)
    while pos < len(blob):
        total = int.from_bytes(blob[pos + 3 : pos + 7], "little")
        zlib.crc32(view[pos + PREFIX_BYTES : pos + total])
        _FIXED.unpack_from(blob, pos + PREFIX_BYTES)
        pos += total


def _cpu_us_per_message(steps: dict[str, Any], batch: int, budget_s: float) -> dict[str, float]:
    """Each step's CPU microseconds per message: run for its share of `budget_s` (at least
    50 ms, at most 10,000 runs) after one warm-up run."""
    out: dict[str, float] = {}
    per_step = max(0.05, budget_s / len(steps))
    for name, fn in steps.items():
        fn()
        n = 0
        t0, cpu0 = time.perf_counter(), time.process_time()
        while n < 10_000:
            fn()
            n += 1
            if time.perf_counter() - t0 >= per_step:
                break
        # CPU time, not wall time: on a shared machine other processes stretch the latter
        out[name] = round((time.process_time() - cpu0) / n / batch * 1e6, 2)
    return out


__doc_cost__ = (
    "microseconds of CPU (process time) per message (1 KB body) of each step, this process, "
    "batches of the given size, no I/O"
)


# Main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter windows, 3+3 failover rounds")
    p.add_argument(
        "--only",
        default="raw,micro,throughput,failover",
        help="comma-separated phases: raw,micro,throughput,failover",
    )
    p.add_argument(
        "--tp-not-catchup-ms",
        type=int,
        default=15000,
        help="--ha-max-time-slave-not-catchup-ms of the throughput cluster",
    )
    p.add_argument(
        "--no-eviction-check",
        dest="eviction_check",
        action="store_false",
        help="skip the sustained-load run on the failover cluster (tests' flags)",
    )
    p.add_argument("--threads", default="4,8,16")
    p.add_argument("--batches", default="32,128")
    p.add_argument("--duration", type=float, default=None, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=None)
    p.add_argument("--rounds", type=int, default=None, help="failover rounds per fault kind")
    p.add_argument(
        "--attempt-timeout-s", type=float, default=0.3, help="per-attempt gRPC timeout of the failover probe"
    )
    p.add_argument("--budget-s", type=float, default=None)
    _add_profile_flags(p)
    _add_environment_flags(p)
    return _with_defaults(p.parse_args(argv))


def _add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true", help="py-spy one extra throughput run")
    p.add_argument("--profile-run", default="16,128", help="THREADS,BATCH of the profiled run")
    p.add_argument("--profile-native", action="store_true", help="py-spy --native")
    p.add_argument(
        "--profile-targets",
        default="master,slave1,bench",
        help="processes to profile, one run each: master, slave1, slave2, bench",
    )
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument(
        "--profile-all-threads",
        action="store_true",
        help="py-spy without --gil (waiting threads are sampled too)",
    )


def _add_environment_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument(
        "--fsync-delay-us",
        type=int,
        default=0,
        help="emulate a slower disk: every process of the run (raw append included) sleeps "
        "this long before each fsync/fdatasync (bench/slow_fsync.c, LD_PRELOAD; needs cc)",
    )
    p.add_argument(
        "--quiet-wait-s",
        type=float,
        default=None,
        help="before each throughput run, wait up to this long for the machine to "
        "be < 25%% busy (default 8, quick 2)",
    )
    p.add_argument(
        "--no-tiered",
        action="store_true",
        help="append --tiered-store '' to the brokers' flags (no tiered uploader) in "
        "case the harness configures one",
    )


def _with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed flags with the lists split and the defaults that depend on --quick."""
    args.phases = [x.strip() for x in args.only.split(",") if x.strip()]
    args.thread_counts = [int(x) for x in args.threads.split(",") if x]
    args.batch_sizes = [int(x) for x in args.batches.split(",") if x]
    if args.duration is None:
        args.duration = 1.5 if args.quick else 5.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 1.0
    if args.quiet_wait_s is None:
        args.quiet_wait_s = 2.0 if args.quick else 8.0
    if args.rounds is None:
        args.rounds = 3 if args.quick else 10
    if args.budget_s is None:
        args.budget_s = 85.0 if args.quick else 230.0
        if args.profile:
            args.budget_s += 40.0
    return args


def _log_run(label: str, r: dict[str, Any]) -> None:
    log(
        f"{label} {r['threads']} threads x batch {r['batch']}: {r['msgs_per_s']} msg/s "
        f"{r['mb_per_s']} MB/s, batch p50 {r['batch_ack_latency'].get('p50_ms')} ms "
        f"p99 {r['batch_ack_latency'].get('p99_ms')} ms, cpu {r['cpu_percent']}, "
        f"SSS min {r['sync_state_set_min_size_seen']} epochs {r['sync_state_set_epochs']} "
        f"valid {r['valid_all_3_acked']}, errors {r['errors']}"
    )


def _phase_raw(
    args: argparse.Namespace, root: Path, result: dict[str, Any], remaining: Callable[[], float]
) -> None:
    raw: dict[str, Any] = {"fsync": [], "no_fsync_reference": []}
    raw_s = 1.0 if args.quick else 2.0
    raw["before_phase"] = wait_quiet(args.quiet_wait_s)
    for batch in args.batch_sizes:
        r = raw_append(root, batch, raw_s, fsync=True)
        raw["fsync"].append(r)
        log(
            f"raw append batch {batch} fsync: {r['msgs_per_s']} msg/s {r['mb_per_s']} MB/s "
            f"put p50 {r['put_latency'].get('p50_ms')} ms"
        )
        r = raw_append(root, batch, raw_s / 2, fsync=False)
        raw["no_fsync_reference"].append(r)
        log(f"raw append batch {batch} no fsync: {r['msgs_per_s']} msg/s")
        r = raw_append_copies(root, batch, raw_s, REPLICAS)
        raw.setdefault("replica_copies_ceiling", []).append(r)
        log(f"raw append batch {batch}, {REPLICAS} copies at once: {r['msgs_per_s_each']} msg/s each")
    raw["what"] = (
        "MessageStore(tmpdir, fsync=True).put_messages of batches of the same "
        "1 KB records (topic, 8 queues round robin, producer id/seq) in this "
        "process: no network, no replication; no_fsync_reference: fsync=False; "
        "replica_copies_ceiling: one such append per replica, in parallel processes"
    )
    result["raw_append"] = raw


def _phase_micro(
    args: argparse.Namespace, root: Path, result: dict[str, Any], remaining: Callable[[], float]
) -> None:
    result["cpu_cost_us_per_message"] = [
        cost_breakdown(b, 0.5 if args.quick else 1.0) for b in args.batch_sizes
    ]
    log(f"cpu cost per message: {result['cpu_cost_us_per_message'][-1]}")


def _throughput_runs(
    args: argparse.Namespace, cluster: Any, result: dict[str, Any], remaining: Callable[[], float]
) -> list[dict[str, Any]]:
    """One throughput run per batch size and thread count, each after a quiet wait,
    while the budget allows."""
    runs: list[dict[str, Any]] = []
    for batch in args.batch_sizes:
        for threads in args.thread_counts:
            if remaining() < 15 + 5 * args.rounds + args.duration + args.quiet_wait_s:
                log("throughput: skipping the remaining runs to stay within the budget")
                result["throughput_truncated"] = True
                break
            quiet = wait_quiet(args.quiet_wait_s)
            r = throughput_run(cluster, threads, batch, args.warmup, args.duration)
            r["before_run"] = quiet
            runs.append(r)
            _log_run("throughput", r)
    return runs


def _throughput_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs, how many were invalid or contended, and the best valid one."""
    valid = [r for r in runs if r["valid_all_3_acked"]]
    best = max(valid, key=lambda r: r["msgs_per_s"]) if valid else None
    calm = [r for r in valid if not r["contended"]]
    return {
        "runs": runs,
        "invalid_runs": len(runs) - len(valid),
        "contended_runs": sum(1 for r in runs if r["contended"]),
        "best_uncontended_msgs_per_s": max((r["msgs_per_s"] for r in calm), default=None),
        "best": None
        if best is None
        else {
            k: best[k]
            for k in (
                "threads",
                "batch",
                "msgs_per_s",
                "mb_per_s",
                "batch_ack_latency",
                "cpu_percent",
                "cpu_us_per_message",
            )
        },
    }


def _profile_runs(args: argparse.Namespace, cluster: Any, root: Path, profiled: dict[str, Any]) -> None:
    """One throughput run per --profile-targets target, that process under py-spy; each
    in `profiled` as it finishes."""
    threads, batch = (int(x) for x in args.profile_run.split(","))
    pdir = root / "profile"
    pdir.mkdir(exist_ok=True)
    for target in args.profile_targets.split(","):
        log(
            f"profiling {target} (py-spy, {args.profile_rate} Hz) during a run of "
            f"{threads} threads x batch {batch}"
        )
        r = throughput_run(
            cluster,
            threads,
            batch,
            args.warmup,
            max(3.0, args.duration),
            profile={
                "dir": pdir,
                "targets": [target],
                "rate": args.profile_rate,
                "gil": not args.profile_all_threads,
                "native": args.profile_native,
            },
        )
        _log_run(f"profiled ({target})", r)
        profiled[target] = r


def _phase_throughput(
    args: argparse.Namespace, root: Path, result: dict[str, Any], remaining: Callable[[], float]
) -> None:
    flags = [
        "--ha-max-time-slave-not-catchup-ms",
        str(args.tp_not_catchup_ms),
        "--send-timeout-ms",
        "3000",
    ]
    cluster, info = start_cluster(root, "tp-cluster", flags, args.no_tiered)
    info["why_these_flags"] = (
        "the master counts a slave as caught up only when a fetch reaches its max offset "
        "of that instant, which never happens under sustained load: with the tests' 1500 "
        "ms the slaves leave the SyncStateSet ~1.5-2 s into a run and the rest of the run "
        "is acknowledged by the master alone (see failover.load_eviction_check). Phase 1 "
        f"therefore uses {args.tp_not_catchup_ms} ms (the broker default is 15000), longer "
        "than any run; a run counts only if the SyncStateSet epoch did not change"
    )
    result["throughput_cluster"] = info
    meter = CpuMeter(all_pids(cluster, info["first_master"]))
    time.sleep(1.0 if args.quick else 2.0)
    info["idle_cpu_percent"] = meter.stop()
    log(f"idle cpu: {info['idle_cpu_percent']}")
    runs = _throughput_runs(args, cluster, result, remaining)
    result["throughput"] = _throughput_summary(runs)
    if args.profile:
        result["profile_runs"] = {}
        _profile_runs(args, cluster, root, result["profile_runs"])
    stop_cluster(cluster)


def _failover_settings(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    """The failover phase's cluster and the settings of its probe and recovery."""
    return {
        "cluster": info,
        "settings": {
            "controller": CONTROLLER_CONFIG,
            "broker_flags": " ".join(FLAGS),
            "probe": {
                "attempt_timeout_s": args.attempt_timeout_s,
                "pause_after_failure_s": 0.02,
                "pause_after_success_s": 0.005,
                "batch": "4 x 100 B",
                "route": "nameserver QueryRoute after each failure",
                "sample": "fault -> first send acknowledged with master_epoch > old epoch",
                "route_names_new_master": "fault -> the nameserver route (polled every "
                "20 ms by another thread) names another master: "
                "the server side, without the probe's per-attempt "
                "timeout granularity",
            },
            "recovery": "SIGKILL: restart the broker from its data; SIGSTOP: SIGCONT; then wait "
            "for 3 SyncStateSet members",
        },
    }


def _load_eviction_check(args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    """A throughput run with the tests' flags: whether the slaves stay in the
    SyncStateSet under load."""
    threads, batch = (int(x) for x in args.profile_run.split(","))
    secs = 3.0 if args.quick else 4.0
    log(f"load eviction check: {threads} threads x batch {batch} for {secs} s with the tests' flags")
    r = throughput_run(cluster, threads, batch, 0.0, secs)
    _log_run("eviction check", r)
    return {
        k: r[k]
        for k in (
            "threads",
            "batch",
            "duration_s",
            "msgs_per_s",
            "sync_state_set_start",
            "sync_state_set_end",
            "sync_state_set_epochs",
            "sync_state_set_min_size_seen",
            "sync_state_set_first_shrink_after_load_start_s",
            "valid_all_3_acked",
            "batch_ack_latency",
        )
    }


def _failover_rounds(
    args: argparse.Namespace,
    cluster: Any,
    kind: str,
    failover: dict[str, Any],
    remaining: Callable[[], float],
) -> dict[str, Any]:
    """Up to --rounds failover rounds with fault `kind` (SIGKILL or SIGSTOP) while the
    budget allows; their summary and detail."""
    rounds: list[dict[str, Any]] = []
    for k in range(args.rounds):
        if remaining() < 12.0:
            log(f"failover {kind}: stopping after {k} rounds to stay within the budget")
            failover[f"{kind}_truncated"] = True
            break
        try:
            r = failover_round(cluster, kind, k, args.attempt_timeout_s, wait_s=15.0)
        except RuntimeError as exc:
            rounds.append({"round": k + 1, "fault": kind, "error": str(exc)})
            log(f"failover {kind} round {k + 1}: {exc}")
            break
        rounds.append(r)
        log(
            f"failover {kind} {k + 1}/{args.rounds}: {r['old_master']} -> "
            f"{r.get('new_master')} in {r['failover_s']} s (route after "
            f"{r['route_names_new_master_s']} s; {r['failed_attempts']} failed "
            f"attempts {r['errors']}), 3 in sync again after {r['back_to_3_in_sync_s']} s"
        )
    samples = [r["failover_s"] for r in rounds if r.get("failover_s") is not None]
    routes = [r["route_names_new_master_s"] for r in rounds if r.get("route_names_new_master_s") is not None]
    return dict(
        seconds_summary(samples),
        rounds=len(rounds),
        failed_rounds=len(rounds) - len(samples),
        route_names_new_master=seconds_summary(routes),
        detail=rounds,
    )


def _phase_failover(
    args: argparse.Namespace, root: Path, result: dict[str, Any], remaining: Callable[[], float]
) -> None:
    cluster, info = start_cluster(root, "fo-cluster", FLAGS, args.no_tiered)
    result["failover"] = _failover_settings(args, info)
    if args.eviction_check:
        result["failover"]["load_eviction_check"] = _load_eviction_check(args, cluster)
    for kind in ("SIGKILL", "SIGSTOP"):
        result["failover"][kind] = _failover_rounds(args, cluster, kind, result["failover"], remaining)
    stop_cluster(cluster)


def run(args: argparse.Namespace, root: Path, result: dict[str, Any], t_begin: float) -> None:
    def remaining() -> float:
        return args.budget_s - (time.monotonic() - t_begin)

    if "raw" in args.phases:
        _phase_raw(args, root, result, remaining)
    if "micro" in args.phases:
        _phase_micro(args, root, result, remaining)
    if "throughput" in args.phases:
        _phase_throughput(args, root, result, remaining)
    if "failover" in args.phases:
        _phase_failover(args, root, result, remaining)


def summarize(result: dict[str, Any]) -> None:
    met: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    tp = result.get("throughput", {})
    best = tp.get("best")
    raw = result.get("raw_append", {})
    if best:
        met["throughput_ge_20000_msgs_per_s"] = best["msgs_per_s"] >= TARGETS["throughput_msgs_per_s_min"]
        met["throughput_best_msgs_per_s"] = best["msgs_per_s"]
    if raw.get("fsync"):
        best_raw = max(raw["fsync"], key=lambda r: r["msgs_per_s"])
        ratios["raw_append_best_msgs_per_s"] = best_raw["msgs_per_s"]
        raw_of_batch = {
            r["batch"]: r["msgs_per_s"] for r in reversed(raw["fsync"])
        }  # the first run of a batch
        if best:
            ratios["throughput_best_vs_raw_append_best"] = _ratio(best["msgs_per_s"], best_raw["msgs_per_s"])
            if best["batch"] in raw_of_batch:
                ratios["throughput_best_vs_raw_append_same_batch"] = _ratio(
                    best["msgs_per_s"], raw_of_batch[best["batch"]]
                )
            for run in tp.get("runs", []):
                if run["batch"] in raw_of_batch:
                    ratios[f"t{run['threads']}_b{run['batch']}_vs_raw_b{run['batch']}"] = _ratio(
                        run["msgs_per_s"], raw_of_batch[run["batch"]]
                    )
        for ceiling in raw.get("replica_copies_ceiling", []):
            if ceiling["batch"] in raw_of_batch:
                # the best ratio to raw append a replicated set could reach on this machine
                name = f"ceiling_{ceiling['copies']}_copies_b{ceiling['batch']}_vs_raw_b{ceiling['batch']}"
                ratios[name] = _ratio(ceiling["msgs_per_s_slowest"], raw_of_batch[ceiling["batch"]])
    fo = result.get("failover", {})
    for kind, limit in (("SIGKILL", 1.5), ("SIGSTOP", 3.0)):
        r = fo.get(kind)
        if r:
            met[f"{kind.lower()}_failover_p99_le_{str(limit).replace('.', '_')}s"] = (
                r["p99_s"] is not None and r["p99_s"] <= limit and r["failed_rounds"] == 0
            )
    result["ratios"] = ratios
    result["targets"] = TARGETS
    result["targets_met"] = met


def git_state() -> dict[str, Any]:
    """The code measured: HEAD and the files that differ from it (read-only git calls)."""

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "head": git("rev-parse", "--short", "HEAD"),
        "head_subject": git("log", "-1", "--format=%s")[:120],
        "modified_files": [
            line[3:] for line in git("status", "--porcelain").splitlines() if not line.startswith("??")
        ],
    }


def preload_slow_fsync(delay_us: int, argv: list[str]) -> None:
    """Re-runs this bench with bench/slow_fsync.c preloaded (every child inherits it)."""
    if not 0 <= delay_us <= 1_000_000:
        sys.exit("--fsync-delay-us must be in [0, 1000000]")
    if delay_us == 0 or os.environ.get("SLOW_FSYNC_US") == str(delay_us):
        return
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        sys.exit("--fsync-delay-us needs a C compiler (cc) to build bench/slow_fsync.c")
    library = Path(tempfile.mkdtemp(prefix="mqmeta-slow-fsync-")) / "slow_fsync.so"
    source = Path(__file__).with_name("slow_fsync.c")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], check=True)
    env = {**os.environ, "LD_PRELOAD": str(library), "SLOW_FSYNC_US": str(delay_us)}
    os.execve(sys.executable, [sys.executable, "-m", "bench.broker_bench", *argv], env)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    preload_slow_fsync(args.fsync_delay_us, argv)
    import grpc

    root = Path(tempfile.mkdtemp(prefix="mqmeta-broker-bench-"))
    result: dict[str, Any] = {
        "bench": "mqmeta broker set",
        "quick": args.quick,
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "grpcio": grpc.__version__,
            "host": "127.0.0.1",
            "data_dir_fs": str(root),
            "fsync_delay_us": args.fsync_delay_us,
            "fsync_delay": (
                "emulated slower disk: bench/slow_fsync.c preloaded into every process of the "
                f"run sleeps {args.fsync_delay_us} us before each fsync/fdatasync"
                if args.fsync_delay_us
                else "none (this machine's disk)"
            ),
        },
    }
    busy0 = machine_busy()
    time.sleep(0.3)
    result["env"]["machine_busy_percent_before_start"] = machine_busy_percent(busy0)
    result["env"]["loadavg_before_start"] = os.getloadavg()
    result["env"]["git"] = git_state()
    result["env"]["note"] = (
        "cpu_percent: 100 = one core; machine_busy_percent: all cores; "
        "other_processes_cpu_percent: machine CPU not charged to this "
        "run's processes (other users, and kernel I/O / softirq work)"
    )
    return run_main(
        args,
        root,
        result,
        lambda t0: run(args, root, result, t0),
        summarize,
        cleanup,
        log,
        watchdog_grace_s=5.0,
        json_default=str,
        watchdog_sets_error=True,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
