"""The exception tree shared by every part, and its one mapping to gRPC status codes.

Every error carries a domain `code` (RocketMQ-style names such as FENCED_MASTER_EPOCH)
and a message meant for a person: what was wrong and what to do.
"""

from __future__ import annotations

import grpc

ERROR_CODE_KEY = "mqmeta-error-code"
LEADER_KEY = "mqmeta-leader"


class MqmetaError(Exception):
    """Base of every error the project raises on purpose."""

    status = grpc.StatusCode.UNKNOWN
    default_code = "ERROR"

    def __init__(self, message: str, code: str | None = None, leader: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.leader = leader

    def __str__(self) -> str:
        return self.message


class InvalidArgument(MqmetaError):
    status = grpc.StatusCode.INVALID_ARGUMENT
    default_code = "INVALID_ARGUMENT"


class NotFound(MqmetaError):
    status = grpc.StatusCode.NOT_FOUND
    default_code = "NOT_FOUND"


class AlreadyExists(MqmetaError):
    status = grpc.StatusCode.ALREADY_EXISTS
    default_code = "ALREADY_EXISTS"


class FailedPrecondition(MqmetaError):
    status = grpc.StatusCode.FAILED_PRECONDITION
    default_code = "FAILED_PRECONDITION"


class FencedEpoch(FailedPrecondition):
    """A role holder acted with an epoch that is no longer current."""

    default_code = "FENCED_MASTER_EPOCH"


class NotLeader(MqmetaError):
    """This node cannot serve the call; `leader` says where to go when known."""

    status = grpc.StatusCode.UNAVAILABLE
    default_code = "NOT_LEADER"


class NotMaster(FailedPrecondition):
    """A write reached a slave or a fenced master; `leader` is the master when known."""

    default_code = "NOT_MASTER"


class Unavailable(MqmetaError):
    status = grpc.StatusCode.UNAVAILABLE
    default_code = "UNAVAILABLE"


class DeadlineExceeded(Unavailable):
    status = grpc.StatusCode.DEADLINE_EXCEEDED
    default_code = "DEADLINE_EXCEEDED"


class CorruptData(MqmetaError):
    """A checksum did not match: the file is reported, never used."""

    status = grpc.StatusCode.DATA_LOSS
    default_code = "CORRUPT_DATA"


_BY_STATUS: dict[grpc.StatusCode, type[MqmetaError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.DATA_LOSS: CorruptData,
}

_BY_CODE: dict[str, type[MqmetaError]] = {
    "NOT_LEADER": NotLeader,
    "NOT_MASTER": NotMaster,
    "FENCED_MASTER_EPOCH": FencedEpoch,
    "FENCED_SYNC_STATE_SET_EPOCH": FencedEpoch,
}


def error_from_code(code: str, message: str) -> MqmetaError:
    """Builds the typed error for a domain code produced by the state machine."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = _CODE_CLASSES.get(code, FailedPrecondition)
    return cls(message, code=code)


# Domain codes that are not fencing/leadership map onto the generic classes.
_CODE_CLASSES: dict[str, type[MqmetaError]] = {
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
    "BROKER_ALIVE": FailedPrecondition,
    "IN_SYNC_REPLICAS_NOT_ENOUGH": FailedPrecondition,
    "FLUSH_SLAVE_TIMEOUT": DeadlineExceeded,
}


def abort_with(context: grpc.ServicerContext, error: MqmetaError) -> None:
    """Ends a gRPC call with the error's status, message and domain code."""
    metadata: list[tuple[str, str]] = [(ERROR_CODE_KEY, error.code)]
    if error.leader:
        metadata.append((LEADER_KEY, error.leader))
    context.set_trailing_metadata(metadata)
    context.abort(error.status, error.message)


def from_rpc_error(err: grpc.RpcError) -> MqmetaError:
    """Turns a failed call back into the typed error the server raised."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    trailing = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
    domain = str(trailing.get(ERROR_CODE_KEY, ""))
    leader = str(trailing.get(LEADER_KEY, ""))
    if domain:
        typed = error_from_code(domain, details or domain)
    else:
        typed = _BY_STATUS.get(code, MqmetaError)(details or str(code))
    typed.leader = leader
    return typed
