"""The official RocketMQ 5 client's throughput through the proxy, directly to the masters,
and against its own ceiling, in one run.

    python -m bench.rocketmq_proxy_throughput [--messages N] [--threads T] [--size B] [--rounds R]
        [--kinds send,simple,push]

Targets, measured in alternating rounds with the same client, threads and message size:
- ceiling: an apache.rocketmq.v2 MessagingService in this process (the official client's
  own stubs) that stores nothing: sends are answered OK at once, receives hand out
  synthetic messages, acks are answered OK;
- direct: mqmeta, a nameserver with `--rocketmq-routes direct` (routes name the masters);
- proxy: mqmeta, a nameserver with `--rocketmq-routes proxy` (the default);
- proxy_unmerged: the same with `--rocketmq-merge-calls off` (each call forwarded alone).
mqmeta: one controller, a broker set of two replicas, acks from the whole SyncStateSet.

Measured: send (T threads, each sending its share of N one at a time); SimpleConsumer
receive + ack (batches of 32, a batch's acks sent together); PushConsumer receive + ack
(default consumption threads; from its first message to its N-th). Prints one JSON
document with messages per second (the best round of each), the ratios proxy/direct
and proxy/ceiling, and per round the CPU milliseconds per message each process used
(cpu_ms_per_message: the nameservers, brokers, controller and this process, which is the
client and the ceiling's server; a figure the machine's load moves far less than the
rates); writes it to bench/results/rocketmq_proxy_throughput.json (or --out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import REPO, make_log  # noqa: E402
from bench.rocketmq_bench import official_client, timed_threads  # noqa: E402

log = make_log("rmq-proxy-tput")
TOPIC = "Tput"
QUEUES = 4
ACKS_IN_FLIGHT_MAX = 32
KINDS = ("send", "simple", "push")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _null_queues(topic: str, address: str) -> list:
    """QUEUES read-write queues of `topic`, all on the null server at `address`."""
    from rocketmq.grpc_protocol import definition_pb2 as d

    host, port = address.rsplit(":", 1)
    endpoints = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host=host, port=int(port))])
    return [
        d.MessageQueue(
            topic=d.Resource(name=topic),
            id=i,
            permission=d.READ_WRITE,
            broker=d.Broker(name="null", id=0, endpoints=endpoints),
            accept_message_types=[d.NORMAL],
        )
        for i in range(QUEUES)
    ]


def _null_message(n: int, request: Any, body: bytes, digest: str) -> Any:
    """The null server's n-th delivered message, on the queue `request` receives from."""
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import definition_pb2 as d

    props = d.SystemProperties(
        message_id=f"NULL{n:020d}",
        body_digest=d.Digest(type=d.MD5, checksum=digest),
        body_encoding=d.IDENTITY,
        message_type=d.NORMAL,
        receipt_handle=f"h{n}",
        delivery_attempt=1,
        queue_id=request.message_queue.id,
        queue_offset=n,
        invisible_duration=Duration(seconds=30),
    )
    props.born_timestamp.GetCurrentTime()
    return d.Message(topic=request.message_queue.topic, system_properties=props, body=body)


def _null_settings(settings: Any) -> Any:
    """The client's settings as a broker answers them: its body limit, its batch, its polls."""
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import definition_pb2 as d

    merged = d.Settings()
    merged.CopyFrom(settings)
    if merged.HasField("publishing"):
        merged.publishing.max_body_size = 4 << 20
    if merged.HasField("subscription"):  # as a broker answers: its batch, its polls
        merged.subscription.receive_batch_size = 32
        merged.subscription.long_polling_timeout.CopyFrom(Duration(seconds=30))
        merged.backoff_policy.max_attempts = 17
        merged.backoff_policy.customized_backoff.next.add().seconds = 1
    return merged


def null_server(rmq_root: Any, address_holder: list[str]):
    """An in-process MessagingService that stores nothing (the official client's stubs)."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol import service_pb2_grpc as sg

    ok = d.Status(code=d.OK, message="OK")
    body = b"x" * 1024
    digest = hashlib.md5(body).hexdigest().upper()

    def queues(topic: str) -> list:
        return _null_queues(topic, address_holder[0])

    class Null(sg.MessagingServiceServicer):
        counter = iter(range(1 << 62))

        def QueryRoute(self, request, context):
            return s.QueryRouteResponse(status=ok, message_queues=queues(request.topic.name))

        def Heartbeat(self, request, context):
            return s.HeartbeatResponse(status=ok)

        def NotifyClientTermination(self, request, context):
            return s.NotifyClientTerminationResponse(status=ok)

        def SendMessage(self, request, context):
            m = request.messages[0]
            entry = s.SendResultEntry(status=ok, message_id=m.system_properties.message_id, offset=1)
            return s.SendMessageResponse(status=ok, entries=[entry])

        def QueryAssignment(self, request, context):
            return s.QueryAssignmentResponse(
                status=ok, assignments=[d.Assignment(message_queue=q) for q in queues(request.topic.name)]
            )

        def ReceiveMessage(self, request, context):
            yield s.ReceiveMessageResponse(status=ok)
            for _ in range(request.batch_size):
                yield s.ReceiveMessageResponse(
                    message=_null_message(next(self.counter), request, body, digest)
                )
            done = s.ReceiveMessageResponse()
            done.delivery_timestamp.GetCurrentTime()  # the clients time the batch from it
            yield done

        def AckMessage(self, request, context):
            entries = [
                s.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=ok)
                for e in request.entries
            ]
            return s.AckMessageResponse(status=ok, entries=entries)

        def Telemetry(self, request_iterator, context):
            for command in request_iterator:
                if command.HasField("settings"):
                    yield s.TelemetryCommand(status=ok, settings=_null_settings(command.settings))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    sg.add_MessagingServiceServicer_to_server(Null(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    address_holder.append(f"127.0.0.1:{port}")
    server.start()
    return server


def send(rmq, endpoints: str, total: int, threads: int, body: bytes) -> float:
    config = rmq.ClientConfiguration(endpoints, rmq.Credentials(), request_timeout=5)
    producer = rmq.Producer(config, (TOPIC,))
    producer.startup()

    def work(i: int) -> None:
        for _ in range(total // threads):
            m = rmq.Message()
            m.topic, m.body = TOPIC, body
            producer.send(m)

    try:
        producer.send(_message(rmq, body))  # routes and channel before the clock starts
        return total / timed_threads(threads, work)
    finally:
        producer.shutdown()


def _message(rmq, body: bytes):
    m = rmq.Message()
    m.topic, m.body = TOPIC, body
    return m


def simple_receive(rmq, endpoints: str, total: int, group: str) -> float:
    config = rmq.ClientConfiguration(endpoints, rmq.Credentials(), request_timeout=5)
    consumer = rmq.SimpleConsumer(config, group, {TOPIC: rmq.FilterExpression()}, 1)
    consumer.startup()
    pool = ThreadPoolExecutor(ACKS_IN_FLIGHT_MAX)

    def ack(message) -> None:
        try:
            consumer.ack(message)
        except Exception:
            pass

    got, idle = 0, 0
    start = time.perf_counter()
    try:
        while got < total and idle < QUEUES * 3:
            messages = consumer.receive(32, 30)
            idle = 0 if messages else idle + 1
            list(pool.map(ack, messages))
            got += len(messages)
        return got / (time.perf_counter() - start)
    finally:
        pool.shutdown()
        consumer.shutdown()


def push_receive(rmq, endpoints: str, total: int, group: str, timeout_s: float = 120.0) -> float:
    times: list[float] = []
    done = threading.Event()

    class Listener:
        def consume(self, message):
            times.append(time.perf_counter())
            if len(times) >= total:
                done.set()
            return rmq.ConsumeResult.SUCCESS

    config = rmq.ClientConfiguration(endpoints, rmq.Credentials(), request_timeout=5)
    consumer = rmq.PushConsumer(config, group, Listener(), {TOPIC: rmq.FilterExpression()})
    consumer.startup()
    try:
        done.wait(timeout_s)
        if len(times) < 2:
            return 0.0
        return (len(times) - 1) / (times[-1] - times[0])
    finally:
        consumer.shutdown()


def _start_namesrv(cluster: Any, address: str, name: str, flags: list[str]) -> None:
    """Another nameserver on `address` with `flags` (its RocketMQ routes), without metrics,
    remoting, remoting proxy or console (the first one's ports)."""
    from mqmeta.cluster.layout import namesrv_command
    from mqmeta.cluster.ready import wait_ready

    command = namesrv_command(cluster.layout) + flags
    command[command.index("--listen") + 1] = address
    for flag in ("--metrics-listen", "--remoting-listen", "--remoting-proxy", "--console-listen"):
        if flag in command:
            del command[command.index(flag) : command.index(flag) + 2]
    cluster.supervisor.start(name, command)
    wait_ready(cluster.addresses, [address])


def _cpu_s(pid: int) -> float:
    """The CPU time (user + system) process `pid` has used; 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _measure(
    rmq: Any,
    targets: dict[str, str],
    rounds: int,
    total: int,
    threads: int,
    body: bytes,
    rates: dict[str, dict[str, list[float]]],
    pids: dict[str, int],
    cpu: dict[str, dict[str, list[dict[str, float]]]],
) -> None:
    """`rounds` rounds of send, then simple and push receive (the kinds `rates` names),
    against every target; each rate appended to `rates` as it is measured, and to `cpu` the
    CPU milliseconds per message each process of `pids` used meanwhile."""
    kinds = next(iter(rates.values()))
    receives = {"simple": simple_receive, "push": push_receive}

    def measured(r: int, name: str, kind: str, measure: Any, *args: Any) -> None:
        before = {process: _cpu_s(pid) for process, pid in pids.items()}
        rates[name][kind].append(_rate(measure, *args))
        used = {process: (_cpu_s(pid) - before[process]) * 1000 / total for process, pid in pids.items()}
        cpu[name][kind].append({process: round(ms, 3) for process, ms in used.items() if ms > 0.01})
        log(f"round {r + 1} {name} {kind} {rates[name][kind][-1]:.0f} msg/s")

    for r in range(rounds):
        for name, endpoints in targets.items():
            if "send" in kinds:
                measured(r, name, "send", send, rmq, endpoints, total, threads, body)
        for name, endpoints in targets.items():
            for kind in (k for k in receives if k in kinds):
                measured(r, name, kind, receives[kind], rmq, endpoints, total, f"{kind}-{name}-{r}")


def _rate(measure: Any, *args: Any) -> float:
    """`measure(*args)`, or 0.0 when the client failed (logged): on a loaded machine a lapsed
    lease can move the master mid-run, and direct routes then fail until the client's next
    route refresh; the other rounds still count."""
    try:
        return float(measure(*args))
    except Exception as exc:
        log(f"measurement failed: {type(exc).__name__}: {str(exc)[:200]}")
        return 0.0


def _summary(
    rates: dict[str, dict[str, list[float]]], total: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The best rate of each target and kind, every sample, and the ratios between targets."""
    best = {name: {kind: round(max(v), 1) for kind, v in kinds.items()} for name, kinds in rates.items()}
    measured = tuple(next(iter(rates.values())))
    result: dict[str, Any] = {
        "messages": total,
        "threads": args.threads,
        "body_bytes": args.size,
        "rounds": args.rounds,
        "kinds": list(next(iter(rates.values()))),
        "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
        "msgs_per_s": best,
        "samples": rates,
        "ratio_proxy_to_direct": {k: _ratio(best["proxy"][k], best["direct"][k]) for k in measured},
        "ratio_proxy_to_ceiling": {k: _ratio(best["proxy"][k], best["ceiling"][k]) for k in measured},
        "ratio_direct_to_ceiling": {k: _ratio(best["direct"][k], best["ceiling"][k]) for k in measured},
        "ratio_proxy_unmerged_to_direct": {
            k: _ratio(best["proxy_unmerged"][k], best["direct"][k]) for k in measured
        },
        # the same ratios round by round (neighbouring phases share the machine's load), median
        "median_round_ratio_proxy_to_direct": _median_ratios(rates, "proxy", "direct"),
        "median_round_ratio_proxy_to_ceiling": _median_ratios(rates, "proxy", "ceiling"),
        "median_round_ratio_direct_to_ceiling": _median_ratios(rates, "direct", "ceiling"),
        "median_round_ratio_proxy_unmerged_to_direct": _median_ratios(rates, "proxy_unmerged", "direct"),
        "ratio_proxy_unmerged_to_ceiling": {
            k: _ratio(best["proxy_unmerged"][k], best["ceiling"][k]) for k in measured
        },
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="what to measure, of send,simple,push (e.g. send: more rounds of sends in a short run)",
    )
    parser.add_argument(
        "--out", default="rocketmq_proxy_throughput.json", help="file name under bench/results/"
    )
    args = parser.parse_args()
    kinds = [k for k in KINDS if k in args.kinds.split(",")]
    if not kinds or set(args.kinds.split(",")) - set(KINDS):
        parser.error(f"--kinds takes some of {','.join(KINDS)}, not {args.kinds!r}")
    root = Path(tempfile.mkdtemp(prefix="rmq-proxy-tput-"))
    rmq = official_client(root / "home")
    from mqmeta.cluster.harness import Cluster
    from mqmeta.cluster.ports import PortReservation

    from mqmeta.pb import controller_pb2 as cpb

    holder: list[str] = []
    null = null_server(rmq, holder)
    cluster = Cluster(root / "cluster", count=1, broker_sets=1, replicas=2)
    ports = PortReservation.pick(2)
    cluster.start()
    try:
        direct, unmerged = ports.addresses
        ports.release()
        _start_namesrv(cluster, direct, "namesrv-direct", ["--rocketmq-routes", "direct"])
        _start_namesrv(cluster, unmerged, "namesrv-unmerged", ["--rocketmq-merge-calls", "off"])
        cluster.master_of("broker-a")
        with cluster.client() as admin:
            admin.create_topic(cpb.TopicSpec(name=TOPIC, queue_count=QUEUES))
        targets = {
            "ceiling": holder[0],
            "direct": direct,
            "proxy": cluster.namesrv,
            "proxy_unmerged": unmerged,
        }
        body = os.urandom(args.size)
        total = args.messages - args.messages % args.threads
        rates: dict[str, dict[str, list[float]]] = {k: {kind: [] for kind in kinds} for k in targets}
        # the cluster's processes by name (the master's named as such too) and this one
        pids = {name: proc.pid for name, proc in cluster.supervisor.children.items()}
        pids["master"] = pids[cluster.master_of("broker-a")]
        pids["bench (client, ceiling)"] = os.getpid()
        cpu: dict[str, dict[str, list[dict[str, float]]]] = {k: {kind: [] for kind in kinds} for k in targets}
        _measure(rmq, targets, args.rounds, total, args.threads, body, rates, pids, cpu)
    finally:
        cluster.stop()
        null.stop(0)
    result = _summary(rates, total, args)
    result["cpu_ms_per_message"] = cpu
    text = json.dumps(result, indent=2)
    (REPO / "bench" / "results" / Path(args.out).name).write_text(text + "\n")
    print(text)
    return 0


def _median_ratios(rates: dict[str, dict[str, list[float]]], a: str, b: str) -> dict[str, float | None]:
    """Per kind, the median over rounds of a's rate over b's in the same round."""
    found: dict[str, float | None] = {}
    for kind in rates[a]:
        ratios = sorted(x / y for x, y in zip(rates[a][kind], rates[b][kind], strict=True) if x and y)
        found[kind] = round(statistics.median(ratios), 3) if ratios else None
    return found


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if a and b else None


if __name__ == "__main__":
    sys.exit(main())
