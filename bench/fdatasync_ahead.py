#!/usr/bin/env python
"""`python -m bench.fdatasync_ahead`: a durable append over zeros written ahead, against one
that extends its file, on this machine's disk, through the real logs.

Three processes at once (as a broker set's master and slaves, or three controllers, share
one disk here) each make `--appends` durable appends of one `--bytes` record: to a broker
commit log (`CommitLog.append`, fsync on: pwrite then fdatasync) and to a controller Raft
journal (`DurableJournal.add`: pwrite then fdatasync). Variant `ahead` is the code as it is
(each record written over zeros written ahead of it, PREALLOCATE_BYTES at a time);
variant `appended` sets the zeros ahead to none in the child processes, so every append
extends its file, as before; variant `alone` is `ahead` in one process, nothing else
syncing: what sharing the disk's cache flushes costs each of three. The variants take
turns going first, one round each, over `--rounds` rounds. Each append's wall time is one
sample; the JSON has every round's p50 and p99 per variant and log, their medians, and the
ratios ahead ÷ appended and ahead ÷ alone of the medians. Files go in a temporary
directory under `--dir` (default: the system's temporary directory, the disk the other
benches use); every loop is bounded by its count.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, environment, latency_summary, machine, make_log, run_main

log = make_log("fdatasync_ahead")
PROCESSES = 3
LOGS = ("commitlog", "journal")
VARIANTS = ("ahead", "appended", "alone")
ZEROS_AHEAD = {"ahead": True, "appended": False, "alone": True}
PROCESSES_OF = {"ahead": PROCESSES, "appended": PROCESSES, "alone": 1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fdatasync_ahead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--appends", type=int, default=1000, help="durable appends per process and run (1000)"
    )
    parser.add_argument("--bytes", type=int, default=1024, help="bytes of each record's body (1024)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running both variants (3)")
    parser.add_argument("--dir", default="", help="where the files go (default: the temporary directory)")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    if not (10 <= args.appends <= 100_000 and 1 <= args.bytes <= 1 << 20 and 1 <= args.rounds <= 20):
        parser.error("--appends is 10 to 100,000, --bytes 1 to 1 MiB and --rounds 1 to 20")
    return args


def _appender(kind: str, variant: str, directory: str, appends: int, size: int, out: Any) -> None:
    """One process's appends; puts its samples (seconds) on `out`."""
    from mqmeta.broker_agent import commitlog
    from mqmeta.controller import journal

    from mqmeta.formats.records import Message, encode_record

    if not ZEROS_AHEAD[variant]:
        commitlog.PREALLOCATE_BYTES = 0
        journal._ZEROS = b""
    body = bytes(range(256)) * (size // 256 + 1)
    samples: list[float] = []
    if kind == "commitlog":
        log_ = commitlog.CommitLog(Path(directory), fsync=True)
        records = [
            encode_record(Message("Bench", 0, body[:size]), 1, 1_800_000_000_000, i, f"{i:032x}")
            for i in range(appends)
        ]
        for record in records:
            started = time.perf_counter()
            log_.append([record])
            samples.append(time.perf_counter() - started)
        # not closed: close() would cut the zeros ahead, and the process ends here anyway
    else:
        journal_ = journal.DurableJournal(Path(directory) / "raft.journal", stop_on_disk_error=False)
        for i in range(appends):
            started = time.perf_counter()
            journal_.add(body[:size], i + 1, 1)
            samples.append(time.perf_counter() - started)
        journal_._destroy()
    out.put(samples)


def _run_once(kind: str, variant: str, root: Path, appends: int, size: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    directories = [
        tempfile.mkdtemp(prefix=f"{kind}-{variant}-", dir=root) for _ in range(PROCESSES_OF[variant])
    ]
    processes = [
        context.Process(target=_appender, args=(kind, variant, d, appends, size, out)) for d in directories
    ]
    for process in processes:
        process.start()
    samples = [s for _ in processes for s in out.get(timeout=120)]
    for process in processes:
        process.join(30)
    return latency_summary(samples)


def summarize(done: dict[str, Any]) -> None:
    """Each variant's median p50 over the rounds, and the ratios of `ahead` to the others."""
    medians: dict[str, Any] = {}
    for kind in LOGS:
        for variant in VARIANTS:
            p50s = [r[f"{kind}_{variant}"]["p50_ms"] for r in done["rounds"] if f"{kind}_{variant}" in r]
            if p50s:
                medians[f"{kind}_{variant}_p50_ms"] = _r(statistics.median(p50s))
        ahead = medians.get(f"{kind}_ahead_p50_ms")
        for other in ("appended", "alone"):
            base = medians.get(f"{kind}_{other}_p50_ms")
            if ahead and base:
                medians[f"{kind}_ahead_vs_{other}"] = _r(ahead / base)
    done["medians"] = medians
    if "machine" in done:
        done["machine"]["load_average_at_end"] = list(os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fdatasync-ahead-", dir=args.dir or None))
    result: dict[str, Any] = {
        "benchmark": "bench.fdatasync_ahead",
        "environment": environment(),
        "machine": machine(),
        "parameters": {
            "appends": args.appends,
            "bytes": args.bytes,
            "rounds": args.rounds,
            "processes": PROCESSES_OF,
        },
        "rounds": [],
    }

    def run(_t0: float) -> None:
        for k in range(args.rounds):
            order = (
                VARIANTS[k % len(VARIANTS) :] + VARIANTS[: k % len(VARIANTS)]
            )  # rotated: each goes first in turn
            row: dict[str, Any] = {}
            for kind in LOGS:
                for variant in order:
                    row[f"{kind}_{variant}"] = _run_once(kind, variant, root, args.appends, args.bytes)
                    log(f"round {k + 1}: {kind} {variant} {row[f'{kind}_{variant}']}")
            result["rounds"].append(row)

    return run_main(args, root, result, run, summarize, lambda: None, log, watchdog_grace_s=30.0)


if __name__ == "__main__":
    raise SystemExit(main())
