#!/usr/bin/env python
"""Benchmark of cross-cluster replication: two local clusters (a, b; one controller, one
broker set of 2 replicas each) and one `mqmeta replicator` worker.

    .venv/bin/python bench/replicator_bench.py [--messages N] [--queues Q]

Prints ONE JSON document on stdout; progress goes to stderr. In one run:
direct       N messages of 1 KB produced straight into b (batches of 32, one thread):
             the target's own ingest rate, the yardstick;
replicated   N messages of 1 KB produced into a first (a backlog), then a worker
             started with a rule a -> b (start = earliest): messages/s and MB/s from the
             worker's start (process start-up included) until b holds every copy;
ratio        replicated / direct (the issue's target: >= 0.5);
wan          the same replication (a fresh topic and worker) with every connection from
             the worker to b through a Toxiproxy-compatible proxy adding --latency-ms each
             way (chaos.toxiproxy), and its ratio to the run without (target: >= 0.8).
Progress is read from b itself (QueryOrigin: the origin heads it holds).
Not measured yet: end-to-end delay p50/p99.

Every wait is bounded; every child process is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.harness import Cluster  # noqa: E402
from cluster.wait import wait_for  # noqa: E402
from mqmeta.broker_client import Channels, Producer, RouteCache, call_master  # noqa: E402
from mqmeta.errors import MqmetaError  # noqa: E402
from mqmeta.pb import broker_pb2  # noqa: E402
from mqmeta.pb import controller_pb2 as pb  # noqa: E402

BODY_BYTES = 1024
BATCH = 32
REPLICATE_TIMEOUT_S = 120.0
# The harness's test liveness (lease 500 ms) lapses on a loaded 2-core machine and moves
# masters mid-run; the controller's defaults instead.
BENCH_LIVENESS = {
    "broker_heartbeat_interval_ms": "500",
    "broker_dead_after_ms": "3000",
    "lease_ms": "2000",
    "lease_margin_ms": "500",
}


def _progress(text: str) -> None:
    print(f"[replicator_bench] {text}", file=sys.stderr, flush=True)


def _produce(cluster: Cluster, topic: str, count: int) -> float:
    """Sends `count` 1 KB messages in batches; the seconds it took."""
    producer = Producer(cluster.namesrv)
    body = b"x" * BODY_BYTES
    started = time.monotonic()
    try:
        for first in range(0, count, BATCH):
            producer.send(topic, [body] * min(BATCH, count - first))
    finally:
        producer.close()
    return time.monotonic() - started


def _held(b: Cluster, topic: str, queues: int) -> int:
    """How many copies of a's queues of `topic` b holds: each origin head + 1 (the worker's
    own counter misses copies whose acknowledgement a failover lost)."""
    channels = Channels()
    routes = RouteCache(b.namesrv, channels)
    try:
        total = 0
        for queue_id in range(queues):
            request = broker_pb2.QueryOriginRequest(
                cluster="a", broker_name="broker-a", topic=topic, queue_id=queue_id
            )
            reply = call_master(routes, channels, topic, "broker-a", "QueryOrigin", request, 10.0)
            total += reply.offset + 1
        return total
    finally:
        channels.close()


def _replicate(
    a: Cluster, b: Cluster, topic: str, messages: int, queues: int, root: Path, env: dict[str, str]
) -> dict:
    """Starts a worker for `topic` (its backlog already at a); rates from its metrics."""
    config = root / f"replicator-{topic}.toml"
    config.write_text(
        f'[[rules]]\nname = "{topic}"\nsource_namesrv = "{a.namesrv}"\ntarget_namesrv = "{b.namesrv}"\n'
        f'topic = "{topic}"\nstart = "earliest"\n'
    )
    command = [sys.executable, "-m", "mqmeta.cli", "replicator", "--config", str(config)]
    started = time.monotonic()
    name = f"replicator-{topic}"
    b.supervisor.start(name, command, env)
    held = lambda: _held(b, topic, queues)  # noqa: E731
    wait_for(
        held,
        REPLICATE_TIMEOUT_S,
        f"{messages} copies",
        until=lambda n: n >= messages,
        interval_s=0.05,
        retry_on=(MqmetaError,),
    )
    done = time.monotonic()
    b.supervisor.children[name].kill()
    # From the worker's start: its process start-up and discovery (about a second) count.
    rate = messages / (done - started)
    return {
        "messages_per_s": round(rate),
        "mb_per_s": round(rate / 1024, 2),
        "seconds": round(done - started, 2),
    }


def _with_latency(b: Cluster, latency_ms: int, root: Path, server: Any) -> dict[str, str]:
    """A dial map sending the worker's connections to b through proxies adding latency."""
    from toxiproxy import Toxiproxy

    client = Toxiproxy()
    client.update_api_consumer(server.host, server.port)
    mapping = {}
    for i, upstream in enumerate([*b.layout.namesrv, *(broker.grpc for broker in b.layout.brokers)]):
        proxy = client.create(upstream=upstream, name=f"b{i}", listen="127.0.0.1:0")
        for stream in ("upstream", "downstream"):
            proxy.add_toxic(type="latency", attributes={"latency": latency_ms}, stream=stream, name=stream)
        mapping[upstream] = proxy.listen
    dial_map = root / "dial.json"
    dial_map.write_text(json.dumps(mapping))
    return {"MQMETA_DIAL_MAP": str(dial_map)}


def run(messages: int, queues: int, latency_ms: int, root: Path) -> dict[str, object]:
    sites = []
    try:
        for name in ("a", "b"):
            cluster = Cluster(
                root / name,
                count=1,
                embedded=True,
                broker_sets=1,
                replicas=2,
                broker_flags=["--cluster", name],
            )
            sites.append(cluster)
            cluster.start()
            cluster.configure_controller(BENCH_LIVENESS)
            with cluster.client() as client:
                for topic in ("Bench", "Wan", "Direct"):
                    client.call("CreateTopic", pb.TopicSpec(name=topic, cluster=name, queue_count=queues))
        a, b = sites
        _progress(f"direct: {messages} x 1 KB into b")
        direct_s = _produce(b, "Direct", messages)
        _progress(f"backlog: {messages} x 1 KB into a")
        _produce(a, "Bench", messages)
        replicated = _replicate(a, b, "Bench", messages, queues, root, {})
        _progress(f"backlog: {messages} x 1 KB into a for the run with {latency_ms} ms each way")
        _produce(a, "Wan", messages)
        from chaos.toxiproxy import ToxiproxyServer

        with ToxiproxyServer("127.0.0.1:0") as server:
            wan = _replicate(a, b, "Wan", messages, queues, root, _with_latency(b, latency_ms, root, server))
        direct_rate = messages / direct_s
        return {
            "messages": messages,
            "body_bytes": BODY_BYTES,
            "queues": queues,
            "direct": {"messages_per_s": round(direct_rate), "mb_per_s": round(direct_rate / 1024, 2)},
            "replicated": replicated,
            "ratio": round(replicated["messages_per_s"] / direct_rate, 2),
            "wan": {"latency_ms_each_way": latency_ms, **wan},
            "wan_ratio": round(wan["messages_per_s"] / replicated["messages_per_s"], 2),
        }
    finally:
        for cluster in sites:
            cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, default=50)
    parser.add_argument("--keep", type=Path, help="run in this (new) directory and keep its logs")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
        print(json.dumps(run(args.messages, args.queues, args.latency_ms, args.keep), indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="replicator-bench-") as directory:
        print(json.dumps(run(args.messages, args.queues, args.latency_ms, Path(directory)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
