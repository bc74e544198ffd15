from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Message(_message.Message):
    __slots__ = ("topic", "queue_id", "body", "tags", "keys", "properties", "producer_id", "producer_seq")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SEQ_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    body: bytes
    tags: str
    keys: str
    properties: _containers.ScalarMap[str, str]
    producer_id: str
    producer_seq: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., body: _Optional[bytes] = ..., tags: _Optional[str] = ..., keys: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., producer_id: _Optional[str] = ..., producer_seq: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("msg_id", "topic", "queue_id", "queue_offset", "commit_offset", "duplicate")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    duplicate: bool
    def __init__(self, msg_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_offset: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("results", "master_epoch")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    master_epoch: int
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ..., master_epoch: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "max_count", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    max_count: int
    group: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., max_count: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("msg_id", "topic", "queue_id", "queue_offset", "commit_offset", "epoch", "store_timestamp_ms", "body", "tags", "keys", "properties", "producer_id", "producer_seq")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SEQ_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    epoch: int
    store_timestamp_ms: int
    body: bytes
    tags: str
    keys: str
    properties: _containers.ScalarMap[str, str]
    producer_id: str
    producer_seq: int
    def __init__(self, msg_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_offset: _Optional[int] = ..., epoch: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., body: _Optional[bytes] = ..., tags: _Optional[str] = ..., keys: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., producer_id: _Optional[str] = ..., producer_seq: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("messages", "next_queue_offset", "max_queue_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    next_queue_offset: int
    max_queue_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., next_queue_offset: _Optional[int] = ..., max_queue_offset: _Optional[int] = ...) -> None: ...

class CommitOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class QueryOffsetResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class EpochEntry(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class EpochCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EpochCache(_message.Message):
    __slots__ = ("broker_name", "broker_id", "entries", "max_offset", "confirm_offset")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_id: int
    entries: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    max_offset: int
    confirm_offset: int
    def __init__(self, broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ...) -> None: ...

class HaStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlaveStatus(_message.Message):
    __slots__ = ("broker_id", "acked_offset", "in_sync", "lag_bytes", "last_fetch_ms_ago", "streamed")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCH_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    STREAMED_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    acked_offset: int
    in_sync: bool
    lag_bytes: int
    last_fetch_ms_ago: int
    streamed: bool
    def __init__(self, broker_id: _Optional[int] = ..., acked_offset: _Optional[int] = ..., in_sync: _Optional[bool] = ..., lag_bytes: _Optional[int] = ..., last_fetch_ms_ago: _Optional[int] = ..., streamed: _Optional[bool] = ...) -> None: ...

class HaStatus(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_id", "role", "master_epoch", "master_broker_id", "master_address", "max_offset", "confirm_offset", "sync_state_set", "sync_state_set_epoch", "slaves", "lease_valid", "writable", "remoting_address")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SLAVES_FIELD_NUMBER: _ClassVar[int]
    LEASE_VALID_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    REMOTING_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_id: int
    role: str
    master_epoch: int
    master_broker_id: int
    master_address: str
    max_offset: int
    confirm_offset: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    slaves: _containers.RepeatedCompositeFieldContainer[SlaveStatus]
    lease_valid: bool
    writable: bool
    remoting_address: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., role: _Optional[str] = ..., master_epoch: _Optional[int] = ..., master_broker_id: _Optional[int] = ..., master_address: _Optional[str] = ..., max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., slaves: _Optional[_Iterable[_Union[SlaveStatus, _Mapping]]] = ..., lease_valid: _Optional[bool] = ..., writable: _Optional[bool] = ..., remoting_address: _Optional[str] = ...) -> None: ...

class HaFetchRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_id", "master_epoch", "fetch_offset", "epoch_entries", "handshake", "max_bytes", "wait_ms", "leaving")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_id: int
    master_epoch: int
    fetch_offset: int
    epoch_entries: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    handshake: bool
    max_bytes: int
    wait_ms: int
    leaving: bool
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., epoch_entries: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., handshake: _Optional[bool] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., leaving: _Optional[bool] = ...) -> None: ...

class HaFetchResponse(_message.Message):
    __slots__ = ("master_epoch", "master_max_offset", "confirm_offset", "truncate_to", "data_offset", "data", "epoch_entries", "min_offset", "offset_moved_to_tiered", "stream_port")
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TO_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MOVED_TO_TIERED_FIELD_NUMBER: _ClassVar[int]
    STREAM_PORT_FIELD_NUMBER: _ClassVar[int]
    master_epoch: int
    master_max_offset: int
    confirm_offset: int
    truncate_to: int
    data_offset: int
    data: bytes
    epoch_entries: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    min_offset: int
    offset_moved_to_tiered: bool
    stream_port: int
    def __init__(self, master_epoch: _Optional[int] = ..., master_max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ..., truncate_to: _Optional[int] = ..., data_offset: _Optional[int] = ..., data: _Optional[bytes] = ..., epoch_entries: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., min_offset: _Optional[int] = ..., offset_moved_to_tiered: _Optional[bool] = ..., stream_port: _Optional[int] = ...) -> None: ...

class QueryOriginRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "topic", "queue_id", "translate")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    topic: str
    queue_id: int
    translate: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., translate: _Optional[int] = ...) -> None: ...

class QueryOriginResponse(_message.Message):
    __slots__ = ("offset", "topic", "queue_id", "queue_offset", "translated")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRANSLATED_FIELD_NUMBER: _ClassVar[int]
    offset: int
    topic: str
    queue_id: int
    queue_offset: int
    translated: int
    def __init__(self, offset: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., translated: _Optional[int] = ...) -> None: ...

class ListConsumerOffsetsRequest(_message.Message):
    __slots__ = ("topic", "queue_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class ConsumerOffset(_message.Message):
    __slots__ = ("group", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    offset: int
    def __init__(self, group: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ListConsumerOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[ConsumerOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[ConsumerOffset, _Mapping]]] = ...) -> None: ...

class QueuePosition(_message.Message):
    __slots__ = ("queue_id", "queue_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    queue_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ...) -> None: ...

class TimeRange(_message.Message):
    __slots__ = ("since_ms", "until_ms")
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    since_ms: int
    until_ms: int
    def __init__(self, since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ...) -> None: ...

class QueryMessagesRequest(_message.Message):
    __slots__ = ("topic", "msg_id", "key", "position", "time_range", "max_count", "body_bytes_max")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TIME_RANGE_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    BODY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    topic: str
    msg_id: str
    key: str
    position: QueuePosition
    time_range: TimeRange
    max_count: int
    body_bytes_max: int
    def __init__(self, topic: _Optional[str] = ..., msg_id: _Optional[str] = ..., key: _Optional[str] = ..., position: _Optional[_Union[QueuePosition, _Mapping]] = ..., time_range: _Optional[_Union[TimeRange, _Mapping]] = ..., max_count: _Optional[int] = ..., body_bytes_max: _Optional[int] = ...) -> None: ...

class QueriedMessage(_message.Message):
    __slots__ = ("message", "body_truncated", "body_bytes", "born_timestamp_ms", "broker_name", "confirmed", "origin")
    class OriginEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BODY_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    BODY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    body_truncated: bool
    body_bytes: int
    born_timestamp_ms: int
    broker_name: str
    confirmed: bool
    origin: _containers.ScalarMap[str, str]
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ..., body_truncated: _Optional[bool] = ..., body_bytes: _Optional[int] = ..., born_timestamp_ms: _Optional[int] = ..., broker_name: _Optional[str] = ..., confirmed: _Optional[bool] = ..., origin: _Optional[_Mapping[str, str]] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("messages", "key_covered_from")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    KEY_COVERED_FROM_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[QueriedMessage]
    key_covered_from: int
    def __init__(self, messages: _Optional[_Iterable[_Union[QueriedMessage, _Mapping]]] = ..., key_covered_from: _Optional[int] = ...) -> None: ...

class TraceMessageRequest(_message.Message):
    __slots__ = ("msg_id", "topic", "position")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    topic: str
    position: QueuePosition
    def __init__(self, msg_id: _Optional[str] = ..., topic: _Optional[str] = ..., position: _Optional[_Union[QueuePosition, _Mapping]] = ...) -> None: ...

class ReplicaHolding(_message.Message):
    __slots__ = ("broker_id", "acked_offset", "holds")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    acked_offset: int
    holds: bool
    def __init__(self, broker_id: _Optional[int] = ..., acked_offset: _Optional[int] = ..., holds: _Optional[bool] = ...) -> None: ...

class GroupPosition(_message.Message):
    __slots__ = ("group", "consumed_offset", "consumed")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    group: str
    consumed_offset: int
    consumed: bool
    def __init__(self, group: _Optional[str] = ..., consumed_offset: _Optional[int] = ..., consumed: _Optional[bool] = ...) -> None: ...

class RetryCopy(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "msg_id", "reconsume_times", "dead_letter")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    reconsume_times: int
    dead_letter: bool
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., msg_id: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., dead_letter: _Optional[bool] = ...) -> None: ...

class TraceMessageResponse(_message.Message):
    __slots__ = ("message", "commit_offset", "end_offset", "master_epoch", "role", "confirm_offset", "replicas", "tiered_offset", "tiered", "groups", "retries")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TIERED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIERED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    message: QueriedMessage
    commit_offset: int
    end_offset: int
    master_epoch: int
    role: str
    confirm_offset: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaHolding]
    tiered_offset: int
    tiered: bool
    groups: _containers.RepeatedCompositeFieldContainer[GroupPosition]
    retries: _containers.RepeatedCompositeFieldContainer[RetryCopy]
    def __init__(self, message: _Optional[_Union[QueriedMessage, _Mapping]] = ..., commit_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., master_epoch: _Optional[int] = ..., role: _Optional[str] = ..., confirm_offset: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaHolding, _Mapping]]] = ..., tiered_offset: _Optional[int] = ..., tiered: _Optional[bool] = ..., groups: _Optional[_Iterable[_Union[GroupPosition, _Mapping]]] = ..., retries: _Optional[_Iterable[_Union[RetryCopy, _Mapping]]] = ...) -> None: ...

class ResendMessageRequest(_message.Message):
    __slots__ = ("group", "msg_id", "topic", "position")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    group: str
    msg_id: str
    topic: str
    position: QueuePosition
    def __init__(self, group: _Optional[str] = ..., msg_id: _Optional[str] = ..., topic: _Optional[str] = ..., position: _Optional[_Union[QueuePosition, _Mapping]] = ...) -> None: ...

class ResendMessageResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: SendResult
    def __init__(self, result: _Optional[_Union[SendResult, _Mapping]] = ...) -> None: ...

class GroupLagRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueLag(_message.Message):
    __slots__ = ("topic", "queue_id", "consumed_offset", "max_offset", "backlog", "backlog_ms", "acknowledged_above")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_MS_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_ABOVE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    consumed_offset: int
    max_offset: int
    backlog: int
    backlog_ms: int
    acknowledged_above: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., consumed_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., backlog: _Optional[int] = ..., backlog_ms: _Optional[int] = ..., acknowledged_above: _Optional[int] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("client_id", "protocol", "last_seen_ms_ago")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    protocol: str
    last_seen_ms_ago: int
    def __init__(self, client_id: _Optional[str] = ..., protocol: _Optional[str] = ..., last_seen_ms_ago: _Optional[int] = ...) -> None: ...

class GroupLagResponse(_message.Message):
    __slots__ = ("broker_name", "queues", "members", "backlog", "backlog_ms")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_MS_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueLag]
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    backlog: int
    backlog_ms: int
    def __init__(self, broker_name: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueLag, _Mapping]]] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., backlog: _Optional[int] = ..., backlog_ms: _Optional[int] = ...) -> None: ...

class ResetOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic", "timestamp_ms", "earliest", "latest", "force")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    timestamp_ms: int
    earliest: bool
    latest: bool
    force: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class ResetOffsetsResponse(_message.Message):
    __slots__ = ("queues", "broker_name")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueLag]
    broker_name: str
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueLag, _Mapping]]] = ..., broker_name: _Optional[str] = ...) -> None: ...

class HandoffRequest(_message.Message):
    __slots__ = ("preferred_broker_id",)
    PREFERRED_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    preferred_broker_id: int
    def __init__(self, preferred_broker_id: _Optional[int] = ...) -> None: ...

class HandoffResponse(_message.Message):
    __slots__ = ("master_broker_id", "master_address", "master_epoch", "unavailable_ms")
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_MS_FIELD_NUMBER: _ClassVar[int]
    master_broker_id: int
    master_address: str
    master_epoch: int
    unavailable_ms: int
    def __init__(self, master_broker_id: _Optional[int] = ..., master_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., unavailable_ms: _Optional[int] = ...) -> None: ...
