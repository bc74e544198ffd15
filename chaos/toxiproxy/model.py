"""Proxies and toxics as the HTTP API sees them: their JSON, its validation, and the errors.

Pure: no sockets, no clock. Request bodies are read the way Toxiproxy's Go decoder reads them:
unknown fields are ignored, a missing or null field keeps its default, a field of the wrong JSON
type is a 400 whose text names the Go struct field ("bad request body: json: cannot unmarshal
string into Go struct field LatencyToxic.attributes.latency of type int64"), and only the first
JSON value of a body counts.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Container
from typing import Any

VERSION = "2.12.0"  # the Toxiproxy release whose behaviour this server follows

PROXY_COUNT_MAX = 1000
TOXIC_COUNT_MAX = 64  # per proxy
NAME_LENGTH_MAX = 1024  # characters of a proxy or toxic name
API_CONNECTION_COUNT_MAX = 256  # open HTTP connections; more are closed at once
REQUEST_BODY_BYTES_MAX = 1024 * 1024  # larger bodies are answered 413
REQUEST_TIMEOUT_S = 25.0  # Toxiproxy's http.TimeoutHandler
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # Go's int64 (and int on 64-bit), the attributes' type


class ToxiproxyError(Exception):
    """The server cannot start, or a request cannot be served."""


class ApiError(ToxiproxyError):
    """A request failed; answered as {"error": message, "status": status}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# Toxiproxy's own error texts (api.go), kept word for word: clients and their tests match them.
PROXY_NOT_FOUND = "proxy not found"
PROXY_EXISTS = "proxy already exists"
TOXIC_NOT_FOUND = "toxic not found"
TOXIC_EXISTS = "toxic already exists"
INVALID_TOXIC_TYPE = "invalid toxic type"
INVALID_STREAM = "stream was invalid, can be either upstream or downstream"


def bad_request_body(reason: str) -> ApiError:
    return ApiError(400, f"bad request body: {reason}")


def missing_field(what: str) -> ApiError:
    return ApiError(400, f"missing required field: {what}")


class Stream(enum.Enum):
    UPSTREAM = "upstream"  # client → server
    DOWNSTREAM = "downstream"  # server → client


@dataclasses.dataclass(frozen=True)
class ToxicType:
    go_struct: str  # named in type errors, as Go's decoder does
    attributes: dict[str, str]  # attribute → its Go type; every default is 0


# The toxic types and their attributes (Toxiproxy's toxics/*.go): latency and jitter ms, rate KB/s
# (1 KB = 1000 bytes), slow_close delay ms, timeout ms, reset_peer timeout ms, slicer sizes in
# bytes and delay in µs, limit_data bytes.
TOXIC_TYPES: dict[str, ToxicType] = {
    "noop": ToxicType("NoopToxic", {}),
    "latency": ToxicType("LatencyToxic", {"latency": "int64", "jitter": "int64"}),
    "bandwidth": ToxicType("BandwidthToxic", {"rate": "int64"}),
    "slow_close": ToxicType("SlowCloseToxic", {"delay": "int64"}),
    "timeout": ToxicType("TimeoutToxic", {"timeout": "int64"}),
    "reset_peer": ToxicType("ResetToxic", {"timeout": "int64"}),
    "slicer": ToxicType("SlicerToxic", {"average_size": "int", "size_variation": "int", "delay": "int"}),
    "limit_data": ToxicType("LimitDataToxic", {"bytes": "int64"}),
}


@dataclasses.dataclass(frozen=True)
class Toxic:
    name: str
    type: str
    stream_text: str  # the stream as the client spelled it (Toxiproxy echoes it back)
    stream: Stream
    toxicity: float
    attributes: dict[str, int]
    position: int  # its place in its stream's chain: set when added, kept by updates
    key: int  # new on every update, so that links re-roll toxicity and re-arm timers

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream_text,
            "toxicity": _json_number(self.toxicity),
        }


@dataclasses.dataclass(frozen=True)
class ProxyInput:
    """A proxy's fields as a request gives them; None where the request leaves them out."""

    name: str | None
    listen: str | None
    upstream: str | None
    enabled: bool | None


# --- reading JSON as Go's decoder does -------------------------------------------------------------


class FloatLiteral(str):
    """A JSON number with a fraction or exponent, kept as written (Go's errors quote it)."""


def _refuse_constant(constant: str) -> Any:
    raise ValueError(f"invalid character {constant[0]!r} looking for beginning of value")


_DECODER = json.JSONDecoder(parse_float=FloatLiteral, parse_constant=_refuse_constant)


def parse_body(body: bytes) -> Any:
    """The first JSON value of a request body (Go's json.Decoder ignores what follows it)."""
    try:
        text = body.decode("utf-8").lstrip(" \t\r\n")
        if not text:
            raise ValueError("EOF")
        return _DECODER.raw_decode(text)[0]
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise bad_request_body(str(error)) from None


def _json_kind(value: object) -> str:
    """How Go's UnmarshalTypeError names a JSON value."""
    if isinstance(value, FloatLiteral):
        return f"number {value}"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _type_error(value: object, go_struct: str, field: str, go_type: str) -> ApiError:
    kind = _json_kind(value)
    if kind.startswith("number ") and go_type not in ("int", "int64", "float32"):
        kind = "number"  # Go quotes the literal only when a number does not fit a numeric field
    return bad_request_body(
        f"json: cannot unmarshal {kind} into Go struct field {go_struct}.{field} of type {go_type}"
    )


def _value_error(value: object, go_type: str) -> ApiError:
    kind = _json_kind(value).split(" ")[0]
    return bad_request_body(f"json: cannot unmarshal {kind} into Go value of type {go_type}")


def _string(fields: dict[str, Any], key: str, go_struct: str) -> str | None:
    value = fields.get(key)
    if value is not None and (not isinstance(value, str) or isinstance(value, FloatLiteral)):
        raise _type_error(value, go_struct, key, "string")
    return value


def _boolean(fields: dict[str, Any], key: str, go_struct: str) -> bool | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, bool):
        raise _type_error(value, go_struct, key, "bool")
    return value


def _number(value: object, go_struct: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | FloatLiteral):
        raise _type_error(value, go_struct, field, "float32")
    number = float(value)
    if not math.isfinite(number):
        raise _type_error(value, go_struct, field, "float32")
    return number


def _integer(value: object, go_struct: str, field: str, go_type: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not INT64_MIN <= value <= INT64_MAX:
        raise _type_error(value, go_struct, field, go_type)
    return value


def _json_number(value: float) -> int | float:
    return int(value) if value.is_integer() else value  # Go writes float32(1) as 1


def _check_name_length(name: str, what: str) -> str:
    if len(name) > NAME_LENGTH_MAX:
        raise ApiError(400, f"{what} is longer than {NAME_LENGTH_MAX} characters")
    return name


# --- proxies ----------------------------------------------------------------------------------------


def proxy_input(body: object) -> ProxyInput:
    """A proxy object of POST /proxies, POST /proxies/{name} or one entry of /populate."""
    if not isinstance(body, dict):
        raise _value_error(body, "toxiproxy.Proxy")
    name = _string(body, "name", "Proxy")
    return ProxyInput(
        name=None if name is None else _check_name_length(name, "name"),
        listen=_string(body, "listen", "Proxy"),
        upstream=_string(body, "upstream", "Proxy"),
        enabled=_boolean(body, "enabled", "Proxy"),
    )


def populate_input(body: object) -> list[ProxyInput]:
    """POST /populate: every entry read and checked before any proxy is touched."""
    if not isinstance(body, list):
        raise _value_error(body, "[]toxiproxy.Proxy")
    entries = [proxy_input(item) for item in body]
    for number, entry in enumerate(entries, start=1):
        if not entry.name:
            raise missing_field(f"name at proxy {number}")
        if not entry.upstream:
            raise missing_field(f"upstream at proxy {number}")
    return entries


# --- toxics -----------------------------------------------------------------------------------------


def parse_stream(text: str) -> Stream:
    """Toxiproxy's stream.ParseDirection: upstream or downstream, in any letter case."""
    try:
        return Stream(text.lower())
    except ValueError:
        raise ApiError(400, INVALID_STREAM) from None


def _attributes(toxic_type: str, given: object, base: dict[str, int]) -> dict[str, int]:
    """base with the given attributes merged in; unknown attributes are ignored, as by Go."""
    spec = TOXIC_TYPES[toxic_type]
    if given is None:
        return dict(base)
    if not isinstance(given, dict):
        raise _type_error(given, "ToxicWrapper", "attributes", f"toxics.{spec.go_struct}")
    merged = dict(base)
    for key, go_type in spec.attributes.items():
        value = given.get(key)
        if value is not None:
            merged[key] = _integer(value, spec.go_struct, f"attributes.{key}", go_type)
    return merged


def new_toxic(body: object, taken: Container[str], position: int, key: int) -> Toxic:
    """POST /proxies/{name}/toxics, checked in Toxiproxy's order: the body's field types, the
    stream, the type, a free name (taken: the proxy's toxic names), then the attributes."""
    if not isinstance(body, dict):
        raise _value_error(body, "toxics.ToxicWrapper")
    name = _string(body, "name", "ToxicWrapper") or ""
    toxic_type = _string(body, "type", "ToxicWrapper") or ""
    stream_text = _string(body, "stream", "ToxicWrapper")
    stream_text = Stream.DOWNSTREAM.value if stream_text is None else stream_text
    toxicity = body.get("toxicity")
    toxicity = 1.0 if toxicity is None else _number(toxicity, "ToxicWrapper", "toxicity")
    attributes = body.get("attributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise _type_error(attributes, "ToxicWrapper", "attributes", "toxics.NoopToxic")
    stream = parse_stream(stream_text)
    name = _check_name_length(name or f"{toxic_type}_{stream_text}", "toxic name")
    if toxic_type not in TOXIC_TYPES:
        raise ApiError(400, INVALID_TOXIC_TYPE)
    if name in taken:
        raise ApiError(409, TOXIC_EXISTS)
    base = dict.fromkeys(TOXIC_TYPES[toxic_type].attributes, 0)
    return Toxic(
        name=name,
        type=toxic_type,
        stream_text=stream_text,
        stream=stream,
        toxicity=toxicity,
        attributes=_attributes(toxic_type, attributes, base),
        position=position,
        key=key,
    )


def updated_toxic(toxic: Toxic, body: object, key: int) -> Toxic:
    """POST or PATCH /proxies/{name}/toxics/{toxic}: only attributes (merged) and toxicity change;
    a name, type or stream in the body is ignored, as by Toxiproxy."""
    if not isinstance(body, dict):
        raise _value_error(body, "struct { Attributes interface {}; Toxicity float32 }")
    toxicity = body.get("toxicity")
    return dataclasses.replace(
        toxic,
        toxicity=toxic.toxicity if toxicity is None else _number(toxicity, "ToxicWrapper", "toxicity"),
        attributes=_attributes(toxic.type, body.get("attributes"), toxic.attributes),
        key=key,
    )


# --- addresses --------------------------------------------------------------------------------------


class AddressError(ValueError):
    """An address that does not parse; the text is Go's ("address x: missing port in address")."""


def split_address(address: str) -> tuple[str, int]:
    """host and port of "host:port" or "[v6]:port", as Go's net.SplitHostPort reads them."""

    def fail(reason: str) -> AddressError:
        return AddressError(f"address {address}: {reason}")

    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise fail("missing ']' in address")
        host, rest = address[1:end], address[end + 1 :]
        if not rest.startswith(":"):
            raise fail("missing port in address" if not rest else "too many colons in address")
        port_text = rest[1:]
    else:
        host, separator, port_text = address.rpartition(":")
        if not separator:
            raise fail("missing port in address")
        if ":" in host:
            raise fail("too many colons in address")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise AddressError(f"address {port_text}: invalid port")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
