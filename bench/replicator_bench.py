#!/usr/bin/env python
"""Benchmark of cross-cluster replication: two local clusters (a, b; one controller, one
broker set of 2 replicas each) and one `mqmeta replicator` worker.

    .venv/bin/python bench/replicator_bench.py [--messages N] [--queues Q]

Prints ONE JSON document on stdout; progress goes to stderr. In one run:
direct       N messages of 1 KB produced straight into b (batches of 32, one thread):
             the target's own ingest rate, the yardstick;
replicated   N messages of 1 KB produced into a first (a backlog), then a worker
             started with a rule a -> b (start = earliest): messages/s and MB/s from its
             first copy to its last (read from its metrics), and from its start;
ratio        replicated / direct (the issue's target: >= 0.5).
Not measured yet: the same across 50 ms of added latency, end-to-end delay p50/p99.

Every wait is bounded; every child process is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.harness import Cluster  # noqa: E402
from cluster.wait import wait_for  # noqa: E402
from mqmeta.broker_client import Producer  # noqa: E402
from mqmeta.pb import controller_pb2 as pb  # noqa: E402

BODY_BYTES = 1024
BATCH = 32
REPLICATE_TIMEOUT_S = 300.0


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


def _replicated(log_file: Path) -> float:
    found = re.search(r"metrics on (\S+)", log_file.read_text()) if log_file.exists() else None
    if found is None:
        return 0.0
    with urllib.request.urlopen(f"http://{found.group(1)}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(
        float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("mqmeta_replicator_replicated_total")
    )


def run(messages: int, queues: int, root: Path) -> dict[str, object]:
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
            with cluster.client() as client:
                for topic in ("Bench", "Direct"):
                    client.call("CreateTopic", pb.TopicSpec(name=topic, cluster=name, queue_count=queues))
        a, b = sites
        _progress(f"direct: {messages} x 1 KB into b")
        direct_s = _produce(b, "Direct", messages)
        _progress(f"backlog: {messages} x 1 KB into a")
        _produce(a, "Bench", messages)
        config = root / "replicator.toml"
        config.write_text(
            f'[[rules]]\nname = "bench"\nsource_namesrv = "{a.namesrv}"\ntarget_namesrv = "{b.namesrv}"\n'
            'topic = "Bench"\nstart = "earliest"\n'
        )
        command = [sys.executable, "-m", "mqmeta.cli", "replicator", "--config", str(config)]
        started = time.monotonic()
        b.supervisor.start("replicator", [*command, "--metrics-listen", "127.0.0.1:0"])
        log_file = b.root / "logs" / "replicator.log"
        wait_for(lambda: _replicated(log_file), REPLICATE_TIMEOUT_S, "the first copy", interval_s=0.05)
        first_copy = time.monotonic()
        wait_for(
            lambda: _replicated(log_file),
            REPLICATE_TIMEOUT_S,
            f"{messages} copies",
            until=lambda n: n >= messages,
            interval_s=0.05,
        )
        done = time.monotonic()
        direct_rate = messages / direct_s
        replicated_rate = messages / max(done - first_copy, 1e-6)
        return {
            "messages": messages,
            "body_bytes": BODY_BYTES,
            "queues": queues,
            "direct": {"messages_per_s": round(direct_rate), "mb_per_s": round(direct_rate / 1024, 2)},
            "replicated": {
                "messages_per_s": round(replicated_rate),
                "mb_per_s": round(replicated_rate / 1024, 2),
                "seconds_from_worker_start": round(done - started, 2),
                "seconds_from_first_copy": round(done - first_copy, 2),
            },
            "ratio": round(replicated_rate / direct_rate, 2),
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replicator-bench-") as directory:
        print(json.dumps(run(args.messages, args.queues, Path(directory)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
