"""The exception tree shared by every part.

Every error carries a domain `code` (RocketMQ-style names such as FENCED_MASTER_EPOCH)
and a message meant for a person: what was wrong and what to do. The classes say which
kind of failure it is; WIRE_CODES below is the one map from a class to what each protocol
answers (gRPC status, RocketMQ 5 code, remoting response code), by name: mqmeta.rpc,
mqmeta.rocketmq and mqmeta.remoting.server resolve the names once, at import. This module
imports no third-party package: the audit's Spark executors use it too.
"""

from __future__ import annotations

from dataclasses import dataclass


class MqmetaError(Exception):
    """Base of every error the project raises on purpose."""

    default_code = "ERROR"

    def __init__(self, message: str, code: str | None = None, leader: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.leader = leader

    def __str__(self) -> str:
        return self.message


class InvalidArgument(MqmetaError):
    """A request, flag or file is malformed or out of range: the message names the field and what to use."""

    default_code = "INVALID_ARGUMENT"


class NotFound(MqmetaError):
    """The named cluster, broker set, topic or group does not exist."""

    default_code = "NOT_FOUND"


class AlreadyExists(MqmetaError):
    """A topic or group of that name exists already."""

    default_code = "ALREADY_EXISTS"


class FailedPrecondition(MqmetaError):
    """A well-formed request refused in the current state (e.g. no in-sync slave to elect)."""

    default_code = "FAILED_PRECONDITION"


class FencedEpoch(FailedPrecondition):
    """A role holder acted with an epoch that is no longer current."""

    default_code = "FENCED_MASTER_EPOCH"


class NotLeader(MqmetaError):
    """This node cannot serve the call; `leader` says where to go when known."""

    default_code = "NOT_LEADER"


class NotMaster(FailedPrecondition):
    """A write reached a slave or a fenced master; `leader` is the master when known."""

    default_code = "NOT_MASTER"


class Unavailable(MqmetaError):
    """It cannot be done right now (a server down or shutting down, a queue full, no master yet): retry."""

    default_code = "UNAVAILABLE"


class ResourceExhausted(MqmetaError):
    """A resource the call needs is used up (e.g. the broker's disk is full): nothing was done."""

    default_code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(Unavailable):
    """A call, or the wait it made (e.g. for slaves to confirm a send), ran past its deadline."""

    default_code = "DEADLINE_EXCEEDED"


class CorruptData(MqmetaError):
    """A checksum did not match: the file is reported, never used."""

    default_code = "CORRUPT_DATA"


# The class of each domain code; a code not listed is a FailedPrecondition (the
# state machine refused a well-formed request in the current state).
CODE_CLASSES: dict[str, type[MqmetaError]] = {
    "NOT_LEADER": NotLeader,
    "NOT_MASTER": NotMaster,
    "FENCED_MASTER_EPOCH": FencedEpoch,
    "FENCED_SYNC_STATE_SET_EPOCH": FencedEpoch,
    "INVALID_ARGUMENT": InvalidArgument,
    "BROKER_ID_INVALID": FailedPrecondition,
    "NOT_FOUND": NotFound,
    "BROKER_SET_NOT_FOUND": NotFound,
    "TOPIC_NOT_FOUND": NotFound,
    "GROUP_NOT_FOUND": NotFound,
    "TOPIC_EXISTS": AlreadyExists,
    "GROUP_EXISTS": AlreadyExists,
    "TOPIC_CHANGED": FailedPrecondition,
    "MASTER_NOT_AVAILABLE": FailedPrecondition,
    "NO_IN_SYNC_SLAVE": FailedPrecondition,
    "BROKER_ALIVE": FailedPrecondition,
    "IN_SYNC_REPLICAS_NOT_ENOUGH": FailedPrecondition,
    "FLUSH_SLAVE_TIMEOUT": DeadlineExceeded,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "CORRUPT_DATA": CorruptData,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "DISK_FULL": ResourceExhausted,
}


def error_from_code(code: str, message: str) -> MqmetaError:
    """The typed error for a domain code (what the state machine and the servers raise,
    and what a client rebuilds from a failed call)."""
    return CODE_CLASSES.get(code, FailedPrecondition)(message, code=code)


@dataclass(frozen=True)
class WireCodes:
    """What each protocol answers for an error class, by the protocol's own name for it."""

    grpc: str  # a grpc.StatusCode
    rocketmq5: str  # an apache.rocketmq.v2.Code
    remoting: str  # a RocketMQ remoting response code (mqmeta.codec.remoting)


# The one error map: each class's answer in each protocol (a subclass takes its nearest listed
# ancestor's). Conditions of the replicated service that pass (a new master, a renewed lease,
# a controller leader) are RocketMQ 5's HA_NOT_AVAILABLE, "the HA mechanism is not working
# now", which the official clients raise as an InternalErrorException and retry:
# TOO_MANY_REQUESTS would stop their retries (it means throttling) and INTERNAL_SERVER_ERROR
# would call a normal failover a bug. The 4.x clients retry a send on SYSTEM_BUSY and
# SERVICE_NOT_AVAILABLE (another broker or later): what a failover or a lapsed lease is.
# CorruptData (and an unknown class) stays an internal error: a checksum that does not match
# is a fault of the server's storage, which an operator must look at.
WIRE_CODES: dict[type[MqmetaError], WireCodes] = {
    MqmetaError: WireCodes("UNKNOWN", "INTERNAL_SERVER_ERROR", "SYSTEM_ERROR"),
    InvalidArgument: WireCodes("INVALID_ARGUMENT", "BAD_REQUEST", "SYSTEM_ERROR"),
    NotFound: WireCodes("NOT_FOUND", "NOT_FOUND", "SYSTEM_ERROR"),
    AlreadyExists: WireCodes("ALREADY_EXISTS", "BAD_REQUEST", "SYSTEM_ERROR"),
    FailedPrecondition: WireCodes("FAILED_PRECONDITION", "BAD_REQUEST", "SERVICE_NOT_AVAILABLE"),
    # refused before writing: not the master, lease lapsed, handing off (a deposed write is
    # mapped by the caller to MASTER_PERSISTENCE_TIMEOUT: its outcome is unknown)
    NotMaster: WireCodes("FAILED_PRECONDITION", "HA_NOT_AVAILABLE", "SERVICE_NOT_AVAILABLE"),
    # a newer master epoch exists: this one was deposed
    FencedEpoch: WireCodes("FAILED_PRECONDITION", "HA_NOT_AVAILABLE", "SERVICE_NOT_AVAILABLE"),
    # a controller that is not the Raft leader
    NotLeader: WireCodes("UNAVAILABLE", "HA_NOT_AVAILABLE", "SYSTEM_BUSY"),
    # no controller leader / master reachable right now
    Unavailable: WireCodes("UNAVAILABLE", "HA_NOT_AVAILABLE", "SYSTEM_BUSY"),
    DeadlineExceeded: WireCodes("DEADLINE_EXCEEDED", "PROXY_TIMEOUT", "SYSTEM_BUSY"),
    CorruptData: WireCodes("DATA_LOSS", "INTERNAL_SERVER_ERROR", "SYSTEM_ERROR"),
    # nothing was done: e.g. the broker's disk is full (the domain code says which)
    ResourceExhausted: WireCodes("RESOURCE_EXHAUSTED", "INTERNAL_SERVER_ERROR", "SYSTEM_ERROR"),
}

# Domain codes with a RocketMQ 5 code of their own (over their class's).
ROCKETMQ5_CODE_OF_DOMAIN: dict[str, str] = {
    "TOPIC_NOT_FOUND": "TOPIC_NOT_FOUND",
    "GROUP_NOT_FOUND": "CONSUMER_GROUP_NOT_FOUND",
    # Nothing was written: the SyncStateSet is too small to acknowledge. RocketMQ's proxy
    # answers its SLAVE_NOT_AVAILABLE with HA_NOT_AVAILABLE too; the client retries.
    "IN_SYNC_REPLICAS_NOT_ENOUGH": "HA_NOT_AVAILABLE",
    # Written locally, not acknowledged in time: outcome unknown; the client retries.
    "FLUSH_SLAVE_TIMEOUT": "SLAVE_PERSISTENCE_TIMEOUT",
}


def listed_class(error: MqmetaError) -> type[MqmetaError]:
    """The class whose row of WIRE_CODES answers for `error`: its nearest listed ancestor."""
    for cls in type(error).__mro__:
        if cls in WIRE_CODES:
            return cls
    raise AssertionError(f"{type(error).__name__} is not an MqmetaError")
