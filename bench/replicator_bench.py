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
delay        end-to-end delay at a steady rate below saturation (--delay-rate msg/s of
             1 KB in batches every 20 ms for --delay-s s, a worker already running and
             caught up): per copy, b's store time of the copy minus a's store time of
             the original (its __ORIGIN_STORE_MS property; one machine, one clock):
             p50, p99 and max in ms;
wan_delay    the same through the proxy adding --latency-ms each way.
Progress is read from b itself (QueryOrigin: the origin heads it holds).

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

from mqmeta.cluster.harness import Cluster  # noqa: E402
from mqmeta.cluster.wait import wait_for  # noqa: E402

from mqmeta.broker_client import Channels, Consumer, Producer, RouteCache, call_master  # noqa: E402
from mqmeta.errors import MqmetaError  # noqa: E402
from mqmeta.formats import origin as origin_format  # noqa: E402
from mqmeta.pb import broker_pb2  # noqa: E402
from mqmeta.pb import controller_pb2 as pb  # noqa: E402

BODY_BYTES = 1024
BATCH = 32
REPLICATE_TIMEOUT_S = 120.0
DELAY_BATCH_INTERVAL_S = 0.02  # the steady producer sends one batch every 20 ms
WARM_UP_TIMEOUT_S = 30.0
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


def _start_worker(a: Cluster, b: Cluster, topic: str, root: Path, env: dict[str, str]) -> str:
    config = root / f"replicator-{topic}.toml"
    config.write_text(
        f'[[rules]]\nname = "{topic}"\nsource_namesrv = "{a.namesrv}"\n'
        f'target_namesrv = "{b.namesrv}"\ntopic = "{topic}"\nstart = "earliest"\n'
    )
    name = f"replicator-{topic}"
    b.supervisor.start(name, [sys.executable, "-m", "mqmeta.cli", "replicator", "--config", str(config)], env)
    return name


def _steady(a: Cluster, topic: str, rate_per_s: int, seconds: float) -> int:
    """Sends 1 KB messages at `rate_per_s` (one batch every 20 ms, round-robin over the
    queues) for `seconds`; returns how many were acknowledged. Falls behind, never bursts."""
    producer = Producer(a.namesrv)
    per_batch = max(1, round(rate_per_s * DELAY_BATCH_INTERVAL_S))
    body = b"d" * BODY_BYTES
    sent = 0
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    try:
        while next_at < end:
            time.sleep(max(0.0, next_at - time.monotonic()))
            producer.send(topic, [body] * per_batch)
            sent += per_batch
            next_at = max(next_at + DELAY_BATCH_INTERVAL_S, time.monotonic() - DELAY_BATCH_INTERVAL_S)
    finally:
        producer.close()
    return sent


def _store_delays_ms(b: Cluster, topic: str, count: int, since_ms: int) -> list[int]:
    """b's store time minus a's store time of every copy of `topic` at b whose original was
    stored at or after `since_ms` (reads until `count` copies or REPLICATE_TIMEOUT_S)."""
    consumer = Consumer(b.namesrv, topic, f"delay-{topic}")
    delays: list[int] = []
    deadline = time.monotonic() + REPLICATE_TIMEOUT_S
    try:
        while len(delays) < count and time.monotonic() < deadline:
            batch = consumer.poll()
            for copy in batch:
                source_ms = int(copy.properties[origin_format.STORE_MS])
                if source_ms >= since_ms:
                    delays.append(copy.store_timestamp_ms - source_ms)
            if not batch:
                time.sleep(0.05)
    finally:
        consumer.close()
    return delays


def _percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _delay(
    a: Cluster, b: Cluster, topic: str, load: tuple[int, float], queues: int, root: Path, env: dict[str, str]
) -> dict:
    """End-to-end delay of a steady stream through a running, caught-up worker."""
    rate_per_s, seconds = load
    name = _start_worker(a, b, topic, root, env)
    producer = Producer(a.namesrv)
    try:  # warm-up: one message per queue through the worker, not measured
        for _ in range(queues):
            producer.send(topic, [b"warm-up"])
    finally:
        producer.close()
    held = lambda: _held(b, topic, queues)  # noqa: E731
    wait_for(
        held, WARM_UP_TIMEOUT_S, "the warm-up copies", until=lambda n: n >= queues, retry_on=(MqmetaError,)
    )
    since_ms = int(time.time() * 1000)
    sent = _steady(a, topic, rate_per_s, seconds)
    wait_for(
        held,
        REPLICATE_TIMEOUT_S,
        f"{sent} copies",
        until=lambda n: n >= sent + queues,
        retry_on=(MqmetaError,),
    )
    b.supervisor.children[name].kill()
    delays = _store_delays_ms(b, topic, sent, since_ms)
    return {
        "rate_per_s": rate_per_s,
        "achieved_per_s": round(sent / seconds),
        "messages": len(delays),
        "p50_ms": _percentile(delays, 0.50),
        "p99_ms": _percentile(delays, 0.99),
        "max_ms": max(delays),
        "measured": "b's store time of the copy - a's store time of the original",
    }


def run(
    messages: int, queues: int, latency_ms: int, root: Path, delay_rate: int = 500, delay_s: float = 10.0
) -> dict[str, object]:
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
                for topic in ("Bench", "Wan", "Direct", "Delay", "WanDelay"):
                    client.create_topic(pb.TopicSpec(name=topic, cluster=name, queue_count=queues))
        a, b = sites
        _progress(f"direct: {messages} x 1 KB into b")
        direct_s = _produce(b, "Direct", messages)
        _progress(f"backlog: {messages} x 1 KB into a")
        _produce(a, "Bench", messages)
        replicated = _replicate(a, b, "Bench", messages, queues, root, {})
        _progress(f"backlog: {messages} x 1 KB into a for the run with {latency_ms} ms each way")
        _produce(a, "Wan", messages)
        from mqmeta.chaos.toxiproxy import ToxiproxyServer

        with ToxiproxyServer("127.0.0.1:0") as server:
            wan_env = _with_latency(b, latency_ms, root, server)
            wan = _replicate(a, b, "Wan", messages, queues, root, wan_env)
            _progress(f"delay: {delay_rate} msg/s for {delay_s} s, with {latency_ms} ms each way")
            wan_delay = _delay(a, b, "WanDelay", (delay_rate, delay_s), queues, root, wan_env)
        _progress(f"delay: {delay_rate} msg/s for {delay_s} s")
        delay = _delay(a, b, "Delay", (delay_rate, delay_s), queues, root, {})
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
            "delay": delay,
            "wan_delay": {"latency_ms_each_way": latency_ms, **wan_delay},
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
    parser.add_argument("--delay-rate", type=int, default=500, help="msg/s of the delay run (500)")
    parser.add_argument("--delay-s", type=float, default=10.0, help="seconds of the delay run (10)")
    parser.add_argument("--keep", type=Path, help="run in this (new) directory and keep its logs")
    args = parser.parse_args()
    figures = (args.messages, args.queues, args.latency_ms)
    if args.keep:
        args.keep.mkdir(parents=True)
        print(json.dumps(run(*figures, args.keep, args.delay_rate, args.delay_s), indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="replicator-bench-") as directory:
        print(json.dumps(run(*figures, Path(directory), args.delay_rate, args.delay_s), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
