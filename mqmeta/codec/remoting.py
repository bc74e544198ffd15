"""RocketMQ's classic "remoting" protocol (what RocketMQ 4.x clients speak): frames,
command headers, fastjson bodies and the V1 message records of pull answers.

A frame is, big-endian:

    int32 length (of everything after it) | int32 (serialize type << 24 | header length)
    | header | body

Header type 0 is JSON `{code, language, version, opaque, flag, remark, extFields}`; type 1
is RocketMQ's binary header (code i16, language u8, version i16, opaque i32, flag i32,
remark i32-length text, extFields i32-length map of (i16-length key, i32-length value)),
which only Java clients configured for it send. Both are read; answers are always JSON
with every extFields value a string (the C++ client reads a non-string value as 0).
Flag bit 0 marks a response, bit 1 a oneway request; a response echoes the opaque.

Bodies are fastjson's JSON: a map with integer keys is written with the keys unquoted
(`{0:"host:port"}`), as RocketMQ before 4.9.4 wrote it and as the C++ client reads it,
and compact (the Go client splits that map's text by hand).

Everything a peer sends is decoded into typed values or refused with FrameError; no other
exception leaves this module's decoders (tests/test_remoting_codec.py fuzzes them).
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqmeta.errors import InvalidArgument

# Request codes (RocketMQ's RequestCode) this package serves or names.
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_MESSAGE = 12
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
VIEW_MESSAGE_BY_ID = 33
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
CONSUMER_SEND_MSG_BACK = 36
GET_CONSUMER_LIST_BY_GROUP = 38
NOTIFY_CONSUMER_IDS_CHANGED = 40
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
GET_ROUTEINFO_BY_TOPIC = 105
SEND_MESSAGE_V2 = 310

# Response codes (RocketMQ's ResponseCode).
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
FLUSH_SLAVE_TIMEOUT = 12
MESSAGE_ILLEGAL = 13
SERVICE_NOT_AVAILABLE = 14
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22

FLAG_RESPONSE = 1
FLAG_ONEWAY = 2
SERIALIZE_JSON = 0
SERIALIZE_BINARY = 1
LANGUAGE = "JAVA"  # what RocketMQ's own servers say; clients do not act on it
VERSION = 399  # a 4.9.x server: the C++ client's pulls and sends need nothing newer

FRAME_BYTES_MAX = 8 << 20  # a 4 MiB body, its properties and header fit many times over
HEADER_BYTES_MAX = 1 << 20
EXT_FIELDS_MAX = 256
LENGTH = struct.Struct(">i")
_FRAME_HEAD = struct.Struct(">ii")
_BINARY_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_I16 = struct.Struct(">h")
LANGUAGES = (
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
)


class FrameError(InvalidArgument):
    """A frame, header or body a peer sent that cannot be read (with what was wrong).
    `opaque` is the request's when the header could be read that far, else 0."""

    default_code = "MALFORMED_FRAME"

    def __init__(self, message: str, opaque: int = 0) -> None:
        super().__init__(message)
        self.opaque = opaque


@dataclass
class Command:
    """One request or response: the header's fields, extFields as text, and the body."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str = ""
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = LANGUAGE
    version: int = VERSION

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def answer(
        self, code: int = SUCCESS, remark: str = "", ext: Mapping[str, Any] | None = None, body: bytes = b""
    ) -> Command:
        """The response to this request: its opaque, the response flag, string values."""
        return Command(code, self.opaque, FLAG_RESPONSE, remark, text_fields(ext or {}), body)


def text_fields(values: Mapping[str, Any]) -> dict[str, str]:
    """extFields as the C++ client reads them: every value a string (booleans as Java
    writes them)."""
    return {str(k): _text(v) for k, v in values.items() if v is not None}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


# Frames ---------------------------------------------------------------------------------------
def frame_length(prefix: bytes, frame_bytes_max: int = FRAME_BYTES_MAX) -> int:
    """The length field of a frame (the 4 bytes that start it), checked against the bound."""
    (length,) = LENGTH.unpack(prefix)
    if not 4 <= length <= frame_bytes_max:
        raise FrameError(f"frame length {length} is outside 4..{frame_bytes_max} bytes")
    return length


def decode_frame(frame: bytes) -> Command:
    """A command from a frame's bytes after its length field."""
    if len(frame) < 4:
        raise FrameError(f"a frame of {len(frame)} bytes has no header length")
    (mark,) = LENGTH.unpack_from(frame)
    kind, header_length = (mark >> 24) & 0xFF, mark & 0xFFFFFF
    if header_length > len(frame) - 4 or header_length > HEADER_BYTES_MAX:
        raise FrameError(
            f"header length {header_length} exceeds the frame ({len(frame) - 4} bytes after it) "
            f"or {HEADER_BYTES_MAX}"
        )
    header = frame[4 : 4 + header_length]
    if kind == SERIALIZE_JSON:
        command = _decode_json_header(header)
    elif kind == SERIALIZE_BINARY:
        command = _decode_binary_header(header)
    else:
        raise FrameError(f"serialize type {kind} is neither 0 (JSON) nor 1 (RocketMQ binary)")
    command.body = bytes(frame[4 + header_length :])
    return command


def encode(command: Command) -> bytes:
    """A whole frame (length field included) with a JSON header."""
    header: dict[str, Any] = {
        "code": command.code,
        "language": command.language,
        "version": command.version,
        "opaque": command.opaque,
        "flag": command.flag,
        "remark": command.remark,
        "extFields": text_fields(command.ext),
    }
    data = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return _FRAME_HEAD.pack(4 + len(data) + len(command.body), len(data)) + data + command.body


def encode_binary(command: Command) -> bytes:
    """A whole frame with RocketMQ's binary header (what a Java client configured for it
    sends; the servers never answer with it): for tests."""
    remark = command.remark.encode()
    ext = b"".join(
        _I16.pack(len(k.encode())) + k.encode() + LENGTH.pack(len(v.encode())) + v.encode()
        for k, v in text_fields(command.ext).items()
    )
    language = LANGUAGES.index(command.language) if command.language in LANGUAGES else 0
    header = (
        _BINARY_FIXED.pack(command.code, language, command.version, command.opaque, command.flag)
        + LENGTH.pack(len(remark))
        + remark
        + LENGTH.pack(len(ext))
        + ext
    )
    mark = (SERIALIZE_BINARY << 24) | len(header)
    return _FRAME_HEAD.pack(4 + len(header) + len(command.body), mark) + header + command.body


def _int_field(header: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = header.get(name, default)
    if isinstance(value, bool) or value is None:
        raise FrameError(f"header field {name!r} is missing or not a number")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise FrameError(f"header field {name!r} is not a number: {str(value)[:32]!r}") from None
    if not -(1 << 31) <= number < (1 << 31):
        raise FrameError(f"header field {name!r} is outside the 32-bit range")
    return number


def _decode_json_header(header: bytes) -> Command:
    try:
        data = json.loads(header)
    except (ValueError, RecursionError):
        raise FrameError("the header is not JSON") from None
    if not isinstance(data, dict):
        raise FrameError("the header is not a JSON object")
    opaque = _int_field(data, "opaque", 0)
    try:
        code = _int_field(data, "code")
        flag = _int_field(data, "flag", 0)
        version = _int_field(data, "version", 0)
    except FrameError as error:
        raise FrameError(error.message, opaque) from None
    ext = data.get("extFields") or {}
    if not isinstance(ext, dict) or len(ext) > EXT_FIELDS_MAX:
        raise FrameError(f"extFields is not an object of at most {EXT_FIELDS_MAX} fields", opaque)
    remark = data.get("remark")
    language = data.get("language")
    return Command(
        code,
        opaque,
        flag,
        remark if isinstance(remark, str) else "",
        {str(k): _text(v) for k, v in ext.items() if v is not None},
        b"",
        language if isinstance(language, str) else "OTHER",
        version,
    )


def _decode_binary_header(header: bytes) -> Command:
    if len(header) < _BINARY_FIXED.size + 8:
        raise FrameError(f"a binary header of {len(header)} bytes is too short")
    code, language, version, opaque, flag = _BINARY_FIXED.unpack_from(header)
    position = _BINARY_FIXED.size
    remark, position = _sized(header, position, LENGTH, "remark", opaque)
    ext_bytes, position = _sized(header, position, LENGTH, "extFields", opaque)
    if position != len(header):
        raise FrameError(f"{len(header) - position} bytes follow the binary header's fields", opaque)
    ext: dict[str, str] = {}
    at = 0
    while at < len(ext_bytes):
        key, at = _sized(ext_bytes, at, _I16, "extFields key", opaque)
        value, at = _sized(ext_bytes, at, LENGTH, "extFields value", opaque)
        if len(ext) >= EXT_FIELDS_MAX:
            raise FrameError(f"more than {EXT_FIELDS_MAX} extFields", opaque)
        ext[_utf8(key, "extFields key", opaque)] = _utf8(value, "extFields value", opaque)
    return Command(
        code,
        opaque,
        flag,
        _utf8(remark, "remark", opaque),
        ext,
        b"",
        LANGUAGES[language] if language < len(LANGUAGES) else "OTHER",
        version,
    )


def _sized(data: bytes, position: int, length: struct.Struct, what: str, opaque: int) -> tuple[bytes, int]:
    if position + length.size > len(data):
        raise FrameError(f"the binary header ends inside the length of its {what}", opaque)
    (size,) = length.unpack_from(data, position)
    position += length.size
    if size < 0 or position + size > len(data):
        raise FrameError(f"the binary header's {what} length {size} runs past its end", opaque)
    return data[position : position + size], position + size


def _utf8(data: bytes, what: str, opaque: int = 0) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise FrameError(f"the {what} is not UTF-8", opaque) from None


# fastjson bodies ------------------------------------------------------------------------------
def fastjson_dumps(value: Any) -> bytes:
    """Compact JSON with integer map keys unquoted, as fastjson writes them."""
    return _fastjson(value).encode()


def _fastjson(value: Any) -> str:
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            name = str(key) if isinstance(key, int) and not isinstance(key, bool) else json.dumps(str(key))
            parts.append(f"{name}:{_fastjson(item)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fastjson(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


_BARE_KEY = re.compile(rb"([{,]\s*)(-?\d+)(\s*:)")


def fastjson_loads(body: bytes) -> Any:
    """A fastjson body: plain JSON, or with integer map keys unquoted."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(_BARE_KEY.sub(rb'\1"\2"\3', body))
    except (ValueError, RecursionError):
        raise FrameError("the body is not JSON") from None


# Message properties and V1 message records ---------------------------------------------------
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MESSAGE_MAGIC_V1 = 0xDAA320A7
SYS_FLAG_COMPRESSED = 0x1
SYS_FLAG_TRANSACTION_TYPES = 0x4 | 0x8  # prepared / commit / rollback
PROPERTIES_BYTES_MAX = (1 << 15) - 1  # its length is an int16 in the record
_V1_HEAD = struct.Struct(">iIiiiqqiq4siq4siiq")


def encode_properties(properties: Mapping[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in properties.items())


def decode_properties(text: str) -> dict[str, str]:
    """`k\\x01v\\x02...`; a pair without exactly one separator is skipped, as the clients do."""
    properties: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        parts = pair.split(NAME_VALUE_SEPARATOR)
        if len(parts) == 2 and parts[0]:
            properties[parts[0]] = parts[1]
    return properties


@dataclass(frozen=True)
class WireMessage:
    """A stored message as a pull answer carries it (MessageExt's fields)."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str]
    queue_offset: int
    commit_offset: int
    store_timestamp_ms: int
    born_timestamp_ms: int = 0
    store_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0)  # IPv4 address, port
    born_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0)
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0


def body_crc(body: bytes) -> int:
    """RocketMQ's body CRC: CRC-32 with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_message(message: WireMessage) -> bytes:
    """One V1 message record: fixed fields, body, 1-byte topic length, 2-byte properties."""
    topic = message.topic.encode()
    properties = encode_properties(message.properties).encode()
    if len(topic) > 127:
        raise InvalidArgument(f"topic {message.topic[:32]} is over 127 bytes: a V1 record cannot hold it")
    if len(properties) > PROPERTIES_BYTES_MAX:
        raise InvalidArgument(
            f"properties of {len(properties)} bytes exceed a V1 record's {PROPERTIES_BYTES_MAX}"
        )
    size = _V1_HEAD.size + 4 + len(message.body) + 1 + len(topic) + 2 + len(properties)
    head = _V1_HEAD.pack(
        size,
        MESSAGE_MAGIC_V1,
        body_crc(message.body),
        message.queue_id,
        message.flag,
        message.queue_offset,
        message.commit_offset,
        message.sys_flag,
        message.born_timestamp_ms,
        message.born_host[0],
        message.born_host[1],
        message.store_timestamp_ms,
        message.store_host[0],
        message.store_host[1],
        message.reconsume_times,
        0,  # prepared transaction offset
    )
    return b"".join(
        (
            head,
            LENGTH.pack(len(message.body)),
            message.body,
            bytes([len(topic)]),
            topic,
            _I16.pack(len(properties)),
            properties,
        )
    )


def decode_messages(data: bytes) -> list[WireMessage]:
    """The V1 records of a pull answer (what the clients do with it): for tests and tools."""
    out = []
    position = 0
    while position < len(data):
        if position + _V1_HEAD.size + 4 > len(data):
            raise FrameError("a message record is cut inside its fixed fields")
        fields = _V1_HEAD.unpack_from(data, position)
        size, magic = fields[0], fields[1]
        if magic != MESSAGE_MAGIC_V1 or size < _V1_HEAD.size + 7 or position + size > len(data):
            raise FrameError(f"a message record at byte {position} has a bad magic or size")
        end = position + size
        at = position + _V1_HEAD.size
        (body_length,) = LENGTH.unpack_from(data, at)
        at += 4
        if body_length < 0 or at + body_length + 3 > end:
            raise FrameError("a message record's body runs past its end")
        body = data[at : at + body_length]
        at += body_length
        topic_length = data[at]
        topic = _utf8(data[at + 1 : at + 1 + topic_length], "topic")
        at += 1 + topic_length
        if at + 2 > end:
            raise FrameError("a message record's topic runs past its end")
        (properties_length,) = _I16.unpack_from(data, at)
        at += 2
        if properties_length < 0 or at + properties_length != end:
            raise FrameError("a message record's properties do not end where the record does")
        if body_crc(body) != fields[2]:
            raise FrameError("a message record's body CRC does not match")
        out.append(
            WireMessage(
                topic=topic,
                queue_id=fields[3],
                body=body,
                properties=decode_properties(_utf8(data[at:end], "properties")),
                queue_offset=fields[5],
                commit_offset=fields[6],
                store_timestamp_ms=fields[11],
                born_timestamp_ms=fields[8],
                store_host=(fields[12], fields[13]),
                born_host=(fields[9], fields[10]),
                flag=fields[4],
                sys_flag=fields[7],
                reconsume_times=fields[14],
            )
        )
        position = end
    return out


def inflate_body(body: bytes, body_bytes_max: int) -> bytes:
    """A body the client compressed (sys flag bit 0: zlib), bounded."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, body_bytes_max + 1)
    except zlib.error:
        raise FrameError("the compressed body is not zlib data") from None
    if len(out) > body_bytes_max or inflater.unconsumed_tail:
        raise FrameError(f"the body inflates to more than {body_bytes_max} bytes")
    return out


_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic (0), body CRC (0), flag, body length


@dataclass(frozen=True)
class BatchItem:
    """One message of a batch send's body: its body, flag and properties text."""

    body: bytes
    flag: int
    properties: str


def decode_batch(data: bytes, count_max: int) -> list[BatchItem]:
    """A batch send's body: records TOTAL|MAGIC|BODY_CRC|FLAG|BODY_LENGTH|BODY|PROPS_LENGTH(2)|PROPS,
    as the clients' batch encoders write them; at most `count_max` of them."""
    items: list[BatchItem] = []
    position = 0
    while position < len(data):
        if len(items) >= count_max:
            raise FrameError(f"a batch carries at most {count_max} messages")
        if position + _BATCH_HEAD.size > len(data):
            raise FrameError("a batch record is cut inside its fixed fields")
        size, _, _, flag, body_length = _BATCH_HEAD.unpack_from(data, position)
        end = position + size
        at = position + _BATCH_HEAD.size
        if size < _BATCH_HEAD.size + 2 or end > len(data) or not 0 <= body_length <= end - at - 2:
            raise FrameError(f"a batch record at byte {position} has a bad size")
        body = data[at : at + body_length]
        at += body_length
        (properties_length,) = _I16.unpack_from(data, at)
        at += 2
        if at + properties_length != end:
            raise FrameError("a batch record's properties do not end where the record does")
        items.append(BatchItem(bytes(body), flag, _utf8(data[at:end], "properties")))
        position = end
    if not items:
        raise FrameError("a batch send carries no message")
    return items
