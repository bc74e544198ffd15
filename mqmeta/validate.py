"""Validation of what arrives from outside (requests, flags), and the bounds it checks.

Every check raises InvalidArgument with one sentence naming the field and what to use.
Shared by the controller's state machine and services, the nameserver, the broker
service and the CLIs, so that a name or a number means the same everywhere.
"""

from __future__ import annotations

import re
from typing import Any

from mqmeta.errors import InvalidArgument

# Names of clusters, broker sets, topics and groups; also safe file-name and object-key
# segments (per-queue index files, tiered keys).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_%|-]{1,127}")
ADDRESS_PATTERN = re.compile(r"[A-Za-z0-9.\-_\[\]:]+:\d{1,5}")
QUEUE_COUNT_MAX = 1024  # queues per topic per broker set
QUEUE_ID_MAX = QUEUE_COUNT_MAX - 1
# The largest id, offset or timestamp a request may carry: below the formats' u64 fields
# and protobuf's int64, so sums of two never overflow either.
REQUEST_INT_MAX = 2**62
PORT_MAX = 65535
# A value quoted in an error message is cut to this: the message travels in a gRPC header
# (grpc-message), and a client drops a header over 16 KiB with the status it carries.
SHOWN_CHARS_MAX = 64


def shown(value: Any) -> str:
    """`value` quoted for an error message, cut to SHOWN_CHARS_MAX characters."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS_MAX:
        return f"{value[:SHOWN_CHARS_MAX]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS_MAX else f"{text[:SHOWN_CHARS_MAX]}... ({len(text)} characters)"


def validate_name(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidArgument(
            f"{kind} {shown(value)} is malformed: use 1-127 characters from A-Z a-z 0-9 _ - % |"
        )
    return value


def validate_address(value: Any) -> str:
    if not isinstance(value, str) or not ADDRESS_PATTERN.fullmatch(value):
        raise InvalidArgument(f"address {shown(value)} is malformed: use HOST:PORT")
    return value


def validate_choice(kind: str, value: Any, choices: tuple[str, ...], default: str) -> str:
    if value in ("", None):
        return default
    if value not in choices:
        raise InvalidArgument(f"{kind} {shown(value)} is not one of {', '.join(choices)}")
    return str(value)


def validate_int(kind: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{kind} must be a whole number from {minimum} to {maximum}")
    return value


def parse_addresses(text: str, what: str = "controller address", allow_port_zero: bool = False) -> list[str]:
    """HOST:PORT[,HOST:PORT...]; port 0 (let the system pick) only where a server binds."""
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    if not addresses:
        raise InvalidArgument(f"give at least one {what} as HOST:PORT")
    lowest = 0 if allow_port_zero else 1
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not lowest <= int(port) <= PORT_MAX:
            raise InvalidArgument(f"{what} {shown(address)} is malformed: use HOST:PORT")
    return addresses
