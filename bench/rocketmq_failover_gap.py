"""The failover gap an application sees: the official RocketMQ 5 client beside our own.

    python -m bench.rocketmq_failover_gap [--rounds 10] [--routes proxy|direct] [--keep]

Starts a real cluster with the controller's DEFAULT liveness settings (as `mqmeta local
up` runs; one controller, a nameserver serving RocketMQ 5 routes in --routes mode, one
broker set of two replicas). Two producers run side by side for the whole run, each
sending one message at a time every 20 ms: the unchanged official Python client
(bench/rmq_official_producer.py, given the nameserver address) and `mqmeta produce
--batch 1 --rate 50`. Each round kills the master with SIGKILL after a few seconds of
steady sends, measures for each producer the time from the kill to its next acknowledged
send, restarts the killed broker and waits for a full SyncStateSet again. `--fault stop`
SIGSTOPs the master instead (a silent master, found by the liveness settings); `--fault
term` SIGTERMs it (a graceful handoff: target gap <= 0.5 s, 0 failed sends).

Prints one JSON document (gap p50/p99/max per producer, failed sends) and writes it to
bench/results/rocketmq_failover_gap-ROUTES.json. Target (issue P13): official client
p99 <= 0.5 s, 0 failed sends.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import brokerlib
from bench.benchlib import REPO, make_log, run_main, seconds_summary
from bench.failover_bench import LIVENESS_KEYS

log = make_log("rmq-gap")
TOPIC = "GapBench"
STEADY_S = 3.0
ROUND_TIMEOUT_S = 60.0
TARGET_P99_S = 0.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--routes", choices=("proxy", "direct"), default="proxy")
    parser.add_argument(
        "--fault",
        choices=("kill", "stop", "term"),
        default="kill",
        help="SIGKILL the master, SIGSTOP it (a silent master: found by the liveness settings), "
        "or SIGTERM it (a graceful handoff to an in-sync slave)",
    )
    parser.add_argument("--budget-s", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args(argv)


class Sends:
    """Acknowledged and failed send times (monotonic) of one producer, from its lines."""

    def __init__(self) -> None:
        self.acked: list[float] = []
        self.failed: list[float] = []
        self.lock = threading.Lock()

    def next_ack_after(self, at: float) -> float | None:
        with self.lock:
            return next((t for t in self.acked if t > at), None)


def follow_official(proc: subprocess.Popen, sends: Sends) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        kind, _, value = line.strip().partition(" ")
        with sends.lock:
            if kind == "ok":
                sends.acked.append(float(value))
            elif kind == "fail":
                sends.failed.append(float(value))


def follow_record(path: Path, sends: Sends, stop: threading.Event) -> None:
    """`mqmeta produce --record` lines, time-stamped as they appear (polled every 2 ms)."""
    while not path.exists() and not stop.is_set():
        time.sleep(0.01)
    with path.open() as f:
        pending = ""
        while not stop.is_set():
            chunk = f.read()
            if not chunk:
                time.sleep(0.002)
                continue
            now = time.monotonic()
            pending += chunk
            *lines, pending = pending.split("\n")
            with sends.lock:
                sends.acked.extend(now for line in lines if line)


def start(root: Path, routes: str):
    from mqmeta.cluster.harness import Cluster
    from mqmeta.cluster.ready import wait_brokers_ready
    from mqmeta.controller.state_machine import CONFIG_SCHEMA

    from mqmeta.pb import controller_pb2 as pb

    cluster = Cluster(root / "gap", broker_sets=1, replicas=2, broker_flags=["--tiered-store", ""])
    cluster.namesrv_flags = ["--rocketmq-routes", routes]
    brokerlib.CLUSTERS.append(cluster)
    cluster.start(brokers=False)
    cluster.configure_controller({key: str(CONFIG_SCHEMA[key][1]) for key in LIVENESS_KEYS})
    for broker in cluster.layout.brokers:
        cluster.start_broker(broker.name)
    wait_brokers_ready(cluster.layout.brokers)
    with cluster.client() as client:
        client.create_topic(pb.TopicSpec(name=TOPIC, queue_count=4))
    return cluster


def _start_producers(namesrv: str, record: Path) -> tuple[subprocess.Popen, subprocess.Popen]:
    """The official client's producer (driven over its stdin/stdout) and ours (`mqmeta
    produce` at 50 msg/s, each acknowledgement recorded in `record`)."""
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.rmq_official_producer",
            "--endpoints",
            namesrv,
            "--topic",
            TOPIC,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    produce = subprocess.Popen(
        [sys.executable, "-m", "mqmeta.cli", "produce", "--namesrv", namesrv, "--topic", TOPIC]
        + ["--count", "1000000", "--rate", "50", "--batch", "1", "--record", str(record)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    return driver, produce


def _gap_round(cluster: Any, fault: str, official: Sends, ours: Sends) -> dict[str, Any]:
    """Kills (or SIGSTOPs) the in-sync master after a steady stretch, measures each
    producer's gap from the fault to its next acknowledgement, then restarts the broker."""
    master = brokerlib.wait_in_sync(cluster, 2, timeout_s=60.0)
    time.sleep(STEADY_S)  # steady sends before the kill
    killed_at = time.monotonic()
    if fault in ("stop", "term"):
        cluster.supervisor.children[master].send_signal(signal.SIGSTOP if fault == "stop" else signal.SIGTERM)
    else:
        cluster.kill(master)
    _wait(
        lambda at=killed_at: official.next_ack_after(at) and ours.next_ack_after(at),
        ROUND_TIMEOUT_S,
        "both producers acknowledged after the kill",
    )
    row = {
        "official_gap_s": round((official.next_ack_after(killed_at) or 0) - killed_at, 3),
        "ours_gap_s": round((ours.next_ack_after(killed_at) or 0) - killed_at, 3),
    }
    if fault == "stop":
        cluster.kill(master)  # a stopped process takes SIGKILL; it restarts from its data
    elif fault == "term":
        cluster.supervisor.children[master].wait(ROUND_TIMEOUT_S)  # its handoff and exit
    cluster.start_broker(master)
    return row


def _stop_producers(driver: subprocess.Popen, produce: subprocess.Popen) -> None:
    """Closes the official driver's stdin, interrupts ours; kills either after 15 s."""
    if driver.stdin is not None:
        driver.stdin.close()
    produce.send_signal(signal.SIGINT)
    for proc in (driver, produce):
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    cluster = start(root, args.routes)
    result["routes"] = args.routes
    result["fault"] = args.fault
    result["load_average_at_start"] = [round(x, 1) for x in os.getloadavg()]
    official, ours = Sends(), Sends()
    stop = threading.Event()
    record = root / "produce.jsonl"
    driver, produce = _start_producers(cluster.namesrv, record)
    threads = [
        threading.Thread(target=follow_official, args=(driver, official), daemon=True),
        threading.Thread(target=follow_record, args=(record, ours, stop), daemon=True),
    ]
    for t in threads:
        t.start()
    rounds: list[dict[str, Any]] = []
    result["rounds"] = rounds
    try:
        _wait(
            lambda: _alive(driver, produce) and official.acked and ours.acked,
            60,
            "both producers acknowledged",
        )
        for i in range(args.rounds):
            row = _gap_round(cluster, args.fault, official, ours)
            rounds.append(row)
            log(f"round {i + 1}: {row}")
    finally:
        stop.set()
        _stop_producers(driver, produce)
        result["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
        result["official_failed_sends"] = len(official.failed)
        result["official_acked"] = len(official.acked)
        result["ours_acked"] = len(ours.acked)


def _alive(*procs: subprocess.Popen) -> bool:
    for proc in procs:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}")
    return True


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def summarize(result: dict[str, Any]) -> None:
    rounds = result.get("rounds", [])
    result["official"] = seconds_summary([r["official_gap_s"] for r in rounds])
    result["ours"] = seconds_summary([r["ours_gap_s"] for r in rounds])
    p99 = result["official"].get("p99_s")
    result["target_official_p99_s"] = TARGET_P99_S
    result["meets_target"] = (
        p99 is not None and p99 <= TARGET_P99_S and result.get("official_failed_sends") == 0
    )
    suffix = "" if result.get("fault", "kill") == "kill" else f"-{result['fault']}"
    out = REPO / "bench" / "results" / f"rocketmq_failover_gap-{result.get('routes', 'proxy')}{suffix}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    root = Path(tempfile.mkdtemp(prefix="rmq-gap-"))
    result: dict[str, Any] = {"rounds_asked": args.rounds}
    return run_main(
        args,
        root,
        result,
        lambda t0: run(args, root, result),
        summarize,
        brokerlib.cleanup,
        log,
        watchdog_grace_s=30.0,
    )


if __name__ == "__main__":
    sys.exit(main())
