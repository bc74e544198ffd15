"""Drives a RocketMQ 4.x Python client (rocketmq-client-python 2.0.0 or rocketmq 0.4.4,
both ctypes bindings of the C++ client) in its own process: the test session puts the
client's directory on PYTHONPATH. One JSON line per message sent or received.

    python remoting_driver.py produce NAMESRV TOPIC GROUP COUNT TAG KEYS PREFIX
    python remoting_driver.py consume NAMESRV TOPIC GROUP EXPRESSION EXPECTED TIMEOUT_S
    python remoting_driver.py consume-failing NAMESRV TOPIC GROUP DELIVERIES TIMEOUT_S
    python remoting_driver.py produce-orderly NAMESRV TOPIC GROUP COUNT KEYS
    python remoting_driver.py produce-batch NAMESRV TOPIC GROUP COUNT
    python remoting_driver.py produce-timed NAMESRV TOPIC GROUP COUNT SIZE
    python remoting_driver.py produce-stream NAMESRV TOPIC GROUP STOP_FILE MAX_S
    python remoting_driver.py consume-stream NAMESRV TOPIC GROUP STOP_FILE MAX_S ORDERLY

The stream commands run until STOP_FILE exists (at most MAX_S) and print each line as it
happens, with its wall time `t`: a send acknowledged (`ok`) or failed (`error`), a message
received.
"""

from __future__ import annotations

import json
import os
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


def consume_failing(namesrv: str, topic: str, group: str, deliveries: int, timeout_s: float) -> int:
    """A push consumer whose listener fails every message (RECONSUME_LATER): the client
    sends each back, and it comes again through %RETRY%GROUP until the broker moves it to
    %DLQ%GROUP. One line per delivery, with its reconsume times, once DELIVERIES are seen
    (and one quiet second more) or TIMEOUT_S passed."""
    received: list[dict] = []
    lock = threading.Lock()

    def on_message(message):
        record = {
            "value": message.body.decode(),
            "msg_id": _text(message.id),
            "reconsume_times": message.reconsume_times,
            "t": time.time(),
        }
        with lock:
            received.append(record)
        return client.ConsumeStatus.RECONSUME_LATER

    consumer = client.PushConsumer(group)
    _namesrv(consumer, namesrv)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with lock:
                if len(received) >= deliveries:
                    break
            time.sleep(0.05)
        time.sleep(1.0)  # a delivery beyond the last one allowed arrives too (and fails the test)
    finally:
        consumer.shutdown()
    with lock:
        for record in received:
            print(json.dumps(record), flush=True)
    return 0


def produce_orderly(namesrv: str, topic: str, group: str, count: int, keys: int) -> int:
    """COUNT messages, message i with sharding key k{i % KEYS} (one queue per key)."""
    producer = client.Producer(group, orderly=True)
    _namesrv(producer, namesrv)
    producer.start()
    try:
        for i in range(count):
            message = client.Message(topic)
            message.set_body(f"o-{i}")
            key = f"k{i % keys}"
            message.set_keys(key)
            result = producer.send_orderly_with_sharding_key(message, key)
            print(json.dumps({"value": f"o-{i}", "key": key, "status": int(result.status)}), flush=True)
    finally:
        producer.shutdown()
    return 0


def produce_batch(namesrv: str, topic: str, group: str, count: int) -> int:
    """One batch of COUNT messages (rocketmq 0.4.4's send_batch), each with keys b-i."""
    producer = client.Producer(group)
    _namesrv(producer, namesrv)
    producer.start()
    try:
        messages = []
        for i in range(count):
            message = client.Message(topic)
            message.set_body(f"b-{i}")
            message.set_keys(f"b-{i}")
            messages.append(message)
        result = producer.send_batch(messages)
        print(json.dumps({"status": int(result.status), "msg_id": result.msg_id, "offset": result.offset}))
    finally:
        producer.shutdown()
    return 0


def produce_signed(namesrv: str, topic: str, access_key: str, secret_key: str) -> int:
    """One send with RocketMQ ACL credentials (for a test that reads the signed request)."""
    producer = client.Producer("pg-signed", timeout=2000)
    _namesrv(producer, namesrv)
    producer.set_session_credentials(access_key, secret_key, "ALIYUN")
    producer.start()
    try:
        message = client.Message(topic)
        message.set_body("signed")
        producer.send_sync(message)
    except Exception as exc:  # the listener never answers
        print(json.dumps({"error": str(exc)[:200]}), flush=True)
    finally:
        producer.shutdown()
    return 0


def produce_timed(namesrv: str, topic: str, group: str, count: int, size: int) -> int:
    """COUNT sync sends of SIZE bytes, one after another, after 20 to warm up: the seconds taken."""
    producer = client.Producer(group)
    _namesrv(producer, namesrv)
    producer.start()
    body = "x" * size
    try:
        for _ in range(20):
            message = client.Message(topic)
            message.set_body(body)
            producer.send_sync(message)
        start = time.perf_counter()
        for _ in range(count):
            message = client.Message(topic)
            message.set_body(body)
            producer.send_sync(message)
        print(json.dumps({"count": count, "elapsed_s": time.perf_counter() - start}), flush=True)
    finally:
        producer.shutdown()
    return 0


def produce_tls(namesrv: str, topic: str, properties_file: str) -> int:
    """One send over TLS: the C++ client's SetProducerSsl and its property file (tls.client.*),
    which the binding does not wrap, called through its library."""
    import ctypes

    from rocketmq.ffi import dll

    producer = client.Producer("pg-tls", timeout=2000)
    _namesrv(producer, namesrv)
    dll.SetProducerSsl.argtypes = [ctypes.c_void_p, ctypes.c_int]
    dll.SetProducerSslPropertyFile.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    dll.SetProducerSsl(producer._handle, 1)
    dll.SetProducerSslPropertyFile(producer._handle, properties_file.encode())
    producer.start()
    try:
        message = client.Message(topic)
        message.set_body("tls")
        producer.send_sync(message)
    except Exception as exc:  # the listener never answers
        print(json.dumps({"error": str(exc)[:200]}), flush=True)
    finally:
        producer.shutdown()
    return 0


def produce_stream(namesrv: str, topic: str, group: str, stop_file: str, max_s: float) -> int:
    producer = client.Producer(group)
    _namesrv(producer, namesrv)
    producer.start()
    deadline = time.monotonic() + max_s
    i = 0
    try:
        while time.monotonic() < deadline and not os.path.exists(stop_file):
            message = client.Message(topic)
            message.set_body(f"s-{i}")
            try:
                result = producer.send_sync(message)
                line = {"value": f"s-{i}", "ok": int(result.status) == 0, "msg_id": result.msg_id}
            except Exception as exc:  # the client gave up on this send (timeout, no route)
                line = {"value": f"s-{i}", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                time.sleep(0.05)
            print(json.dumps({**line, "t": time.time()}), flush=True)
            i += 1
    finally:
        producer.shutdown()
    return 0


def consume_stream(namesrv: str, topic: str, group: str, stop_file: str, max_s: float, orderly: bool) -> int:
    lock = threading.Lock()
    success = getattr(getattr(client, "ConsumeStatus", None), "CONSUME_SUCCESS", None)

    def on_message(message):
        line = {
            "value": message.body.decode(),
            "queue_id": message.queue_id,
            "queue_offset": message.queue_offset,
            "keys": _text(message.keys),
            "t": time.time(),
        }
        with lock:
            print(json.dumps(line), flush=True)
        return success

    consumer = client.PushConsumer(group, orderly=orderly) if orderly else client.PushConsumer(group)
    _namesrv(consumer, namesrv)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    deadline = time.monotonic() + max_s
    try:
        while time.monotonic() < deadline and not os.path.exists(stop_file):
            time.sleep(0.05)
    finally:
        consumer.shutdown()  # commits the consumed offsets
    return 0


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "produce":
        sys.exit(produce(args[0], args[1], args[2], int(args[3]), args[4], args[5], args[6]))
    if command == "consume":
        sys.exit(consume(args[0], args[1], args[2], args[3], int(args[4]), float(args[5])))
    if command == "consume-failing":
        sys.exit(consume_failing(args[0], args[1], args[2], int(args[3]), float(args[4])))
    if command == "produce-tls":
        sys.exit(produce_tls(args[0], args[1], args[2]))
    if command == "produce-signed":
        sys.exit(produce_signed(args[0], args[1], args[2], args[3]))
    if command == "produce-orderly":
        sys.exit(produce_orderly(args[0], args[1], args[2], int(args[3]), int(args[4])))
    if command == "produce-batch":
        sys.exit(produce_batch(args[0], args[1], args[2], int(args[3])))
    if command == "produce-timed":
        sys.exit(produce_timed(args[0], args[1], args[2], int(args[3]), int(args[4])))
    if command == "produce-stream":
        sys.exit(produce_stream(args[0], args[1], args[2], args[3], float(args[4])))
    if command == "consume-stream":
        sys.exit(consume_stream(args[0], args[1], args[2], args[3], float(args[4]), args[5] == "orderly"))
    sys.exit(f"unknown command {command}")
