"""Round-trip checks of mqmeta.codec.rocketmq5, run in a process of their own by
tests/test_codec_rocketmq5.py (a pytest process may hold the official client's stubs,
which clash with ours: see tests/support/rmq_client.py).

`python -m tests.support.rocketmq5_codec_checks NAME...` runs the named checks and prints
one JSON object: check name -> "ok" or what failed (hypothesis's falsifying example).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mqmeta.codec import rocketmq5
from mqmeta.formats.records import Message, StoredRecord, decode_record, encode_record
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from tests.support.checks_process import run_named

NOW_MS = 1_800_000_000_000
STORE_MS = NOW_MS + 7
QUEUE_OFFSET = 41
TOPIC_TYPE = {rdef.NORMAL: "NORMAL", rdef.FIFO: "FIFO", rdef.DELAY: "DELAY", rdef.TRANSACTION: "TRANSACTION"}
# What the server sets on a message it delivers (the client sends none of these).
SERVER_FIELDS = ("body_digest", "body_encoding", "store_timestamp", "store_host", "queue_id", "queue_offset")
SYSTEM_PROPERTY_NAMES = {
    rocketmq5.MESSAGE_ID,
    rocketmq5.MESSAGE_TYPE,
    rocketmq5.BORN_MS,
    rocketmq5.BORN_HOST,
    rocketmq5.MESSAGE_GROUP,
    rocketmq5.DELIVER_MS,
}

names = st.from_regex(r"[A-Za-z0-9_\-]{1,40}", fullmatch=True)
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
tags = text.filter(lambda t: t.strip() != "" and "|" not in t)
keys = st.lists(text.filter(lambda k: k.strip() != "" and " " not in k), max_size=4)
user_keys = text.filter(lambda k: k != "" and not k.startswith(rocketmq5.PROPERTY_PREFIX))
user_properties = st.dictionaries(user_keys, text, max_size=6)
millis = st.integers(min_value=946_684_800_000, max_value=NOW_MS)


def timestamp(ms: int) -> dict[str, int]:
    return {"seconds": ms // 1000, "nanos": (ms % 1000) * 1_000_000}


@st.composite
def sends(draw: st.DrawFn) -> rdef.Message:
    """A valid message of a SendMessage, of any type, with every field the codec carries."""
    kind = draw(st.sampled_from(sorted(TOPIC_TYPE)))
    system = rdef.SystemProperties(
        keys=draw(keys),
        message_id=draw(st.from_regex(r"[0-9A-F]{1,128}", fullmatch=True)),
        message_type=kind,  # type: ignore[arg-type]
        born_timestamp=timestamp(draw(millis)),  # type: ignore[arg-type]
        born_host=draw(text),
    )
    if draw(st.booleans()):
        system.tag = draw(tags)
    if kind == rdef.FIFO:
        system.message_group = draw(names)
    if kind == rdef.DELAY:
        ahead = draw(st.integers(min_value=1, max_value=3 * 24 * 3600 * 1000))
        system.delivery_timestamp.CopyFrom(Timestamp(**timestamp(NOW_MS + ahead)))
    return rdef.Message(
        topic=rdef.Resource(name=draw(names)),
        user_properties=draw(user_properties),
        system_properties=system,
        body=draw(st.binary(min_size=1, max_size=256)),
    )


def queue_of(group: str) -> int:
    """A queue no property could carry by accident: derived from the group, or 7."""
    return 1 + len(group) if group else 7


def through_the_store(record: Message) -> StoredRecord:
    """The record as the commit log holds and returns it (its byte format round trip)."""
    data = encode_record(record, 3, STORE_MS, QUEUE_OFFSET, "0" * 32)
    return decode_record(data, 0, 0)


EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
NO_SHRINK = settings(EXAMPLES, phases=[Phase.generate])  # a planted fault: found is enough


def check_wire_record_wire(
    to_message: Callable = rocketmq5.to_message, shrink: bool = True
) -> Callable[[], None]:
    """wire -> record -> commit-log bytes -> record -> wire gives back every field sent."""

    @(EXAMPLES if shrink else NO_SHRINK)
    @given(sends())
    def check(sent: rdef.Message) -> None:
        send = rocketmq5.to_record(
            sent, TOPIC_TYPE[sent.system_properties.message_type], "client-1", NOW_MS, queue_of
        )
        assert send.record.queue_id == queue_of(sent.system_properties.message_group)
        smuggled = set(send.record.properties) - set(sent.user_properties) - SYSTEM_PROPERTY_NAMES
        assert not smuggled, f"the record carries properties the client did not send: {smuggled}"
        assert send.record.producer_id == "client-1"
        received = to_message(through_the_store(send.record), send.record.topic, "127.0.0.1:1")
        assert received.system_properties.queue_id == send.record.queue_id
        assert received.system_properties.queue_offset == QUEUE_OFFSET
        assert received.system_properties.store_timestamp.ToMilliseconds() == STORE_MS
        for name in SERVER_FIELDS:
            received.system_properties.ClearField(name)
        assert received == sent, f"sent:\n{sent}\nreceived:\n{received}"

    return check


def check_record_wire_record() -> None:
    """record -> wire -> record gives back the same record, properties and queue included."""

    @EXAMPLES
    @given(sends())
    def check(sent: rdef.Message) -> None:
        topic_type = TOPIC_TYPE[sent.system_properties.message_type]
        first = rocketmq5.to_record(sent, topic_type, "client-1", NOW_MS, queue_of).record
        stored = through_the_store(first)
        wire = rocketmq5.to_message(stored, stored.topic, "127.0.0.1:1")
        again = rocketmq5.to_record(
            wire, topic_type, stored.producer_id, NOW_MS, lambda _: stored.queue_id
        ).record
        assert again == first and dict(again.properties) == dict(first.properties), (first, again)

    check()


def check_a_dropped_field_fails_the_round_trip() -> None:
    """The round-trip check can fail: a codec that drops any one carried field fails it."""
    system = ["tag", "keys", "message_id", "message_type", "born_timestamp", "born_host", "message_group"]
    carried = [(True, name) for name in [*system, "delivery_timestamp"]]
    carried += [(False, name) for name in ("user_properties", "body", "topic")]
    for in_system, name in carried:

        def dropping(record, topic, store_host, in_system=in_system, name=name):
            message = rocketmq5.to_message(record, topic, store_host)
            (message.system_properties if in_system else message).ClearField(name)
            return message

        try:
            check_wire_record_wire(dropping, shrink=False)()
        except AssertionError:
            continue
        raise AssertionError(f"a codec that drops {name} passed the round trip")


CHECKS: dict[str, Callable[[], None]] = {
    "wire_record_wire": lambda: check_wire_record_wire()(),
    "record_wire_record": check_record_wire_record,
    "a_dropped_field_fails_the_round_trip": check_a_dropped_field_fails_the_round_trip,
}


if __name__ == "__main__":
    run_named(CHECKS, sys.argv[1:])
