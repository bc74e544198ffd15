"""`mqmeta chaos toxiproxy | faultfs | run | matrix` (flag names and defaults as OpenChaos's)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqmeta.chaos.limits import (
    CONCURRENCY_MAX,
    CONSUMERS_MAX,
    INTERVAL_S_MIN,
    RATE_MAX,
    RATE_MIN,
    TIME_S_MAX,
    TIME_S_MIN,
)

from mqmeta.errors import InvalidArgument
from mqmeta.extras import require_extra
from mqmeta.validate import FlagNumber

if TYPE_CHECKING:
    from mqmeta.chaos.runner import AuditFunction, ReplicationAuditFunction

EXIT_FAILED = 1
# The flags' ranges, as RunConfig.validate checks them (a matrix with more runs is many matrices).
RUNS_MAX = 100
SEED_MAX = 2**63 - 1


def add_parser(subparsers: Any) -> None:
    chaos = subparsers.add_parser("chaos", help="chaos runs: faults, workloads, checkers, audit")
    chaos_sub = chaos.add_subparsers(dest="chaos_command", required=True, parser_class=type(chaos))
    from mqmeta.chaos.toxiproxy import add_toxiproxy_arguments

    add_toxiproxy_arguments(
        chaos_sub.add_parser(
            "toxiproxy", help="serve the Toxiproxy HTTP API (a Toxiproxy-compatible fault proxy)"
        )
    )
    from mqmeta.chaos.faultfs.cli import add_faultfs_arguments

    add_faultfs_arguments(
        chaos_sub.add_parser("faultfs", help="a FUSE filesystem that loses unsynced writes on a power loss")
    )
    run = chaos_sub.add_parser("run", help="one run of a fault against a workload")
    run.add_argument(
        "--fault",
        required=True,
        help="an OpenChaos fault name, or all-kill, or a comma-separated list (round k injects "
        "the k-th mod n); the disk faults power-loss-node, power-loss-all (kill -9, drop every "
        "unsynced write, restart), slow-disk (2 s fsyncs on the master), fsync-eio (the master's "
        "next fsyncs fail) and disk-full (ENOSPC on the master) put each node's data dir on its "
        "own fault filesystem mount (needs /dev/fuse and fuse3); slow-replica delays one slave's "
        "replication by 60 s; clock-jump steps the controller leader's wall clock by 30 s; "
        "corrupt-replica flips a checksummed byte of a stopped slave's commit log and a follower "
        "controller's Raft log, and restarts them (each must repair itself)",
    )
    _add_run_flags(run)
    run.add_argument("--output-dir", type=Path, required=True)
    matrix = chaos_sub.add_parser("matrix", help="many runs, one table")
    matrix.add_argument("--faults", required=True, help="comma-separated fault names")
    matrix.add_argument(
        "--runs", type=FlagNumber("--runs", int, 1, RUNS_MAX), default=1, help="runs per fault"
    )
    _add_run_flags(matrix)
    matrix.add_argument("--output-dir", type=Path, required=True)
    matrix.add_argument("--json", action="store_true", help="print the table as one JSON document")


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--concurrency",
        type=FlagNumber("-c", int, 1, CONCURRENCY_MAX),
        default=4,
        help="client threads (4)",
    )
    parser.add_argument(
        "--consumers",
        type=FlagNumber("--consumers", int, 1, CONSUMERS_MAX),
        default=2,
        help="consumer threads of the queue workload, splitting the queues (2)",
    )
    parser.add_argument(
        "-r",
        "--rate",
        type=FlagNumber("-r", float, RATE_MIN, RATE_MAX),
        default=20.0,
        help="operations per second (20)",
    )
    parser.add_argument(
        "-t",
        "--time",
        type=FlagNumber("-t", float, TIME_S_MIN, TIME_S_MAX),
        default=60.0,
        help="time limit in s (60)",
    )
    parser.add_argument(
        "-i",
        "--interval",
        type=FlagNumber("-i", float, INTERVAL_S_MIN, TIME_S_MAX),
        default=30.0,
        help="fault interval in s (30; at most -t)",
    )
    parser.add_argument(
        "--fault-target",
        default="all",
        help="controllers, brokers or all; replication workload: all or a list of source,target,link,workers",
    )
    parser.add_argument("--workload", default="queue", choices=["queue", "metadata", "replication"])
    parser.add_argument(
        "--client",
        default="native",
        choices=["native", "rocketmq", "remoting"],
        help="the queue workload's client: mqmeta's own, the official RocketMQ 5 Python client, or "
        "RocketMQ 4.x's C++ client (rocketmq-client-python 2.0.0; $MQMETA_REMOTING_CLIENT and "
        "$MQMETA_REMOTING_LIBRARY say where it and librocketmq.so are)",
    )
    parser.add_argument(
        "--liveness",
        default="test",
        choices=["test", "defaults"],
        help="broker liveness: the harness's fast test settings (heartbeat 200 ms, dead after 1 s, "
        "lease 500 ms), or the controller's own defaults",
    )
    parser.add_argument("--seed", type=FlagNumber("--seed", int, 0, SEED_MAX), default=0)
    parser.add_argument("--no-audit", action="store_true", help="skip the Spark audit")


def _config(args: argparse.Namespace, fault: str, output_dir: Path):
    from mqmeta.chaos.runner import RunConfig

    config = RunConfig(
        fault=fault,
        output_dir=output_dir,
        concurrency=args.concurrency,
        consumers=args.consumers,
        rate_per_s=args.rate,
        time_limit_s=args.time,
        interval_s=args.interval,
        fault_target=args.fault_target,
        workload=args.workload,
        client=args.client,
        liveness=args.liveness,
        seed=args.seed,
        audit=not args.no_audit,
    )
    config.validate()
    return config


@dataclass(frozen=True)
class SharedAudits:
    """What the front door lends a chaos run: audits in this process's one Spark session
    (chaos/ does not import spark/; mqmeta/cli.py wires the two)."""

    matrix_audit: AuditFunction
    replication_audit: ReplicationAuditFunction
    stop: Callable[[], None]  # ends the shared session


def run(args: argparse.Namespace, audits: Callable[[], SharedAudits] | None = None) -> int:
    """`mqmeta chaos ...`. `audits` gives the shared-session audits: a matrix audits each
    run with its matrix_audit (without it each run audits in a subprocess); replication
    runs (run and matrix) are audited by its replication_audit (X1), else by `mqmeta audit`
    in a subprocess. The fault filesystem needs neither the chaos extra nor Spark."""
    if args.chaos_command == "faultfs":
        from mqmeta.chaos.faultfs.cli import run_faultfs

        return run_faultfs(args)
    require_extra("chaos", "the chaos suite")
    if args.chaos_command == "toxiproxy":
        from mqmeta.chaos.toxiproxy import run_toxiproxy

        return run_toxiproxy(args)
    shared = audits() if audits is not None else None
    try:
        if args.chaos_command == "run":
            return _run_one(args, shared.replication_audit if shared else None)
        if shared is None:
            return _run_matrix(args, None, None, None)
        return _run_matrix(args, shared.matrix_audit, shared.stop, shared.replication_audit)
    finally:
        if shared is not None:
            shared.stop()  # a replication run's X1 used the session too


def _run_one(args: argparse.Namespace, replication_audit: ReplicationAuditFunction | None = None) -> int:
    from mqmeta.chaos.runner import run

    config = _config(args, args.fault, args.output_dir)
    outcome = run(config, replication_audit=replication_audit)
    summary = {k: outcome.result.get(k) for k in ("passed", "failures")}
    queue = outcome.result.get("queue")
    if queue:
        summary["queue"] = {
            k: queue[k]
            for k in (
                "enqueueSuccessCount",
                "dequeueSuccessCount",
                "lostMessageCount",
                "duplicateMessageCount",
                "recoveredMessageCount",
                "isValid",
            )
        }
    if "replication" in outcome.result:
        summary["replication"] = outcome.result["replication"]
    if "failover" in outcome.result:
        failover = outcome.result["failover"] or {}
        summary["failover"] = {k: failover.get(k) for k in ("falseFailoverCount", "failoverMs")}
    summary["linearizable"] = outcome.result.get("linearizable")
    summary["audit"] = outcome.result["audit"]
    summary["output_dir"] = str(config.output_dir)
    print(json.dumps(summary, indent=2))
    return 0 if outcome.passed else EXIT_FAILED


def _run_matrix(
    args: argparse.Namespace,
    audit: AuditFunction | None,
    audit_done: Callable[[], None] | None,
    replication_audit: ReplicationAuditFunction | None = None,
) -> int:
    from mqmeta.chaos.faults import FAULT_NAMES
    from mqmeta.chaos.runner import run

    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if any("@" in f for f in faults) and args.workload != "replication":
        raise InvalidArgument("--faults: FAULT@PLACE is for the replication workload only")
    unknown = [f for f in faults if f.partition("@")[0] not in FAULT_NAMES]
    if not faults or unknown:
        raise InvalidArgument(
            f"--faults: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(FAULT_NAMES)}"
        )
    if not 1 <= args.runs <= RUNS_MAX:
        raise InvalidArgument(f"--runs must be between 1 and {RUNS_MAX}")
    configs = []
    for item in faults:
        fault, _, place = item.partition("@")  # replication: this fault at this place
        one = argparse.Namespace(**{**vars(args), "fault_target": place or args.fault_target})
        name = item.replace("@", "-at-")
        configs += [_config(one, fault, args.output_dir / f"{name}-{i + 1}") for i in range(args.runs)]
    rows: list[dict] = []
    args.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        for config in configs:
            outcome = run(config, audit=audit, replication_audit=replication_audit)
            rows.append(_row(config.fault, config.output_dir, outcome.result, outcome.passed))
            # the table so far, so that a matrix stopped part-way still says what it found
            (args.output_dir / "matrix.json").write_text(json.dumps(rows, indent=2) + "\n")
            print(
                f"{config.fault} run {config.output_dir.name}: "
                f"{'passed' if outcome.passed else 'FAILED ' + '; '.join(outcome.failures)}",
                file=sys.stderr,
            )
    finally:
        if audit_done is not None:
            audit_done()
    _print_table(rows, args.json)
    return 0 if all(r["passed"] for r in rows) else EXIT_FAILED


def _row(fault: str, out: Path, result: dict, passed: bool) -> dict:
    queue = result.get("queue") or {}
    rtos = [r["rtoTime"] for r in result.get("rto") or [] if r.get("rtoTime") is not None]
    if "replication" in result:  # lost / duplicated as stored at the target; order at the target
        copies = result["replication"]
        return {
            "fault": fault,
            "target": result["config"]["fault_target"],
            "run": out.name,
            "passed": passed,
            "acked": queue.get("enqueueSuccessCount"),
            "lost": max(queue.get("lostMessageCount", 0), copies["lostCount"]),
            "duplicated": copies["duplicatedByOrigin"],
            "order_violations": copies["originOrderViolations"] + (0 if result["order"]["isOrder"] else 1),
            "catch_up_ms": copies.get("catchUpMs"),
            "max_rto_ms": max(rtos) if rtos else None,
            "audit": (result.get("audit") or {}).get("passed"),
        }
    failover = result.get("failover") or {}
    return {
        "fault": fault,
        "run": out.name,
        "passed": passed,
        "acked": queue.get("enqueueSuccessCount"),
        "lost": queue.get("lostMessageCount"),
        "duplicated": queue.get("duplicateMessageCount"),
        "recovered": queue.get("recoveredMessageCount"),
        "max_rto_ms": max(rtos) if rtos else None,
        "false_failovers": failover.get("falseFailoverCount"),
        "failover_ms": ",".join(str(ms) for ms in failover.get("failoverMs", [])) or None,
        "linearizable": result.get("linearizable"),
        "audit": (result.get("audit") or {}).get("passed"),
    }


def _print_table(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="chaos matrix")
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row.values()))
    Console().print(table)
