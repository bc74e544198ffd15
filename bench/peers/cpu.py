"""`python -m bench.peers.cpu`: CPU per metadata write of every process of bench.peers'
mqmeta system, with 1 writer and with 16.

The same cluster bench.peers runs (3 controllers with the Raft secret, the standalone
nameserver with its route copy and web console, one broker set of 3), the same Python
load generator (bench/peers/load.py: CreateTopic, a new name per call). For each round
and each writer count, the CPU time (utime + stime from /proc/PID/stat) each process used
while the writers ran, divided by the writes they made: where a write's CPU goes on a
machine whose two cores all of these share. The controllers are named by their role at the
start (`leader`, `follower`); `namesrv` is the nameserver, `bench` this process (the load
generator). Also the processes' idle CPU (percent of a core) before the first round.

`--kill-namesrv` stops the nameserver (kill -9) before measuring: what the controllers'
figures are without anything that follows them. One JSON document on stdout; progress on
stderr; about a minute with the defaults. Every process listens on 127.0.0.1 and is stopped
on exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, cpu_seconds, machine, make_log, percentile, run_main
from bench.peers import load
from bench.peers.run import STARTED, Mqmeta, cleanup

log = make_log("peers.cpu")
WATCHDOG_S = 10 * 60
IDLE_S = 5.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of 1 and 16 writers (default 2)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (5)")
    parser.add_argument("--kill-namesrv", action="store_true", help="kill -9 the nameserver first")
    parser.add_argument("--root", default="", help="where the cluster lives (default: a temp dir)")
    args = parser.parse_args(argv)
    if not (1 <= args.rounds <= 10 and 1.0 <= args.duration <= 60.0):
        parser.error("--rounds is 1 to 10 and --duration 1 to 60 seconds")
    return args


def _processes(system: Mqmeta) -> dict[str, int]:
    leader = system.cluster.leader_id()
    found = {
        ("leader" if node == leader else f"follower-{node}"): pid
        for node, pid in system.controller_pids().items()
    }
    namesrv = system.cluster.supervisor.children.get("namesrv")
    if namesrv is not None and namesrv.poll() is None:
        found["namesrv"] = namesrv.pid
    found["bench"] = os.getpid()
    return found


def _cpu(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def measure(system: Mqmeta, writers: int, duration_s: float) -> dict[str, Any]:
    pids = _processes(system)
    before = _cpu(pids)
    written = load.drive(lambda k: load.MqmetaWrite(system.addresses, k), writers, 0.0, duration_s)
    after = _cpu(pids)
    count = written["count"] or 1
    per_write = {
        name: _r((after[name] - before[name]) / count * 1000)  # type: ignore[operator]
        for name in pids
        if before[name] is not None and after[name] is not None
    }
    return {"figures": written, "cpu_ms_per_write": per_write}


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    result["machine"] = machine()
    result["parameters"] = {
        "rounds": args.rounds,
        "duration_s": args.duration,
        "kill_namesrv": args.kill_namesrv,
    }
    system = Mqmeta(root)
    STARTED.append(system)
    system.start()
    if args.kill_namesrv:
        os.kill(system.cluster.supervisor.children["namesrv"].pid, signal.SIGKILL)
    pids = _processes(system)
    before = _cpu(pids)
    time.sleep(IDLE_S)
    after = _cpu(pids)
    result["idle_cpu_percent"] = {
        name: _r((after[name] - before[name]) / IDLE_S * 100)  # type: ignore[operator]
        for name in pids
        if before[name] is not None and after[name] is not None
    }
    result["rounds"] = []
    for k in range(args.rounds):
        log(f"round {k + 1}/{args.rounds}")
        measured = {f"write_{n}": measure(system, n, args.duration) for n in (1, 16)}
        for name, phase in measured.items():
            f = phase["figures"]
            per_write = phase["cpu_ms_per_write"]
            log(f"{name}: p50 {f['p50_ms']} ms, {f['ops_per_s']}/s, CPU ms per write {per_write}")
        result["rounds"].append(measured)
    result["leader_at_end"] = system.cluster.leader_id()


def summarize(result: dict[str, Any]) -> None:
    """Medians over the rounds, per phase and process (a process that changed role is
    counted under the role it had at the start of each round)."""
    medians: dict[str, Any] = {}
    for phase in ("write_1", "write_16"):
        rounds = [r[phase] for r in result.get("rounds", []) if phase in r]
        if not rounds:
            continue
        names = sorted({n for r in rounds for n in r["cpu_ms_per_write"]})
        medians[phase] = {
            "p50_ms": _r(percentile([r["figures"]["p50_ms"] for r in rounds], 50)),
            "writes_per_s": _r(percentile([r["figures"]["ops_per_s"] for r in rounds], 50)),
            "cpu_ms_per_write": {
                name: _r(
                    percentile(
                        [r["cpu_ms_per_write"][name] for r in rounds if name in r["cpu_ms_per_write"]], 50
                    )
                )
                for name in names
            },
        }
        medians[phase]["cpu_ms_per_write_all"] = _r(sum(medians[phase]["cpu_ms_per_write"].values()))
    result["medians"] = medians


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.keep = bool(args.root)
    args.budget_s = WATCHDOG_S
    root = Path(args.root) if args.keep else Path(tempfile.mkdtemp(prefix="mqmeta-cpu-"))
    result: dict[str, Any] = {"benchmark": "bench.peers.cpu"}
    return run_main(
        args, root, result, lambda t0: run(args, root, result), summarize, cleanup, log, watchdog_grace_s=60.0
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
