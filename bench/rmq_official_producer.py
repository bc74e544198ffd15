"""The official RocketMQ 5 Python client as a steady producer, in a process of its own
(its apache.rocketmq.v2 stubs cannot share one with mqmeta's).

    python -m bench.rmq_official_producer --endpoints HOST:PORT[;HOST:PORT] --topic T
        [--interval-ms 20] [--duration-s 600] [--request-timeout-s 3]

One sync send every --interval-ms; prints `ok T` or `fail T` per send (T: this host's
CLOCK_MONOTONIC, which the parent shares) until stdin closes or --duration-s passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--request-timeout-s", type=int, default=3)  # the client wants an int
    args = parser.parse_args()
    os.environ["HOME"] = tempfile.mkdtemp(prefix="rmq-bench-home-")  # the client's logs
    import rocketmq

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    config = rocketmq.ClientConfiguration(
        args.endpoints, rocketmq.Credentials(), request_timeout=args.request_timeout_s
    )
    producer = rocketmq.Producer(config, (args.topic,))
    producer.startup()
    print("ready", time.monotonic(), flush=True)
    end = time.monotonic() + args.duration_s
    i = 0
    last_error = ""
    try:
        while not stop.is_set() and time.monotonic() < end:
            m = rocketmq.Message()
            m.topic, m.body = args.topic, f"gap-{i}".encode()
            try:
                producer.send(m)
                print("ok", time.monotonic(), flush=True)
            except Exception as exc:
                print("fail", time.monotonic(), flush=True)
                if repr(exc) != last_error:  # a burst of one failure is one line
                    last_error = repr(exc)
                    print(f"send failed: {last_error}", file=sys.stderr, flush=True)
            i += 1
            stop.wait(args.interval_ms / 1000)
    finally:
        producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
