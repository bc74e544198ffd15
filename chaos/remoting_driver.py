"""The C++ client's side of `mqmeta chaos run --client remoting`, run as a script in a
process of its own (PYTHONPATH: rocketmq-client-python 2.0.0; LD_LIBRARY_PATH: its
librocketmq.so). It imports nothing of mqmeta. One JSON line per event, flushed:

    python remoting_driver.py produce NAMESRV TOPIC GROUP CLIENT_ID KEYS INTERVAL_S STOP_FILE
    python remoting_driver.py consume NAMESRV TOPIC GROUP STOP_FILE

produce: producer CLIENT_ID sends `CLIENT_ID-SEQ` with sharding key `pCLIENT_ID-kJ` (SEQ %
KEYS) as an orderly send (one key, one queue), body `value|key|send ms`; a `request` line
before each send and a `response` line after (`ok` or the client's error). consume: an
orderly PushConsumer of GROUP; a line with the body of each message received.
"""

import json
import os
import sys
import time

from rocketmq import client


def _line(**fields) -> None:
    print(json.dumps(fields), flush=True)


def produce(namesrv, topic, group, client_id, keys, interval_s, stop_file) -> int:
    producer = client.Producer(group, orderly=True)
    producer.set_name_server_address(namesrv)
    producer.start()
    sequence, next_at = 0, time.monotonic()
    try:
        while not os.path.exists(stop_file):
            key = f"p{client_id}-k{sequence % keys}"
            value = f"{client_id}-{sequence}"
            sent_ms = int(time.time() * 1000)
            _line(kind="request", value=value, key=key, ms=sent_ms)
            message = client.Message(topic)
            message.set_keys(key)
            message.set_body(f"{value}|{key}|{sent_ms}")
            try:
                result = producer.send_orderly_with_sharding_key(message, key)
                _line(
                    kind="response",
                    value=value,
                    key=key,
                    ms=int(time.time() * 1000),
                    ok=int(result.status) == 0,
                )
            except Exception as exc:  # timeouts, refusals after the client's retries: unknown
                info = f"{type(exc).__name__}: {exc}"[:200]
                _line(kind="response", value=value, key=key, ms=int(time.time() * 1000), ok=False, info=info)
            sequence += 1
            next_at = max(next_at + interval_s, time.monotonic() - 1.0)
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        producer.shutdown()
    return 0


def consume(namesrv, topic, group, stop_file) -> int:
    def on_message(message):
        _line(kind="message", body=message.body.decode())
        return client.ConsumeStatus.CONSUME_SUCCESS

    consumer = client.PushConsumer(group, orderly=True)
    consumer.set_name_server_address(namesrv)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    try:
        while not os.path.exists(stop_file):
            time.sleep(0.05)
    finally:
        consumer.shutdown()
    return 0


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "produce":
        sys.exit(produce(args[0], args[1], args[2], int(args[3]), int(args[4]), float(args[5]), args[6]))
    if command == "consume":
        sys.exit(consume(args[0], args[1], args[2], args[3]))
    sys.exit(f"unknown command {command}")
