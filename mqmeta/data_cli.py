"""`mqmeta produce` and `mqmeta consume`: the data plane from the command line.

--record writes one JSON line per acknowledged (produce) or received (consume)
message: {"msg_id", "value", "queue_id", "queue_offset"} (consume adds "broker_name"),
plus "tag" and "keys" when the message has them (produce --tag TAG --keys K1,K2) and, on
consume, "origin" for a message a replicator copied (cluster, broker_name, topic,
queue_id, queue_offset, path).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from mqmeta.broker_client import Consumer, Producer
from mqmeta.context import NAMESRV, add_context_flags
from mqmeta.errors import InvalidArgument, MqmetaError
from mqmeta.formats import origin as origin_format
from mqmeta.formats.records import TAGS_BYTES_MAX
from mqmeta.validate import FlagNumber

SIZE_MAX = 4 << 20
COUNT_MAX = 10_000_000
BATCH_MAX = 1024
# Batching as Kafka's producer does it (batch.size, linger.ms): a send carries up to
# --batch messages, and a message waits at most --linger-ms for others to join it.
BATCH_DEFAULT = 32
LINGER_MS_DEFAULT, LINGER_MS_MAX = 5, 60_000
RATE_MIN, RATE_MAX = 0.001, 1_000_000.0  # messages per second (below: a pause past any run; 1/rate overflows)
UNTIL_IDLE_S_MIN, UNTIL_IDLE_S_MAX = 0.01, 86_400.0  # a day of silence at most


def add_parser(subparsers: Any) -> None:
    """`mqmeta produce` and `mqmeta consume`."""
    # help: its line in `mqmeta --help` (argparse lists only parsers given one; mqmeta.cli
    # fills every line's text from its COMMANDS table)
    produce = subparsers.add_parser(
        "produce",
        help="",
        epilog="Messages are sent in batches, as Kafka's producer sends them: a send carries up to "
        "--batch messages, and with --rate a message waits at most --linger-ms for others to join "
        "its batch.",
    )
    add_context_flags(produce, NAMESRV)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--count", type=FlagNumber("--count", int, 1, COUNT_MAX), required=True)
    produce.add_argument(
        "--size",
        type=FlagNumber("--size", int, 1, SIZE_MAX),
        default=64,
        help="body bytes (at least the value's length)",
    )
    produce.add_argument(
        "--rate", type=FlagNumber("--rate", float, RATE_MIN, RATE_MAX), help="messages per second at most"
    )
    produce.add_argument(
        "--batch",
        type=FlagNumber("--batch", int, 1, BATCH_MAX),
        default=BATCH_DEFAULT,
        help=f"messages per send at most (default {BATCH_DEFAULT}; 1 sends each message alone)",
    )
    produce.add_argument(
        "--linger-ms",
        type=FlagNumber("--linger-ms", int, 0, LINGER_MS_MAX),
        default=LINGER_MS_DEFAULT,
        help=f"with --rate, how long a message may wait for others to fill its batch (default "
        f"{LINGER_MS_DEFAULT})",
    )
    produce.add_argument("--tag", default="", help="every message's tag (consumers filter on it)")
    produce.add_argument("--keys", default="", help="every message's keys, K1,K2 (stored space-separated)")
    produce.add_argument("--record", type=Path, help="JSON line per acknowledged message")
    produce.add_argument("--json", action="store_true")

    consume = subparsers.add_parser("consume", help="")
    add_context_flags(consume, NAMESRV)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--group", required=True)
    consume.add_argument(
        "--until-idle",
        type=FlagNumber("--until-idle", float, UNTIL_IDLE_S_MIN, UNTIL_IDLE_S_MAX),
        default=5.0,
        help="stop after this many seconds without a new message",
    )
    consume.add_argument("--record", type=Path, help="JSON line per received message")
    consume.add_argument("--json", action="store_true")


def _keys(text: str) -> str:
    """--keys K1,K2 as the message's keys field (RocketMQ's space-separated KEYS)."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if any(" " in k for k in keys):
        raise InvalidArgument(f"--keys {text!r}: a key cannot hold a space; separate keys with commas")
    return " ".join(keys)


def _origin_fields(properties) -> dict[str, object]:
    """A replicated message's origin, for a --record line (empty for one that was not)."""
    try:
        found = origin_format.origin_of(properties)
    except InvalidArgument:
        return {}
    if found is None:
        return {}
    return {
        "origin": {
            "cluster": found.key.cluster,
            "broker_name": found.key.broker_name,
            "topic": found.key.topic,
            "queue_id": found.key.queue_id,
            "queue_offset": found.offset,
            "path": origin_format.path_of(properties),
        }
    }


def _run_produce(args: argparse.Namespace) -> int:
    run_id = uuid.uuid4().hex[:8]
    keys = _keys(args.keys)
    if len(args.tag.encode()) > TAGS_BYTES_MAX or "||" in args.tag:
        raise InvalidArgument(f"--tag must be at most {TAGS_BYTES_MAX} bytes without ||")
    labels: dict[str, object] = {"tag": args.tag} if args.tag else {}
    if keys:
        labels["keys"] = keys.split(" ")
    producer = Producer(args.namesrv)
    record = _open_record(args.record)
    sent = acked = failed = 0
    last_error = ""
    start = time.monotonic()
    try:
        for batch in _batches(args.count, args.batch, args.linger_ms / 1000, args.rate, start):
            values = [f"{run_id}-{i}" for i in batch]
            bodies = [v.encode().ljust(args.size, b".") for v in values]
            sent += len(values)
            try:
                results = producer.send(args.topic, bodies, tags=args.tag, keys=[keys] * len(bodies))
            except MqmetaError as error:
                if "does not exist" in error.message or acked == 0:
                    raise  # the run cannot start (nothing listens, no such topic): one sentence
                failed += len(values)
                if error.message != last_error:  # a burst of one failure is one line
                    print(f"mqmeta produce: not acknowledged: {error.message}", file=sys.stderr)
                    last_error = error.message
                continue
            acked += len(results)
            if record:
                _record_sent(record, values, results, labels)
    finally:
        producer.close()
        if record:
            record.close()
    summary = {
        "sent": sent,
        "acked": acked,
        "failed": failed,
        "elapsed_s": round(time.monotonic() - start, 3),
    }
    print(
        json.dumps(summary)
        if args.json
        else f"sent {sent}, acknowledged {acked}, failed {failed} in {summary['elapsed_s']} s"
    )
    return 0 if failed == 0 else 1


def _batches(
    count: int, batch_max: int, linger_s: float, rate: float | None, start: float
) -> Iterator[range]:
    """The message indexes of each send, when it is due. Without --rate every message is
    ready at once: full batches. With it, message i is ready at start + i / rate, and a
    batch takes the messages ready within linger_s of its first (at most batch_max)."""
    first = 0
    while first < count:
        last = min(count, first + batch_max)
        if rate:
            lingering = first + 1 + math.floor(linger_s * rate)  # ready by the first's linger end
            last = min(last, lingering)
            _pace(start, last - 1, rate)
        yield range(first, last)
        first = last


def _record_sent(record: TextIO, values: list[str], results: list[Any], labels: dict[str, object]) -> None:
    for value, result in zip(values, results, strict=True):
        line = {
            "msg_id": result.msg_id,
            "value": value,
            "queue_id": result.queue_id,
            "queue_offset": result.queue_offset,
            **labels,
        }
        record.write(json.dumps(line) + "\n")
    record.flush()


def _open_record(path: Path | None):
    if path is None:
        return None
    try:
        return open(path, "a")
    except OSError as exc:
        raise InvalidArgument(f"cannot write --record {path}: {exc.strerror}") from None


def _pace(start: float, sent: int, rate: float) -> None:
    due = start + sent / rate
    delay = due - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _run_consume(args: argparse.Namespace) -> int:
    consumer = Consumer(args.namesrv, args.topic, args.group)
    record = _open_record(args.record)
    received = 0
    start = last_new = time.monotonic()
    try:
        while time.monotonic() - last_new < args.until_idle:
            try:
                messages = consumer.poll()
            except MqmetaError as error:
                if "does not exist" in error.message:
                    raise
                print(f"mqmeta consume: {error.message}; retrying", file=sys.stderr)
                consumer.refresh()
                time.sleep(0.2)
                continue
            if not messages:
                time.sleep(0.05)
                continue
            last_new = time.monotonic()
            received += len(messages)
            if record:
                for m in messages:
                    value = m.body.decode(errors="replace").rstrip(".")
                    record.write(
                        json.dumps(
                            {
                                "msg_id": m.msg_id,
                                "value": value,
                                "queue_id": m.queue_id,
                                "queue_offset": m.queue_offset,
                                **({"tag": m.tags} if m.tags else {}),
                                **({"keys": m.keys.split(" ")} if m.keys else {}),
                                **_origin_fields(m.properties),
                            }
                        )
                        + "\n"
                    )
                record.flush()
    finally:
        try:
            consumer.commit()  # what was received and recorded is marked consumed
        except MqmetaError as error:
            print(f"mqmeta consume: offsets not committed: {error.message}", file=sys.stderr)
        consumer.close()
        if record:
            record.close()
    summary = {"received": received, "elapsed_s": round(time.monotonic() - start, 3)}
    print(json.dumps(summary) if args.json else f"received {received} in {summary['elapsed_s']} s")
    return 0


_RUNS: dict[str, Callable[[argparse.Namespace], int]] = {"produce": _run_produce, "consume": _run_consume}


def run(args: argparse.Namespace) -> int:
    """`mqmeta produce` or `mqmeta consume`, as args.command names."""
    return _RUNS[args.command](args)
