"""The exception tree shared by every part.

Every error carries a domain `code` (RocketMQ-style names such as FENCED_MASTER_EPOCH)
and a message meant for a person: what was wrong and what to do. The classes say which
kind of failure it is; mqmeta.rpc maps each class to a gRPC status in one table. This
module imports no third-party package: the audit's Spark executors use it too.
"""

from __future__ import annotations


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
