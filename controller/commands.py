"""The controller's commands: what a Raft entry asks `state_machine.apply` to do.

Each command is a frozen dataclass, so the fields the service fills in and the fields a
handler reads are one contract that mypy checks. The servicer converts a request into
a command once (controller/service.py); the leader adds what only it knows (the time,
who is alive, its term: controller/operations.py) with `dataclasses.replace`.

JSON stays the Raft encoding, behind one pair of functions: `encode_entry` writes an
entry (a batch of commands, group commit) as {"version": 2, "commands": [...]}, or as
version 3 when a command carries a `request_id` (an admin write's, P16: a node that
does not know request ids refuses to read the entry rather than apply it differently),
or version 4 when a registration carries `new_process` (for the same reason: a node of
an earlier version would refuse the registration that newer nodes apply);
`decode_entry` reads those and version 1, the bare list of command dicts that nodes wrote
before commands were typed (a journal or a snapshot's tail written then still replays).
A command's JSON is its fields plus "type"; a field that is None is left out (version 1
left such keys out too).

A command that cannot be decoded (an unknown type, a field the type does not have, a
required field missing) becomes `Undecodable`, which `apply` refuses with
INVALID_ARGUMENT on every node alike: the log stays deterministic whatever it holds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

Json = dict[str, Any]

ENCODING_VERSION = 2  # 1: a bare JSON list of command dicts (before typed commands)
ENCODING_VERSION_REQUEST_IDS = 3  # 2, with admin writes that carry a request_id
ENCODING_VERSION_NEW_PROCESS = 4  # 3, with registrations that carry new_process
REQUEST_ID_CHARS_MAX = 64


class UnknownEncoding(ValueError):
    """An entry in an encoding this node does not know (written by a newer version): it
    cannot be applied, nor skipped without the nodes' states parting."""


class Applied(NamedTuple):
    """What applying a command gave: its result (to the proposer), its events (to the
    watchers) and its changes (key -> new value, None: deleted). Handlers and `apply`
    return it alike."""

    result: Json
    events: list[Json]
    changes: dict[str, Json | None]


def unchanged(result: Json) -> Applied:
    """A result that changes nothing (a refusal, a no-op)."""
    return Applied(result, [], {})


# Commands the leader decides on its own view of liveness carry `alive` (broker id ->
# {"epoch", "max_offset", "priority"} as the leader's heartbeats last said), `now_ms`
# and `leader_term` (state_machine.stale_view).


@dataclass(frozen=True)
class Barrier:
    """Changes nothing: a linearizable read waits until it is applied."""

    TYPE: ClassVar[str] = "barrier"


@dataclass(frozen=True)
class RegisterBroker:
    TYPE: ClassVar[str] = "register_broker"
    cluster: str
    broker_name: str
    address: str
    check_code: str
    broker_id: int = 0  # 0: the set's next id, or the id this check code already holds
    election_priority: int = 0
    # The first registration of a broker's process (RegisterBrokerRequest.new_process; None
    # when it is not, or the broker or the entry is older): if that broker is the set's
    # master, its epoch ends and the next begins (state_machine._register_broker).
    new_process: bool | None = None
    now_ms: int | None = None


@dataclass(frozen=True)
class ElectMaster:
    TYPE: ClassVar[str] = "elect_master"
    cluster: str
    broker_name: str
    trigger: str = "admin"  # admin | broker | controller | handoff
    requester_broker_id: int = 0
    preferred_broker_id: int = 0
    master_epoch: int = 0  # a handoff's: the epoch the handing-off master holds
    alive: dict[str, Json] = field(default_factory=dict)
    now_ms: int | None = None
    leader_term: int | None = None


@dataclass(frozen=True)
class AlterSyncStateSet:
    TYPE: ClassVar[str] = "alter_sync_state_set"
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    sync_state_set_epoch: int
    new_sync_state_set: list[int]
    alive: dict[str, Json] = field(default_factory=dict)
    now_ms: int | None = None
    leader_term: int | None = None


@dataclass(frozen=True)
class CleanBrokerData:
    TYPE: ClassVar[str] = "clean_broker_data"
    cluster: str
    broker_name: str
    broker_ids: list[int] = field(default_factory=list)  # none: every replica
    force: bool = False
    alive: dict[str, Json] = field(default_factory=dict)
    now_ms: int | None = None
    leader_term: int | None = None


@dataclass(frozen=True)
class PutTopic:
    """Creates or updates a topic; an update keeps what it leaves empty (proto3)."""

    TYPE: ClassVar[str] = "put_topic"
    name: str
    mode: str = "create"  # create | update
    cluster: str = ""
    queue_count: int = 0
    broker_names: list[str] = field(default_factory=list)
    perm: str = ""
    message_type: str = ""
    if_queue_count: int = 0  # an update's condition: the topic has this many queues
    request_id: str | None = None  # the client's id of the logical call (retries share it)


@dataclass(frozen=True)
class DeleteTopic:
    TYPE: ClassVar[str] = "delete_topic"
    name: str
    request_id: str | None = None  # the client's id of the logical call (retries share it)


@dataclass(frozen=True)
class PutGroup:
    TYPE: ClassVar[str] = "put_group"
    name: str
    mode: str = "create"  # create | update
    subscriptions: list[Json] = field(default_factory=list)  # {"topic", "expression"}
    consume_from: str = ""
    consume_timestamp_ms: int = 0
    retry_max_times: int = 0
    retry_policy: str = ""
    request_id: str | None = None  # the client's id of the logical call (retries share it)


@dataclass(frozen=True)
class DeleteGroup:
    TYPE: ClassVar[str] = "delete_group"
    name: str
    request_id: str | None = None  # the client's id of the logical call (retries share it)


@dataclass(frozen=True)
class UpdateConfig:
    TYPE: ClassVar[str] = "update_config"
    values: dict[str, Any]  # name -> value as text (or as its type)
    request_id: str | None = None  # the client's id of the logical call (retries share it)


@dataclass(frozen=True)
class TieredUploadStart:
    TYPE: ClassVar[str] = "tiered_upload_start"
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    upload_id: str
    base_offset: int
    end_offset: int


@dataclass(frozen=True)
class TieredCommit:
    TYPE: ClassVar[str] = "tiered_commit"
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    upload_id: str
    segments: list[Json]  # {"key", "sha256", "base_offset", "end_offset", "size", ...}
    epochs: list[list[int]] = field(default_factory=list)  # [epoch, start offset]


@dataclass(frozen=True)
class TieredForgetAbandoned:
    """The uploader deleted the objects of these abandoned uploads."""

    TYPE: ClassVar[str] = "tiered_forget_abandoned"
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    upload_ids: list[str]


@dataclass(frozen=True)
class ReplicatorHeartbeat:
    """A replicator worker joined, restarted or reported tasks the state lacks."""

    TYPE: ClassVar[str] = "replicator_heartbeat"
    worker_id: str
    incarnation: str
    lease_ms: int
    dead_after_ms: int
    rules: list[str]
    tasks: list[list[Any]] = field(default_factory=list)  # [rule, topic, broker_name, queue_id]


@dataclass(frozen=True)
class ReplicatorExpire:
    """The leader saw these workers silent past their dead-after, or they left."""

    TYPE: ClassVar[str] = "replicator_expire"
    worker_ids: list[str]
    trigger: str = ""  # silent | leaving (for the reader of the log)
    leader_term: int | None = None


@dataclass(frozen=True)
class ReplicatorCommit:
    """A lessee records a task's start and acknowledged source offsets, fenced by epoch."""

    TYPE: ClassVar[str] = "replicator_commit"
    worker_id: str
    task: list[Any]  # [rule, topic, broker_name, queue_id]
    epoch: int
    start_offset: int = -1  # replicator_leases.NO_OFFSET
    acked_offset: int = -1
    replicated: int = 0
    rule_digest: str = ""


@dataclass(frozen=True)
class Undecodable:
    """What a log entry held where no command could be read; refused, never encoded."""

    TYPE: ClassVar[str] = "undecodable"
    reason: str


Command = (
    Barrier
    | RegisterBroker
    | ElectMaster
    | AlterSyncStateSet
    | CleanBrokerData
    | PutTopic
    | DeleteTopic
    | PutGroup
    | DeleteGroup
    | UpdateConfig
    | TieredUploadStart
    | TieredCommit
    | TieredForgetAbandoned
    | ReplicatorHeartbeat
    | ReplicatorExpire
    | ReplicatorCommit
    | Undecodable
)

COMMAND_TYPES: dict[str, type[Command]] = {
    kind.TYPE: kind
    for kind in (
        Barrier,
        RegisterBroker,
        ElectMaster,
        AlterSyncStateSet,
        CleanBrokerData,
        PutTopic,
        DeleteTopic,
        PutGroup,
        DeleteGroup,
        UpdateConfig,
        TieredUploadStart,
        TieredCommit,
        TieredForgetAbandoned,
        ReplicatorHeartbeat,
        ReplicatorExpire,
        ReplicatorCommit,
    )
}
_FIELDS: dict[type, tuple[str, ...]] = {
    kind: tuple(f.name for f in dataclasses.fields(kind)) for kind in (*COMMAND_TYPES.values(), Undecodable)
}
_FIELD_SETS: dict[type, frozenset[str]] = {kind: frozenset(names) for kind, names in _FIELDS.items()}
_REQUIRED: dict[type, frozenset[str]] = {
    kind: frozenset(
        f.name
        for f in dataclasses.fields(kind)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    for kind in COMMAND_TYPES.values()
}


def command_json(command: Command) -> Json:
    """The command as JSON: "type" and every field that is not None."""
    if isinstance(command, Undecodable):
        raise TypeError(f"an undecodable command is never encoded: {command.reason}")
    document: Json = {"type": command.TYPE}
    for name in _FIELDS[type(command)]:
        value = getattr(command, name)
        if value is not None:
            document[name] = value
    return document


def command_from_json(document: Any) -> Command:
    """The command a JSON object encodes, or Undecodable saying why not."""
    if not isinstance(document, dict):
        return Undecodable(f"a command is a JSON object, not {type(document).__name__}")
    kind = COMMAND_TYPES.get(document.get("type"))  # type: ignore[arg-type]
    if kind is None:
        return Undecodable(f"unknown command type {document.get('type')!r}")
    fields = {k: v for k, v in document.items() if k != "type"}
    names = fields.keys()
    if names <= _FIELD_SETS[kind] and _REQUIRED[kind] <= names:
        return kind(**fields)  # the usual case, without building the lists below
    unknown = sorted(set(fields) - set(_FIELDS[kind]))
    missing = sorted(_REQUIRED[kind] - set(fields))
    if unknown or missing:
        problems = [f"no field {', '.join(unknown)}"] if unknown else []
        problems += [f"lacks {', '.join(missing)}"] if missing else []
        return Undecodable(f"command {kind.TYPE} {' and '.join(problems)}")
    return kind(**fields)


def encode_entry(commands: Sequence[Command]) -> str:
    """One Raft entry's payload: version 2; 3 when a command carries a request id; 4 when
    a registration carries new_process (the earliest version every command can be read in)."""
    documents = [command_json(c) for c in commands]
    if any("new_process" in d for d in documents):
        version = ENCODING_VERSION_NEW_PROCESS
    elif any("request_id" in d for d in documents):
        version = ENCODING_VERSION_REQUEST_IDS
    else:
        version = ENCODING_VERSION
    return json.dumps({"version": version, "commands": documents}, separators=(",", ":"))


def decode_entry(payload: str) -> list[Command]:
    """The commands of a Raft entry in any known encoding version; UnknownEncoding for a
    payload that is neither (this node is older than the one that wrote it)."""
    document = json.loads(payload)
    if isinstance(document, list):  # version 1
        return [command_from_json(c) for c in document]
    if isinstance(document, dict) and document.get("version") in (
        ENCODING_VERSION,
        ENCODING_VERSION_REQUEST_IDS,
        ENCODING_VERSION_NEW_PROCESS,
    ):
        return [command_from_json(c) for c in document["commands"]]
    version = document.get("version") if isinstance(document, dict) else None
    raise UnknownEncoding(
        f"a Raft entry in encoding version {version!r}: this node reads versions 1 to "
        f"{ENCODING_VERSION_NEW_PROCESS}; upgrade it before the node that wrote the entry"
    )
