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
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not int(port) <= PORT_MAX:
            raise InvalidArgument(f"{what} {shown(address)} is malformed: use HOST:PORT")
        if int(port) == 0 and not allow_port_zero:  # others dial it: it must be known in advance
            raise InvalidArgument(
                f"{what} {shown(address)}: port 0 is not allowed here: give a port from 1 to {PORT_MAX}"
            )
    return addresses


class FlagNumber:
    """An argparse `type` for a numeric flag with its allowed range, so that a bad value is
    refused at parse time (exit 2, one sentence naming the flag and the range) and never
    reaches a server that would start, hang, overflow a timer or fail a protobuf field later.
    A --config file's key of such a flag is checked by the same range (config_file.py)."""

    def __init__(self, flag: str, kind: type[int] | type[float], minimum: float, maximum: float) -> None:
        self.flag, self.kind, self.minimum, self.maximum = flag, kind, minimum, maximum
        self.__name__ = kind.__name__  # argparse names the type in its own messages

    @property
    def allowed(self) -> str:
        what = "a whole number" if self.kind is int else "a number"
        return f"{what} from {_number(self.minimum)} to {_number(self.maximum)}"

    def __call__(self, text: str) -> int | float:
        import argparse  # only the CLIs call this

        try:
            value = self.kind(text)
        except (ValueError, OverflowError):
            value = None
        if value is None or not self.minimum <= value <= self.maximum:  # nan compares false
            # argparse puts "argument FLAG: " in front
            raise argparse.ArgumentTypeError(f"must be {self.allowed}, not {shown(text)}")
        return value

    def check(self, value: Any, key: str, where: str) -> int | float:
        """A --config file's value (never shown: a file may hold secrets)."""
        numeric = isinstance(value, int) if self.kind is int else isinstance(value, int | float)
        if isinstance(value, bool) or not numeric or not self.minimum <= value <= self.maximum:
            raise InvalidArgument(f"key {key!r} in {where} ({self.flag}) must be {self.allowed}")
        return self.kind(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
