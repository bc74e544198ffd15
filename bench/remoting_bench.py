"""RocketMQ 4.x C++ client (remoting) throughput beside the native client, and the failover
gap through the nameserver's remoting proxy, in one run.

    .venv/bin/python -m bench.remoting_bench [--messages N] [--size B] [--kills K]

Starts a real cluster (one controller, a nameserver with a remoting proxy, a broker set of
two replicas, acks from the whole SyncStateSet), then:
- send: N sync sends of B bytes one after another (each acknowledgement awaited) through
  rocketmq-client-python 2.0.0 over librocketmq.so (in its own process, after 20 to warm
  up), then through mqmeta/broker_client.Producer (one message per call, like for like);
- consume: a C++ PushConsumer (concurrent listener, offsets committed by the client) and
  the native Consumer each drain what was sent: messages per second from the first
  message received to the last;
- failover: K rounds of kill -9 of the master while the C++ client sends; the gap from the
  last send acknowledged before the kill to the first after it, and the failed sends (the
  killed broker restarts and the set is back in sync before the next round; that no
  acknowledged send is lost is tests/test_remoting_failover.py's).
Prints one JSON document; `--output FILE` writes it there too (bench/results/).
The C++ client is installed as the tests install it (tests/support/remoting_clients.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqmeta.cluster.harness import Cluster  # noqa: E402

from bench.brokerlib import wait_in_sync  # noqa: E402
from bench.rocketmq_bench import native_receive, native_send  # noqa: E402
from mqmeta.errors import AlreadyExists  # noqa: E402
from mqmeta.pb import controller_pb2 as cpb  # noqa: E402
from tests.support.remoting_clients import Client, install, shared_library  # noqa: E402

TOPIC = "Bench"  # bench.rocketmq_bench's native helpers use this topic
QUEUES = 4
ROUND_ACKS = 20  # acknowledged sends before and after each kill
ROUND_TIMEOUT_S = 60.0


def lines(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}")]


def wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def cpp_consume(cpp: Client, namesrv: str, group: str, total: int, root: Path) -> float:
    """Messages per second of a C++ PushConsumer draining `total` messages."""
    output, stop = root / f"{group}.jsonl", root / f"{group}.stop"
    process = cpp.stream(output, "consume-stream", namesrv, TOPIC, group, str(stop), "300", "")
    try:
        wait(lambda: len(lines(output)) >= total, 240, f"{total} messages for {group}")
    finally:
        stop.touch()
        process.wait(60)
    times = sorted(line["t"] for line in lines(output))
    return total / max(times[total - 1] - times[0], 1e-6)


def failover_round(cluster: Cluster, cpp: Client, namesrv: str, root: Path, k: int) -> dict:
    master = wait_in_sync(cluster, 2, timeout_s=60)
    output, stop = root / f"kill-{k}.jsonl", root / f"kill-{k}.stop"
    process = cpp.stream(output, "produce-stream", namesrv, TOPIC, f"pg-kill-{k}", str(stop), "120")

    def acked() -> int:
        return sum(1 for line in lines(output) if line.get("ok"))

    try:
        wait(lambda: acked() >= ROUND_ACKS, ROUND_TIMEOUT_S, "sends before the kill")
        killed_at = time.time()
        cluster.kill(master)
        before = acked()
        wait(lambda: acked() >= before + ROUND_ACKS, ROUND_TIMEOUT_S, "sends after the kill")
    finally:
        stop.touch()
        process.wait(60)
    produced = lines(output)
    ok = [line["t"] for line in produced if line.get("ok")]
    gap = min(t for t in ok if t > killed_at) - max(t for t in ok if t <= killed_at)
    cluster.start_broker(master)
    return {
        "killed": master,
        "gap_s": round(gap, 3),
        "failed_sends": sum(1 for line in produced if "error" in line),
        "acknowledged": len(ok),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    library = shared_library()
    if library is None:
        print(
            "remoting_bench needs librocketmq.so in a 'shared/clients/librocketmq' folder beside the checkout"
        )
        return 2
    root = Path(tempfile.mkdtemp(prefix="remoting-bench-"))
    (root / "home").mkdir()
    cpp = Client("rocketmq-client-python", install("rocketmq-client-python"), root / "home", library.parent)
    cluster = Cluster(root / "cluster", count=1, broker_sets=1, replicas=2).start()
    try:
        wait_in_sync(cluster, 2, timeout_s=60)
        with cluster.client() as admin:
            try:
                admin.create_topic(cpb.TopicSpec(name=TOPIC, queue_count=QUEUES))
            except AlreadyExists:
                pass
        namesrv = cluster.layout.namesrv_remoting
        body = b"x" * args.size
        (timed,) = cpp.run("produce-timed", namesrv, TOPIC, "pg-bench", str(args.messages), str(args.size))
        native_send(cluster.namesrv, 20, 1, body)  # warm-up
        native_s = native_send(cluster.namesrv, args.messages, 1, body)
        stored = 2 * args.messages + 40
        cpp_receive = cpp_consume(cpp, namesrv, "bench-cpp", stored, root)
        native_receive_s = native_receive(cluster.namesrv, stored)
        rounds = [failover_round(cluster, cpp, namesrv, root, k) for k in range(args.kills)]
    finally:
        cluster.stop()
    gaps = sorted(r["gap_s"] for r in rounds)
    result = {
        "messages": args.messages,
        "body_bytes": args.size,
        "replicas": 2,
        "cpp_send_msgs_per_s": round(args.messages / timed["elapsed_s"], 1),
        "native_send_msgs_per_s": round(args.messages / native_s, 1),
        "cpp_consume_msgs_per_s": round(cpp_receive, 1),
        "native_consume_msgs_per_s": round(stored / native_receive_s, 1),
        "kills": len(rounds),
        "failover_gap_s_p50": gaps[len(gaps) // 2] if gaps else None,
        "failover_gap_s_p99": gaps[-1] if gaps else None,  # of 10: the largest
        "failover_gaps_s": [r["gap_s"] for r in rounds],
        "failover_failed_sends": sum(r["failed_sends"] for r in rounds),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
