"""The P16 fault matrix: every power-loss and grey-failure fault, several runs each, with the
controller's default liveness, as one JSON document (bench/results/chaos_matrix-p16-*.json).

    python -m bench.chaos_matrix [--faults power-loss-node,...] [--runs 3] [-t 60] [-i 15]
                                 [--audit] [--budget-s 5400] [--output-dir DIR] [--keep]

Each run is `mqmeta chaos run --fault NAME --liveness defaults` (queue workload; the fault
loops every -i s for -t s). Per run the JSON holds what the issue asks for: acknowledged
messages lost, the audit's verdict (--audit: the Spark audit in one shared session; else
null), every node back (notRestarted empty), and the time to repair (each fault's
recover_ms where the fault restarts nodes, else the longest unavailability after a fault,
max_rto_ms), with false failovers and the failover times. Bounded: the matrix stops
starting runs once --budget-s is spent (the runs not started are listed), and a watchdog
ends it past the budget plus one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.benchlib import make_log, run_main

P16_FAULTS = (
    "power-loss-node",
    "power-loss-all",
    "slow-disk",
    "fsync-eio",
    "disk-full",
    "slow-replica",
    "corrupt-replica",
    "clock-jump",
)
RUN_OVERHEAD_S = 120  # a run's cluster start, drain and stop on top of -t (more with --audit)

log = make_log("chaos_matrix")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=",".join(P16_FAULTS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-t", "--time", type=float, default=60.0, help="each run's time limit, s")
    parser.add_argument("-i", "--interval", type=float, default=15.0, help="fault interval, s")
    parser.add_argument("--audit", action="store_true", help="run the Spark audit after each run")
    parser.add_argument("--budget-s", type=float, default=5400.0, help="start no run past this")
    parser.add_argument("--output-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 10:
        parser.error("--runs must be between 1 and 10")
    return args


def _row(fault: str, run_index: int, result: dict[str, Any], seconds: float) -> dict[str, Any]:
    queue = result.get("queue") or {}
    failover = result.get("failover") or {}
    rtos = [r["rtoTime"] for r in result.get("rto") or [] if r.get("rtoTime") is not None]
    repairs = [f["recover_ms"] for f in result.get("faults", []) if "recover_ms" in f]
    return {
        "fault": fault,
        "run": run_index,
        "passed": result.get("passed"),
        "failures": result.get("failures"),
        "faults_injected": len(result.get("faults", [])),
        "acked": queue.get("enqueueSuccessCount"),
        "lost": queue.get("lostMessageCount"),
        "duplicated": queue.get("duplicateMessageCount"),
        "audit": (result.get("audit") or {}).get("passed"),
        "every_node_back": result.get("notRestarted") == [],
        "not_restarted": result.get("notRestarted"),
        "repair_ms": max(repairs) if repairs else None,
        "max_rto_ms": max(rtos) if rtos else None,
        "false_failovers": failover.get("falseFailoverCount"),
        "failover_ms": failover.get("failoverMs"),
        "run_s": round(seconds, 1),
    }


def _result_head(args: argparse.Namespace, argv: list[str] | None, missing: list[str]) -> dict[str, Any]:
    """The result document before any run: the command, its settings, empty rows."""
    return {
        "bench": "python -m bench.chaos_matrix",
        "command": " ".join(["python -m bench.chaos_matrix", *(argv if argv is not None else sys.argv[1:])]),
        "run_date": time.strftime("%Y-%m-%d"),
        "settings": {
            "runs": args.runs,
            "time_s": args.time,
            "interval_s": args.interval,
            "liveness": "defaults",
        },
        "faults_unknown_here": missing,
        "rows": [],
        "not_started": [],
    }


def _summarize(done: dict[str, Any]) -> None:
    """The totals over every row: runs, passed, acked, lost, audit failures, nodes not back,
    the longest repair."""
    rows = done["rows"]
    done["summary"] = {
        "runs": len(rows),
        "passed": sum(1 for r in rows if r["passed"]),
        "acked": sum(r["acked"] or 0 for r in rows),
        "lost": sum(r["lost"] or 0 for r in rows),
        "audit_failed": sum(1 for r in rows if r["audit"] is False),
        "nodes_not_back": sum(1 for r in rows if not r["every_node_back"]),
        "repair_ms_max": max((r["repair_ms"] for r in rows if r["repair_ms"] is not None), default=None),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mqmeta.chaos.faults import FAULT_NAMES
    from mqmeta.chaos.runner import RunConfig, run

    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    missing = [f for f in faults if f not in FAULT_NAMES]  # corrupt-replica comes with its own branch
    faults = [f for f in faults if f in FAULT_NAMES]
    root = args.output_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"chaos-matrix-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    args.budget_s = args.budget_s + args.time + RUN_OVERHEAD_S  # the watchdog: budget plus one run
    result = _result_head(args, argv, missing)
    audit = None
    if args.audit:
        from mqmeta.spark.cli import shared_session_audit

        audit = shared_session_audit
    budget_end = time.monotonic() + args.budget_s - args.time - RUN_OVERHEAD_S

    def work(t0: float) -> None:
        for index in range(1, args.runs + 1):  # every fault once before any twice: a cut budget
            for fault in faults:  # still leaves each fault measured
                if time.monotonic() + args.time + RUN_OVERHEAD_S > budget_end:
                    result["not_started"].append(f"{fault}#{index}")
                    continue
                started = time.monotonic()
                config = RunConfig(
                    fault=fault,
                    output_dir=root / f"{fault}-{index}",
                    time_limit_s=args.time,
                    interval_s=args.interval,
                    liveness="defaults",
                    seed=index,
                    audit=args.audit,
                )
                outcome = run(config, audit=audit)
                row = _row(fault, index, outcome.result, time.monotonic() - started)
                result["rows"].append(row)
                log(f"{fault} #{index}: {'passed' if row['passed'] else 'FAILED'} in {row['run_s']} s")

    def cleanup() -> None:
        if audit is not None:
            from mqmeta.spark.cli import stop_shared_session

            stop_shared_session()

    return run_main(args, root, result, work, _summarize, cleanup, log, watchdog_grace_s=0.0)


if __name__ == "__main__":
    sys.exit(main())
