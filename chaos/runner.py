"""One chaos run: cluster behind proxies, a workload, a fault loop, the checkers, the audit.

OpenChaos's loop: for `time_limit_s`, wait `interval_s` -> inject -> wait `interval_s` -> heal.
Then the workload stops producing, the consumer drains, every process is stopped, and:
  DIR/history.tsv   the OpenChaos history (requests, responses, fault start/end);
  DIR/result.json   every checker's result, the faults applied, the audit's verdict;
  DIR/latency.png   time vs latency, fault windows shaded;
  DIR/cluster/      every node's data dir (what the audit reads);
  DIR/audit/        the Spark audit's report.json and report.html.
A run passes when nothing acknowledged was lost or unexpected, per-key order held, the
service answered again after every fault, the metadata history is linearizable (metadata
workload), and the audit passed.
"""

from __future__ import annotations

import json
import logging
import os
import random
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mqmeta.chaos import checkers
from mqmeta.chaos.clocks import NodeClocks
from mqmeta.chaos.disks import DISK_FAULTS, NodeDisks
from mqmeta.chaos.failover import check_run as check_failovers
from mqmeta.chaos.faults import FAULT_NAMES, TARGETS, FaultContext, make_fault
from mqmeta.chaos.history import FaultEvent, FaultPhase, HistoryRecorder
from mqmeta.chaos.limits import (
    CONCURRENCY_MAX,
    CONSUMERS_MAX,
    INTERVAL_S_MIN,
    RATE_MAX,
    RATE_MIN,
    TIME_S_MAX,
    TIME_S_MIN,
)
from mqmeta.chaos.net import ProxiedNetwork
from mqmeta.chaos.workloads import TOPIC, MetadataWorkload, QueueWorkload, WorkloadConfig
from mqmeta.cluster.harness import Cluster

from mqmeta import dialmap
from mqmeta.errors import InvalidArgument, MqmetaError
from mqmeta.pb import controller_pb2 as pb

log = logging.getLogger(__name__)

BROKER_FLAGS = [
    "--ha-max-time-slave-not-catchup-ms",
    "1500",
    "--send-timeout-ms",
    "3000",
    "--tiered-upload-bytes",
    "65536",
    "--tiered-upload-interval-ms",
    "500",
]
TOXIPROXY_START_TIMEOUT_S = 30.0  # a loaded machine starts Python slowly
AUDIT_TIMEOUT_S = 600.0
HEAL_SETTLE_S = 2.0

LIVENESS_CHOICES = ("test", "defaults")
BROKER_SET = "broker-a"

AuditFunction = Callable[[Path, Path], int]
# (source cluster dir, target cluster dir, rules file, report dir) -> exit code; see chaos/replication.py
ReplicationAuditFunction = Callable[[Path, Path, Path, Path], int]


@dataclass
class RunConfig:
    fault: str
    output_dir: Path
    concurrency: int = 4
    rate_per_s: float = 20.0
    consumers: int = 2
    time_limit_s: float = 60.0
    interval_s: float = 30.0
    fault_target: str = "all"
    workload: str = "queue"
    seed: int = 0
    drain_s: float = 30.0
    audit: bool = True
    toxiproxy_url: str = ""
    client: str = "native"  # the queue workload's client: ours or the official RocketMQ 5 one
    workers: int = 2  # replicator processes (replication workload)
    liveness: str = "test"  # "test": the harness's fast broker liveness; "defaults": the controller's

    @property
    def faults(self) -> list[str]:
        """`fault` may list several (comma-separated): round k injects the k-th mod n."""
        return self.fault.split(",")

    def validate(self) -> None:
        if self.workload == "replication":
            from mqmeta.chaos.replication import parse_plan

            parse_plan(self.fault, self.fault_target)  # comma-separated lists; their own places
            if not 1 <= self.workers <= 8:
                raise InvalidArgument("the replication workload runs between 1 and 8 workers")
            if set(self.faults) & set(DISK_FAULTS):
                from mqmeta.chaos.faultfs import check_can_mount

                check_can_mount()
        elif any(name not in FAULT_NAMES for name in self.faults):
            unknown = next(name for name in self.faults if name not in FAULT_NAMES)
            raise InvalidArgument(f"unknown fault {unknown!r}; choose one of {', '.join(FAULT_NAMES)}")
        elif self.fault_target not in TARGETS:
            raise InvalidArgument(f"--fault-target must be one of {', '.join(TARGETS)}")
        elif set(self.faults) & set(DISK_FAULTS):
            from mqmeta.chaos.faultfs import check_can_mount

            check_can_mount()  # FailedPrecondition naming what is missing (/dev/fuse, fusermount3)
        if self.workload not in ("queue", "metadata", "replication"):
            raise InvalidArgument("--workload must be queue, metadata or replication")
        if self.client not in ("native", "rocketmq", "remoting"):
            raise InvalidArgument("--client must be native, rocketmq or remoting")
        if self.liveness not in LIVENESS_CHOICES:
            raise InvalidArgument(f"--liveness must be one of {', '.join(LIVENESS_CHOICES)}")
        if self.client != "native" and self.workload != "queue":
            raise InvalidArgument(f"--client {self.client} runs the queue workload only")
        if not 1 <= self.concurrency <= CONCURRENCY_MAX:
            raise InvalidArgument(f"-c (concurrency) must be between 1 and {CONCURRENCY_MAX}")
        if not 1 <= self.consumers <= CONSUMERS_MAX:
            raise InvalidArgument(f"--consumers must be between 1 and {CONSUMERS_MAX}")
        if not RATE_MIN <= self.rate_per_s <= RATE_MAX:
            raise InvalidArgument(f"-r (rate per second) must be between {RATE_MIN:g} and {RATE_MAX:g}")
        if not TIME_S_MIN <= self.time_limit_s <= TIME_S_MAX:
            raise InvalidArgument(f"-t (time limit, s) must be between {TIME_S_MIN:g} and {TIME_S_MAX:g}")
        if not INTERVAL_S_MIN <= self.interval_s <= self.time_limit_s:
            raise InvalidArgument(
                f"-i (fault interval, s) must be at least {INTERVAL_S_MIN:g} and at most -t"
            )
        if any((self.output_dir / name).exists() for name in ("cluster", "cluster-a", "history.tsv")):
            # its layout and data would be reused, and the audit would read both runs
            raise InvalidArgument(f"{self.output_dir} already holds a chaos run; give a new --output-dir")


@dataclass
class RunResult:
    passed: bool
    result: dict[str, Any]
    output_dir: Path
    failures: list[str] = field(default_factory=list)


class _ToxiproxyProcess:
    """The embedded Toxiproxy-compatible server, as its own process (its own GIL). It binds a free
    port itself and names it on its first line of stdout (no port picked here and released)."""

    def __init__(self, root: Path) -> None:
        log_file = open(root / "toxiproxy.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mqmeta.cli", "chaos", "toxiproxy", "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
        )
        log_file.close()
        try:
            self.url = self._wait()
        except BaseException:
            self.stop()
            raise

    def _wait(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + TOXIPROXY_START_TIMEOUT_S
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if selector.select(timeout=deadline - time.monotonic()):
                line = self.process.stdout.readline().decode(errors="replace")  # "... listening on URL"
                if line.strip():
                    return line.split()[-1]
                status = self.process.wait(timeout=TOXIPROXY_START_TIMEOUT_S)  # end of output: it exits
                raise MqmetaError(f"the fault proxy exited at start (status {status})")
        raise MqmetaError("the fault proxy did not report its address in time")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def run(
    config: RunConfig,
    audit: AuditFunction | None = None,
    replication_audit: ReplicationAuditFunction | None = None,
) -> RunResult:
    """One run. `audit` checks a queue or metadata run's cluster dir; `replication_audit`
    (X1) a replication run's two cluster dirs and rules (chaos/replication.py)."""
    config.validate()
    out = config.output_dir
    out.mkdir(parents=True, exist_ok=True)
    proxy = None
    url = config.toxiproxy_url or os.environ.get("TOXIPROXY_URL", "")
    if not url:
        proxy = _ToxiproxyProcess(out)
        url = proxy.url
    if config.workload == "replication":
        return _run_replication(config, url, proxy, replication_audit)
    cluster = Cluster(
        out / "cluster",
        count=3,
        broker_sets=1,
        replicas=3,
        broker_flags=BROKER_FLAGS,
        test_liveness=config.liveness == "test",
    )
    network = ProxiedNetwork(cluster, url)
    recorder = HistoryRecorder()
    faults: list[dict[str, Any]] = []
    disks = NodeDisks(cluster, out) if set(config.faults) & set(DISK_FAULTS) else None
    disk_counters: dict[str, Any] = {}
    stopped_ms: int | None = None
    try:
        if disks is not None:
            disks.mount()
        network.create()
        clocks = None
        if "clock-jump" in config.faults:
            clocks = NodeClocks(cluster)
            clocks.install(cluster)
        dialmap.install(network.client_map())
        cluster.start()
        _execute(config, cluster, network, recorder, faults, disks, clocks)
    finally:
        try:
            network.heal()
        except Exception:  # the proxy may be gone; the cluster still has to stop
            log.exception("could not heal the network")
        not_running = [name for name in _processes(cluster) if not cluster.is_running(name)]
        stopped_ms = int(time.time() * 1000)  # master changes from here on are the stop's
        cluster.stop()
        dialmap.install({})
        if proxy is not None:
            proxy.stop()
        if disks is not None:
            disk_counters = disks.counters()
            disks.unmount()
    failovers = check_failovers(out / "cluster", cluster.layout, faults, BROKER_SET, stopped_ms)
    return _conclude(config, recorder, faults, audit, failovers, not_running, disk_counters)


def _processes(cluster: Cluster) -> list[str]:
    names = [n.id for n in cluster.layout.controllers]
    if cluster.layout.brokers and not cluster.layout.embedded:
        names.append("namesrv")
    return names + [b.name for b in cluster.layout.brokers]


def _run_replication(
    config: RunConfig,
    url: str,
    proxy: _ToxiproxyProcess | None,
    audit: ReplicationAuditFunction | None,
) -> RunResult:
    from mqmeta.chaos.replication import run_replication

    try:
        result, failures = run_replication(config, url, audit)
    finally:
        if proxy is not None:
            proxy.stop()
    config_fields = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    result = {"config": config_fields, **result, "passed": not failures, "failures": failures}
    (config.output_dir / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return RunResult(not failures, result, config.output_dir, failures)


def _execute(
    config: RunConfig,
    cluster: Cluster,
    network: ProxiedNetwork,
    recorder: HistoryRecorder,
    faults: list[dict[str, Any]],
    disks: NodeDisks | None = None,
    clocks: NodeClocks | None = None,
) -> None:
    workload: QueueWorkload | MetadataWorkload | Any
    wconfig = WorkloadConfig(config.concurrency, config.rate_per_s, config.consumers)
    if config.client == "rocketmq":
        from mqmeta.chaos.rmq_workload import RmqQueueWorkload  # imports the official client

        with cluster.client() as client:  # FIFO: each sharding key is a message group, kept in order
            client.create_topic(pb.TopicSpec(name=TOPIC, queue_count=4, message_type="FIFO"))
        workload = RmqQueueWorkload(cluster.namesrv, recorder, wconfig, config.output_dir / "rocketmq-client")
    elif config.client == "remoting":
        from mqmeta.chaos.remoting_workload import RemotingQueueWorkload

        with cluster.client() as client:
            client.create_topic(pb.TopicSpec(name=TOPIC, queue_count=4))
        workload = RemotingQueueWorkload(
            cluster.layout.namesrv_remoting, recorder, wconfig, config.output_dir / "remoting-client"
        )
    elif config.workload == "queue":
        with cluster.client() as client:
            client.create_topic(pb.TopicSpec(name=TOPIC, queue_count=4))
        workload = QueueWorkload(cluster.namesrv, recorder, wconfig, [BROKER_SET])
    else:
        workload = MetadataWorkload(
            [n.grpc for n in cluster.layout.controllers], recorder, wconfig, config.seed
        )
        with cluster.client() as client:
            workload.prepare(lambda spec: client.create_topic(spec))
    context = FaultContext(
        cluster, network, config.fault_target, random.Random(config.seed), disks=disks, clocks=clocks
    )
    workload.start()
    try:
        _fault_loop(config, context, recorder, faults)
    finally:
        workload.stop(config.drain_s, healed_ms=faults[-1]["end_ms"] if faults else 0)


def _fault_loop(
    config: RunConfig, context: FaultContext, recorder: HistoryRecorder, faults: list[dict[str, Any]]
) -> None:
    end = time.monotonic() + config.time_limit_s
    while time.monotonic() + config.interval_s <= end:
        time.sleep(config.interval_s)
        name = config.faults[len(faults) % len(config.faults)]
        fault = make_fault(name, context)
        start_ms = int(time.time() * 1000)
        try:
            what = fault.inject()
        except MqmetaError as error:  # e.g. no leader to pick right now: this round is skipped
            what = f"not injected: {error.message}"
        recorder.record(FaultEvent(name, FaultPhase.START, start_ms, what))
        time.sleep(min(config.interval_s, max(0.0, end - time.monotonic())))
        fault.heal()
        end_ms = int(time.time() * 1000)
        recorder.record(FaultEvent(name, FaultPhase.END, end_ms))
        faults.append(
            {
                "fault": name,
                "start_ms": start_ms,
                "end_ms": end_ms,
                "what": what,
                "affected": fault.affected,
                "cut": fault.cut,
                **fault.details,
            }
        )
    time.sleep(min(HEAL_SETTLE_S, max(0.0, end - time.monotonic())))


def _conclude(
    config: RunConfig,
    recorder: HistoryRecorder,
    faults: list[dict[str, Any]],
    audit: AuditFunction | None,
    failovers: dict[str, Any],
    not_running: list[str] | None = None,
    disk_counters: dict[str, Any] | None = None,
) -> RunResult:
    from mqmeta.chaos.linearizability import check_linearizability
    from mqmeta.chaos.plot import latency_png

    out = config.output_dir
    history = recorder.events()
    recorder.write(out / "history.tsv")
    latency_png(history, out / "latency.png")
    result: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "faults": faults,
        "failover": failovers,
    }
    failures = []
    if disk_counters:
        result["faultfs"] = disk_counters
    # every node started again after every fault, and ran until the end of the run
    not_restarted = sorted({n for f in faults for n in f.get("notRestarted", [])} | set(not_running or []))
    result["notRestarted"] = not_restarted
    if not_restarted:
        failures.append(f"{', '.join(not_restarted)} did not start again (see the logs)")
    # corrupt-replica: each damaged node found the damage and repaired it (its counter)
    unrepaired = sorted({n for f in faults for n, count in f.get("repaired", {}).items() if not count})
    if any("repaired" in f for f in faults):
        result["unrepaired"] = unrepaired
    if unrepaired:
        failures.append(f"{', '.join(unrepaired)} did not repair its corrupted data (see the logs)")
    # The harness's test liveness (dead after 1 s) trades false failovers on a loaded machine
    # for quick runs: they are counted there, and fail a run only with the defaults that
    # users run (--liveness defaults), where one is a bug (it found one: state_machine.stale_view).
    failovers["judged"] = config.liveness == "defaults"
    if failovers["falseFailoverCount"] and failovers["judged"]:
        failures.append(
            f"{failovers['falseFailoverCount']} false failover(s): the master changed while no fault "
            f"touched it (see result.json's failover)"
        )
    if config.workload == "queue":
        result.update(
            queue=checkers.check_queue(history),
            order=checkers.check_order(history),
            latency_buckets=checkers.latency_buckets(history),
            linearizable=None,
        )
        result.update(_as_list("recovery", checkers.check_recovery(history)))
        result.update(_as_list("rto", checkers.check_rto(history)))
        failures += _queue_failures(result)
    else:
        verdict = check_linearizability(history)
        result.update(linearizability=verdict, linearizable=verdict["linearizable"])
        result.update(_as_list("rto", checkers.check_rto(history, operation="write")))
        if verdict["linearizable"] is not True:
            failures.append(f"linearizability: {verdict['linearizable']} (key {verdict.get('failing_key')})")
    result["audit"] = _audit(config, audit)
    if result["audit"]["passed"] is False:
        failures.append(f"audit failed (see {result['audit']['report']})")
    result["passed"] = not failures
    result["failures"] = failures
    (out / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return RunResult(not failures, result, out, failures)


def _as_list(name: str, checked: dict[str, Any]) -> dict[str, Any]:
    """result.json's `recovery` and `rto` are the per-window lists (as OpenChaos writes
    them); the checker's summary fields go beside them as `recoverySummary` / `rtoSummary`."""
    summary = {k: v for k, v in checked.items() if k != "results"}
    return {name: checked["results"], f"{name}Summary": summary}


def _queue_failures(result: dict[str, Any]) -> list[str]:
    queue, order = result["queue"], result["order"]
    failures = []
    if not queue["isValid"]:
        failures.append(
            f"queue: {queue['lostMessageCount']} lost, {queue.get('unexpectedMessageCount', 0)} unexpected"
        )
    if not order["isOrder"]:
        failures.append(f"order broken for sharding key {order.get('wrongShardingKey')}")
    if queue["enqueueSuccessCount"] == 0:
        failures.append("no enqueue succeeded: the run proves nothing")
    never = [r for r in result["rto"] if r["isUnavailableInFaultInterval"] and not r["recovered"]]
    if never:
        failures.append(f"{len(never)} fault interval(s) never recovered")
    return failures


def _audit(config: RunConfig, audit: AuditFunction | None) -> dict[str, Any]:
    report = config.output_dir / "audit"
    if not config.audit:
        return {"passed": None, "report": None, "exit_code": None}
    if audit is not None:
        code = audit(config.output_dir, report)
    else:
        code = subprocess.run(
            [sys.executable, "-m", "mqmeta.cli", "audit", str(config.output_dir), "--report", str(report)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            timeout=AUDIT_TIMEOUT_S,
        ).returncode
    return {"passed": code == 0, "report": str(report / "report.json"), "exit_code": code}
