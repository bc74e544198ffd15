"""The remoting codec and the message conversion, without processes.

Properties checked:
- a command survives encode -> decode with a JSON header and with RocketMQ's binary
  header; every extFields value is answered as a string (numbers, booleans too);
- an answer echoes the request's opaque and carries the response flag;
- fastjson bodies: integer map keys are written unquoted and read back quoted or not;
- V1 message records round-trip (topic, queue, offsets, body, properties, body CRC), and
  the layout's fixed positions are those the clients read (magic at 4, queue offset at 20);
- a send's properties become the record's tags, keys, message id and born properties, and
  a stored record goes back out with TAGS, KEYS and UNIQ_KEY (its own id when it had none);
- fuzz: the decoders (frames, bodies, message records) raise nothing but FrameError, and a
  frame length outside the bound is refused.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqmeta.codec import remoting as codec
from mqmeta.formats.properties import BORN_HOST, BORN_MS, MESSAGE_ID
from mqmeta.formats.records import StoredRecord
from mqmeta.remoting.messages import MessageRefused, tag_set, to_record, to_wire

pytestmark = pytest.mark.timeout(60)


def _frame(command: codec.Command, binary: bool = False) -> codec.Command:
    data = codec.encode_binary(command) if binary else codec.encode(command)
    length = codec.frame_length(data[:4])
    assert length == len(data) - 4
    return codec.decode_frame(data[4:])


@pytest.mark.parametrize("binary", [False, True])
def test_command_round_trips(binary):
    sent = codec.Command(310, 42, codec.FLAG_ONEWAY, "why", {"a": "g1", "e": "3"}, b"\x00body\xff")
    got = _frame(sent, binary)
    assert (got.code, got.opaque, got.flag, got.remark, got.ext, got.body) == (
        310,
        42,
        codec.FLAG_ONEWAY,
        "why",
        {"a": "g1", "e": "3"},
        b"\x00body\xff",
    )
    assert got.is_oneway and not got.is_response


def test_answers_echo_the_opaque_with_string_values():
    request = codec.Command(codec.PULL_MESSAGE, 9)
    answer = request.answer(codec.PULL_NOT_FOUND, "none", {"nextBeginOffset": 5, "ok": True, "x": None})
    data = codec.encode(answer)
    header = json.loads(data[8 : 8 + struct.unpack(">i", data[4:8])[0]])
    assert header["opaque"] == 9 and header["flag"] & codec.FLAG_RESPONSE
    assert header["extFields"] == {"nextBeginOffset": "5", "ok": "true"}


def test_json_header_values_of_any_type_are_read_as_text():
    header = json.dumps(
        {"code": "105", "opaque": 3, "flag": 0, "extFields": {"topic": "T", "queueId": 2, "batch": False}}
    ).encode()
    got = codec.decode_frame(struct.pack(">i", len(header)) + header)
    assert got.code == 105 and got.ext == {"topic": "T", "queueId": "2", "batch": "false"}


def test_fastjson_integer_keys():
    body = codec.fastjson_dumps({"brokerAddrs": {0: "127.0.0.1:1", 1: "h:2"}, "list": [1, "x"]})
    assert body == b'{"brokerAddrs":{0:"127.0.0.1:1",1:"h:2"},"list":[1,"x"]}'
    assert codec.fastjson_loads(body)["brokerAddrs"] == {"0": "127.0.0.1:1", "1": "h:2"}
    assert codec.fastjson_loads(b'{"a": {"0": 1}}') == {"a": {"0": 1}}


def test_v1_message_record_round_trips_at_the_clients_positions():
    message = codec.WireMessage(
        topic="T",
        queue_id=3,
        body=b"hello",
        properties={"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "ID1"},
        queue_offset=17,
        commit_offset=4096,
        store_timestamp_ms=1_700_000_000_000,
        born_timestamp_ms=1_699_999_999_000,
        store_host=(bytes([10, 0, 0, 1]), 10911),
        born_host=(bytes([10, 0, 0, 2]), 5555),
        reconsume_times=2,
    )
    data = codec.encode_message(message)
    assert struct.unpack_from(">I", data, 4)[0] == codec.MESSAGE_MAGIC_V1
    assert struct.unpack_from(">q", data, 20)[0] == 17  # queue offset after size, magic, CRC, queue, flag
    assert struct.unpack_from(">i", data, 8)[0] == codec.body_crc(b"hello")
    assert codec.decode_messages(data + data) == [message, message]


def test_properties_text():
    text = codec.encode_properties({"a": "1", "b": ""})
    assert text == "a\x011\x02b\x01\x02"
    assert codec.decode_properties(text + "junk\x02") == {"a": "1", "b": ""}


def test_send_becomes_a_record_and_comes_back():
    props = codec.encode_properties(
        {"TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "WAIT": "true", "p": "v"}
    )
    sent = to_record("T", 1, b"body", props, 123, "10.0.0.9:4000", "pg")
    record = sent.record
    assert (record.tags, record.keys, sent.message_id, sent.delay_level) == ("tagA", "k1 k2", "U1", 0)
    assert record.properties == {"p": "v", MESSAGE_ID: "U1", BORN_MS: "123", BORN_HOST: "10.0.0.9:4000"}
    stored = StoredRecord(
        commit_offset=100,
        size=200,
        epoch=1,
        store_timestamp_ms=999,
        topic="T",
        queue_id=1,
        queue_offset=5,
        msg_id="ab" * 16,
        producer_id="pg",
        producer_seq=0,
        tags=record.tags,
        keys=record.keys,
        properties=record.properties,
        body=record.body,
    )
    wire = to_wire(stored, (bytes(4), 1))
    assert wire.properties == {"p": "v", "TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}
    assert (wire.born_timestamp_ms, wire.born_host) == (123, (bytes([10, 0, 0, 9]), 4000))
    native = StoredRecord(**{**stored.__dict__, "properties": {}, "tags": "", "keys": ""})
    assert to_wire(native, (bytes(4), 1)).properties == {"UNIQ_KEY": "ab" * 16}


def test_sends_breaking_record_limits_are_refused():
    with pytest.raises(MessageRefused):
        to_record("T", 0, b"x", codec.encode_properties({"TAGS": "a|b"}), 0, "", "")
    with pytest.raises(MessageRefused):
        to_record("T", 0, b"x", codec.encode_properties({"__RMQ_MSG_ID": "forged"}), 0, "", "")


def test_tag_expressions():
    assert tag_set("*") is None and tag_set("") is None
    assert tag_set("tagA || tagB") == frozenset({"tagA", "tagB"})


def test_frame_length_is_bounded():
    with pytest.raises(codec.FrameError):
        codec.frame_length(struct.pack(">i", codec.FRAME_BYTES_MAX + 1))
    with pytest.raises(codec.FrameError):
        codec.frame_length(struct.pack(">i", -1))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_frames_raise_only_frame_errors(data):
    try:
        codec.decode_frame(data)
    except codec.FrameError:
        pass


@settings(max_examples=120, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["code", "opaque", "flag", "version", "remark", "language", "extFields", "x"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=4,
        ),
    ),
    st.sampled_from([0, 1, 2]),
)
def test_fuzz_json_headers_raise_only_frame_errors(header, kind):
    data = json.dumps(header).encode()
    try:
        command = codec.decode_frame(struct.pack(">i", (kind << 24) | len(data)) + data)
    except codec.FrameError:
        return
    assert all(isinstance(v, str) for v in command.ext.values())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_fuzz_bodies_and_messages_raise_only_frame_errors(data):
    for decode in (codec.fastjson_loads, codec.decode_messages):
        try:
            decode(data)
        except codec.FrameError:
            pass
    try:
        codec.inflate_body(data, 1024)
    except codec.FrameError:
        pass
