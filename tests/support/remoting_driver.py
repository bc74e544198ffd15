"""Drives a RocketMQ 4.x Python client (rocketmq-client-python 2.0.0 or rocketmq 0.4.4,
both ctypes bindings of the C++ client) in its own process: the test session puts the
client's directory on PYTHONPATH. One JSON line per message sent or received.

    python remoting_driver.py produce NAMESRV TOPIC GROUP COUNT TAG KEYS PREFIX
    python remoting_driver.py consume NAMESRV TOPIC GROUP EXPRESSION EXPECTED TIMEOUT_S
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq import client


def _namesrv(handle, address: str) -> None:
    setter = getattr(handle, "set_name_server_address", None) or handle.set_namesrv_addr
    setter(address)


def produce(namesrv: str, topic: str, group: str, count: int, tag: str, keys: str, prefix: str) -> int:
    producer = client.Producer(group)
    _namesrv(producer, namesrv)
    producer.start()
    try:
        for i in range(count):
            message = client.Message(topic)
            if keys:
                message.set_keys(keys)
            if tag:
                message.set_tags(tag)
            message.set_property("origin", "remoting")
            message.set_body(f"{prefix}-{i}")
            result = producer.send_sync(message)
            print(
                json.dumps(
                    {
                        "value": f"{prefix}-{i}",
                        "status": int(result.status),
                        "msg_id": result.msg_id,
                        "offset": result.offset,
                    }
                ),
                flush=True,
            )
    finally:
        producer.shutdown()
    return 0


def consume(namesrv: str, topic: str, group: str, expression: str, expected: int, timeout_s: float) -> int:
    received: list[dict] = []
    lock = threading.Lock()
    success = getattr(getattr(client, "ConsumeStatus", None), "CONSUME_SUCCESS", None)

    def on_message(message):
        record = {
            "value": message.body.decode(),
            "tag": message.tags.decode() if isinstance(message.tags, bytes) else message.tags,
            "keys": message.keys.decode() if isinstance(message.keys, bytes) else message.keys,
            "msg_id": message.id.decode() if isinstance(message.id, bytes) else message.id,
            "origin": _text(message.get_property("origin")),
            "queue_id": message.queue_id,
            "queue_offset": message.queue_offset,
        }
        with lock:
            received.append(record)
        return success

    consumer = client.PushConsumer(group)
    _namesrv(consumer, namesrv)
    consumer.subscribe(topic, on_message, expression)
    consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with lock:
                if len(received) >= expected:
                    break
            time.sleep(0.05)
        time.sleep(1.0)  # anything beyond what was expected arrives too (and fails the test)
    finally:
        consumer.shutdown()
    with lock:
        for record in received:
            print(json.dumps(record), flush=True)
    return 0


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "produce":
        sys.exit(produce(args[0], args[1], args[2], int(args[3]), args[4], args[5], args[6]))
    if command == "consume":
        sys.exit(consume(args[0], args[1], args[2], args[3], int(args[4]), float(args[5])))
    sys.exit(f"unknown command {command}")
