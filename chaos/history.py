"""History events of a chaos run and the OpenChaos ``history.tsv`` format.

One event per line, fields separated by tabs, in the order they were recorded:

- request:  ``clientId  operation  REQUEST  value  shardingKey  timestamp  extraInfo``
- response: ``clientId  operation  RESPONSE  result  value  shardingKey  timestamp  sendLatency
  extraInfo  endToEndLatency``, result one of ``SUCCESS | FAILURE | UNKNOWN``
- fault:    ``fault  faultName  start|end  timestamp`` (an optional fifth field is extraInfo)

Timestamps are milliseconds since the epoch; latencies are milliseconds. ``sendLatency`` is
response time minus request time. ``endToEndLatency`` is, for a dequeue, the time from the
enqueue's send to the dequeue; a negative value means "not measured" (enqueues write -1).
An absent value, sharding key or extraInfo is written ``null`` (as OpenChaos's Java writer
does), so ``null`` is reserved and cannot be a value. Fields may not contain tabs or newlines.

Queue workload: operations ``enqueue`` and ``dequeue``; the value is the message body (unique
per enqueue), the sharding key is the message's ordering key.

Metadata (register) workload: operations ``read``, ``write`` and ``cas`` on the key in the
``shardingKey`` column; every key starts absent (``null``). Values:

- ``write``: request and response value = the value written.
- ``read``: request value ``null``; SUCCESS response value = the value read (``null`` if absent).
- ``cas``: request and response value = ``old->new`` (see `encode_cas_value`; ``old`` may be
  ``null`` to mean "only if absent"). SUCCESS = the swap took effect. FAILURE with value
  ``old->new`` = rejected without effect and without comparing (e.g. not leader). FAILURE with
  value ``old->new;mismatch`` = the service compared and found a current value other than
  ``old``, so it is also an observation. Values used in a cas may not contain ``->`` or ``;``.
- FAILURE of a ``read`` or ``write`` means it certainly did not take effect. UNKNOWN (or no
  response at all) means it may have taken effect at any time after its request, or never.

Each client is sequential: a response belongs to the same client's latest request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

NULL_FIELD = "null"
CAS_SEPARATOR = "->"
CAS_MISMATCH_SUFFIX = ";mismatch"
FAULT_CLIENT_FIELD = "fault"
EVENT_COUNT_MAX_DEFAULT = 2_000_000


class HistoryError(ValueError):
    """A history that breaks the format or the client protocol."""


class HistoryFormatError(HistoryError):
    """A line of history.tsv that cannot be parsed; names the line number (1-based)."""

    def __init__(self, line_number: int, reason: str) -> None:
        super().__init__(f"history line {line_number}: {reason}")
        self.line_number = line_number
        self.reason = reason


class HistoryFullError(HistoryError):
    """The recorder already holds its maximum number of events."""


class EventType(StrEnum):
    REQUEST = "REQUEST"
    RESPONSE = "RESPONSE"


class Result(StrEnum):
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    UNKNOWN = "UNKNOWN"


class FaultPhase(StrEnum):
    START = "start"
    END = "end"


@dataclass(frozen=True, slots=True)
class RequestEvent:
    client_id: int
    operation: str
    value: str | None
    sharding_key: str | None
    timestamp_ms: int
    extra_info: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseEvent:
    client_id: int
    operation: str
    result: Result
    value: str | None
    sharding_key: str | None
    timestamp_ms: int
    send_latency_ms: int
    extra_info: str | None = None
    end_to_end_latency_ms: int = -1

    @property
    def request_timestamp_ms(self) -> int:
        return self.timestamp_ms - self.send_latency_ms


@dataclass(frozen=True, slots=True)
class FaultEvent:
    fault_name: str
    phase: FaultPhase
    timestamp_ms: int
    extra_info: str | None = None


HistoryEvent = RequestEvent | ResponseEvent | FaultEvent


@dataclass(frozen=True, slots=True)
class CasValue:
    old: str | None
    new: str | None
    mismatch: bool = False


def encode_cas_value(old: str | None, new: str | None, mismatch: bool = False) -> str:
    """The value field of a cas: ``old->new``, with ``;mismatch`` on a compared-and-failed response."""
    for part in (old, new):
        if part is not None and (CAS_SEPARATOR in part or ";" in part):
            raise ValueError(f"cas value {part!r} may not contain '->' or ';'")
    text = f"{_encode_optional(old)}{CAS_SEPARATOR}{_encode_optional(new)}"
    return text + CAS_MISMATCH_SUFFIX if mismatch else text


def decode_cas_value(text: str | None) -> CasValue:
    if text is None:
        raise HistoryError("cas without a value")
    mismatch = text.endswith(CAS_MISMATCH_SUFFIX)
    body = text.removesuffix(CAS_MISMATCH_SUFFIX)
    old, separator, new = body.partition(CAS_SEPARATOR)
    if not separator or CAS_SEPARATOR in new or ";" in body:
        raise HistoryError(f"cas value {text!r} is not 'old->new' or 'old->new;mismatch'")
    return CasValue(_decode_optional(old), _decode_optional(new), mismatch)


def format_event(event: HistoryEvent) -> str:
    """One history.tsv line for an event, without the newline."""
    if isinstance(event, FaultEvent):
        fields = [FAULT_CLIENT_FIELD, event.fault_name, event.phase.value, str(event.timestamp_ms)]
        if event.extra_info is not None:
            fields.append(event.extra_info)
    elif isinstance(event, RequestEvent):
        fields = [
            str(event.client_id),
            event.operation,
            EventType.REQUEST.value,
            _encode_optional(event.value),
            _encode_optional(event.sharding_key),
            str(event.timestamp_ms),
            _encode_optional(event.extra_info),
        ]
    else:
        fields = [
            str(event.client_id),
            event.operation,
            EventType.RESPONSE.value,
            event.result.value,
            _encode_optional(event.value),
            _encode_optional(event.sharding_key),
            str(event.timestamp_ms),
            str(event.send_latency_ms),
            _encode_optional(event.extra_info),
            str(event.end_to_end_latency_ms),
        ]
    for field in fields:
        if "\t" in field or "\n" in field or "\r" in field:
            raise ValueError(f"history field {field!r} contains a tab or newline")
    return "\t".join(fields)


def parse_line(line: str, line_number: int) -> HistoryEvent:
    """Parse one history.tsv line (without its newline); raise HistoryFormatError naming the line."""
    fields = line.split("\t")
    try:
        if fields[0] == FAULT_CLIENT_FIELD:
            return _parse_fault(fields)
        if len(fields) < 3:
            raise ValueError(f"expected at least 3 tab-separated fields, got {len(fields)}")
        if fields[2] == EventType.REQUEST:
            return _parse_request(fields)
        if fields[2] == EventType.RESPONSE:
            return _parse_response(fields)
        raise ValueError(f"third field must be REQUEST or RESPONSE, got {fields[2]!r}")
    except ValueError as error:
        raise HistoryFormatError(line_number, str(error)) from None


def write_history(events: Iterable[HistoryEvent], path: str | Path) -> int:
    """Write events to history.tsv at path (atomically via a temporary file); return the count."""
    target = Path(path)
    temporary = target.with_name(target.name + ".tmp")
    count = 0
    with temporary.open("w", encoding="utf-8", newline="\n") as file:
        for event in events:
            file.write(format_event(event) + "\n")
            count += 1
    temporary.replace(target)
    return count


def read_history(path: str | Path, event_count_max: int = EVENT_COUNT_MAX_DEFAULT) -> list[HistoryEvent]:
    """Parse history.tsv; blank lines are skipped, anything else malformed raises HistoryFormatError."""
    events: list[HistoryEvent] = []
    with Path(path).open(encoding="utf-8", newline="\n") as file:
        for line_number, raw_line in enumerate(file, start=1):
            line = raw_line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            if len(events) >= event_count_max:
                raise HistoryFormatError(line_number, f"more than {event_count_max} events")
            events.append(parse_line(line, line_number))
    return events


class HistoryRecorder:
    """Thread-safe, bounded in-memory history that workload threads append to."""

    def __init__(self, event_count_max: int = EVENT_COUNT_MAX_DEFAULT) -> None:
        if event_count_max <= 0:
            raise ValueError(f"event_count_max must be positive, got {event_count_max}")
        self.event_count_max = event_count_max
        self._events: list[HistoryEvent] = []
        self._lock = threading.Lock()

    def record(self, event: HistoryEvent) -> None:
        """Append an event; raise HistoryFullError past event_count_max and ValueError on bad fields."""
        format_event(event)  # validate fields now, not when the file is written at the end of a run
        with self._lock:
            if len(self._events) >= self.event_count_max:
                raise HistoryFullError(f"history already holds {self.event_count_max} events")
            self._events.append(event)

    def events(self) -> list[HistoryEvent]:
        """A snapshot copy of the events recorded so far."""
        with self._lock:
            return list(self._events)

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def write(self, path: str | Path) -> int:
        return write_history(self.events(), path)


def responses(history: Sequence[HistoryEvent], operation: str | None = None) -> list[ResponseEvent]:
    """The response events of a history, optionally only those of one operation."""
    return [
        event
        for event in history
        if isinstance(event, ResponseEvent) and (operation is None or event.operation == operation)
    ]


@dataclass(frozen=True, slots=True)
class Operation:
    """A request and its response; response None when the client never recorded one."""

    request: RequestEvent
    response: ResponseEvent | None


def pair_operations(history: Sequence[HistoryEvent]) -> list[Operation]:
    """Pair each request with the same client's next response, in request order.

    A client that sends a new request before the previous one answered abandoned the previous
    one: it stays without a response (an open end). A response with no outstanding request, or
    for another operation or key than the outstanding one, breaks the protocol: HistoryError.
    A request without a key (a dequeue learns its key from the message) matches any key.
    """
    pending: dict[int, int] = {}  # client_id -> index into pairs
    pairs: list[tuple[RequestEvent, ResponseEvent | None]] = []
    for event in history:
        if isinstance(event, RequestEvent):
            pending[event.client_id] = len(pairs)
            pairs.append((event, None))
        elif isinstance(event, ResponseEvent):
            index = pending.pop(event.client_id, None)
            if index is None:
                raise HistoryError(f"response without a request: {event}")
            request = pairs[index][0]
            key_differs = request.sharding_key is not None and request.sharding_key != event.sharding_key
            if request.operation != event.operation or key_differs:
                raise HistoryError(f"response {event} does not answer request {request}")
            pairs[index] = (request, event)
    return [Operation(request, response) for request, response in pairs]


def _parse_fault(fields: list[str]) -> FaultEvent:
    if len(fields) not in (4, 5):
        raise ValueError(f"fault line needs 4 or 5 fields, got {len(fields)}")
    try:
        phase = FaultPhase(fields[2])
    except ValueError:
        raise ValueError(f"fault phase must be start or end, got {fields[2]!r}") from None
    extra_info = _decode_optional(fields[4]) if len(fields) == 5 else None
    return FaultEvent(
        _require_text(fields[1], "faultName"), phase, _parse_int(fields[3], "timestamp"), extra_info
    )


def _parse_request(fields: list[str]) -> RequestEvent:
    if len(fields) != 7:
        raise ValueError(f"request line needs 7 fields, got {len(fields)}")
    return RequestEvent(
        client_id=_parse_int(fields[0], "clientId"),
        operation=_require_text(fields[1], "operation"),
        value=_decode_optional(fields[3]),
        sharding_key=_decode_optional(fields[4]),
        timestamp_ms=_parse_int(fields[5], "timestamp"),
        extra_info=_decode_optional(fields[6]),
    )


def _parse_response(fields: list[str]) -> ResponseEvent:
    if len(fields) != 10:
        raise ValueError(f"response line needs 10 fields, got {len(fields)}")
    try:
        result = Result(fields[3])
    except ValueError:
        raise ValueError(f"result must be SUCCESS, FAILURE or UNKNOWN, got {fields[3]!r}") from None
    return ResponseEvent(
        client_id=_parse_int(fields[0], "clientId"),
        operation=_require_text(fields[1], "operation"),
        result=result,
        value=_decode_optional(fields[4]),
        sharding_key=_decode_optional(fields[5]),
        timestamp_ms=_parse_int(fields[6], "timestamp"),
        send_latency_ms=_parse_int(fields[7], "sendLatency"),
        extra_info=_decode_optional(fields[8]),
        end_to_end_latency_ms=_parse_int(fields[9], "endToEndLatency"),
    )


def _parse_int(text: str, name: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def _require_text(text: str, name: str) -> str:
    if not text or text == NULL_FIELD:
        raise ValueError(f"{name} is empty")
    return text


def _encode_optional(text: str | None) -> str:
    if text == NULL_FIELD:
        raise ValueError(f"{NULL_FIELD!r} is reserved for an absent field")
    return NULL_FIELD if text is None else text


def _decode_optional(text: str) -> str | None:
    return None if text == NULL_FIELD else text
