from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ElectTrigger(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELECT_TRIGGER_UNSPECIFIED: _ClassVar[ElectTrigger]
    ELECT_TRIGGER_BROKER: _ClassVar[ElectTrigger]
    ELECT_TRIGGER_ADMIN: _ClassVar[ElectTrigger]
    ELECT_TRIGGER_CONTROLLER: _ClassVar[ElectTrigger]
    ELECT_TRIGGER_HANDOFF: _ClassVar[ElectTrigger]
ELECT_TRIGGER_UNSPECIFIED: ElectTrigger
ELECT_TRIGGER_BROKER: ElectTrigger
ELECT_TRIGGER_ADMIN: ElectTrigger
ELECT_TRIGGER_CONTROLLER: ElectTrigger
ELECT_TRIGGER_HANDOFF: ElectTrigger

class BrokerSetRef(_message.Message):
    __slots__ = ("cluster", "broker_name")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("broker_id", "address", "election_priority", "alive")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    address: str
    election_priority: int
    alive: bool
    def __init__(self, broker_id: _Optional[int] = ..., address: _Optional[str] = ..., election_priority: _Optional[int] = ..., alive: _Optional[bool] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_broker_id", "master_address", "master_epoch", "sync_state_set", "sync_state_set_epoch", "replicas")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_broker_id: int
    master_address: str
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_broker_id: _Optional[int] = ..., master_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_id", "check_code", "address", "election_priority", "new_process")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_CODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NEW_PROCESS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_id: int
    check_code: str
    address: str
    election_priority: int
    new_process: bool
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., check_code: _Optional[str] = ..., address: _Optional[str] = ..., election_priority: _Optional[int] = ..., new_process: _Optional[bool] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("broker_id", "replica_info")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_INFO_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    replica_info: ReplicaInfo
    def __init__(self, broker_id: _Optional[int] = ..., replica_info: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class NextBrokerIdResponse(_message.Message):
    __slots__ = ("next_broker_id",)
    NEXT_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    next_broker_id: int
    def __init__(self, next_broker_id: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_id", "epoch", "max_offset", "confirm_offset", "election_priority")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ELECTION_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_id: int
    epoch: int
    max_offset: int
    confirm_offset: int
    election_priority: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ..., election_priority: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("master_broker_id", "master_epoch", "sync_state_set_epoch", "lease_ms")
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    master_broker_id: int
    master_epoch: int
    sync_state_set_epoch: int
    lease_ms: int
    def __init__(self, master_broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., sync_state_set_epoch: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class ElectMasterRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "trigger", "requester_broker_id", "preferred_broker_id", "master_epoch", "master_unreachable")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    trigger: ElectTrigger
    requester_broker_id: int
    preferred_broker_id: int
    master_epoch: int
    master_unreachable: bool
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., trigger: _Optional[_Union[ElectTrigger, str]] = ..., requester_broker_id: _Optional[int] = ..., preferred_broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., master_unreachable: _Optional[bool] = ...) -> None: ...

class AlterSyncStateSetRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_broker_id", "master_epoch", "sync_state_set_epoch", "new_sync_state_set")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    sync_state_set_epoch: int
    new_sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., sync_state_set_epoch: _Optional[int] = ..., new_sync_state_set: _Optional[_Iterable[int]] = ...) -> None: ...

class SyncStateData(_message.Message):
    __slots__ = ("replica_info", "in_sync_replicas", "out_of_sync_replicas")
    REPLICA_INFO_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replica_info: ReplicaInfo
    in_sync_replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    out_of_sync_replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, replica_info: _Optional[_Union[ReplicaInfo, _Mapping]] = ..., in_sync_replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., out_of_sync_replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class CleanBrokerDataRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_ids", "force")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_ids: _containers.RepeatedScalarFieldContainer[int]
    force: bool
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_ids: _Optional[_Iterable[int]] = ..., force: _Optional[bool] = ...) -> None: ...

class CleanBrokerDataResponse(_message.Message):
    __slots__ = ("cleaned_broker_ids", "broker_set_removed")
    CLEANED_BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    BROKER_SET_REMOVED_FIELD_NUMBER: _ClassVar[int]
    cleaned_broker_ids: _containers.RepeatedScalarFieldContainer[int]
    broker_set_removed: bool
    def __init__(self, cleaned_broker_ids: _Optional[_Iterable[int]] = ..., broker_set_removed: _Optional[bool] = ...) -> None: ...

class GetMetadataRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControllerNode(_message.Message):
    __slots__ = ("id", "grpc", "raft", "role", "healthy")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    RAFT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    id: str
    grpc: str
    raft: str
    role: str
    healthy: bool
    def __init__(self, id: _Optional[str] = ..., grpc: _Optional[str] = ..., raft: _Optional[str] = ..., role: _Optional[str] = ..., healthy: _Optional[bool] = ...) -> None: ...

class ControllerMetadata(_message.Message):
    __slots__ = ("node_id", "leader_id", "leader_grpc", "term", "commit_index", "last_applied", "nodes", "state_digest")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_GRPC_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    leader_id: str
    leader_grpc: str
    term: int
    commit_index: int
    last_applied: int
    nodes: _containers.RepeatedCompositeFieldContainer[ControllerNode]
    state_digest: str
    def __init__(self, node_id: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_grpc: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., last_applied: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[ControllerNode, _Mapping]]] = ..., state_digest: _Optional[str] = ...) -> None: ...

class ListBrokerSetsRequest(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    def __init__(self, cluster: _Optional[str] = ...) -> None: ...

class ListBrokerSetsResponse(_message.Message):
    __slots__ = ("broker_sets",)
    BROKER_SETS_FIELD_NUMBER: _ClassVar[int]
    broker_sets: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    def __init__(self, broker_sets: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ...) -> None: ...

class TopicSpec(_message.Message):
    __slots__ = ("name", "cluster", "queue_count", "broker_names", "perm", "message_type", "if_queue_count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAMES_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    IF_QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    cluster: str
    queue_count: int
    broker_names: _containers.RepeatedScalarFieldContainer[str]
    perm: str
    message_type: str
    if_queue_count: int
    def __init__(self, name: _Optional[str] = ..., cluster: _Optional[str] = ..., queue_count: _Optional[int] = ..., broker_names: _Optional[_Iterable[str]] = ..., perm: _Optional[str] = ..., message_type: _Optional[str] = ..., if_queue_count: _Optional[int] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("name", "cluster", "queue_count", "broker_names", "perm", "message_type", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAMES_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    cluster: str
    queue_count: int
    broker_names: _containers.RepeatedScalarFieldContainer[str]
    perm: str
    message_type: str
    version: int
    def __init__(self, name: _Optional[str] = ..., cluster: _Optional[str] = ..., queue_count: _Optional[int] = ..., broker_names: _Optional[_Iterable[str]] = ..., perm: _Optional[str] = ..., message_type: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class NameRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[Topic]
    def __init__(self, topics: _Optional[_Iterable[_Union[Topic, _Mapping]]] = ...) -> None: ...

class QueueRoute(_message.Message):
    __slots__ = ("broker_name", "read_queue_count", "write_queue_count", "perm")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    read_queue_count: int
    write_queue_count: int
    perm: str
    def __init__(self, broker_name: _Optional[str] = ..., read_queue_count: _Optional[int] = ..., write_queue_count: _Optional[int] = ..., perm: _Optional[str] = ...) -> None: ...

class BrokerRoute(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_broker_id", "master_address", "master_epoch", "addresses")
    class AddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_broker_id: int
    master_address: str
    master_epoch: int
    addresses: _containers.ScalarMap[int, str]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_broker_id: _Optional[int] = ..., master_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., addresses: _Optional[_Mapping[int, str]] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "message_type", "queues", "brokers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_type: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueRoute]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerRoute]
    def __init__(self, topic: _Optional[str] = ..., message_type: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueRoute, _Mapping]]] = ..., brokers: _Optional[_Iterable[_Union[BrokerRoute, _Mapping]]] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("topic", "expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    expression: str
    def __init__(self, topic: _Optional[str] = ..., expression: _Optional[str] = ...) -> None: ...

class GroupSpec(_message.Message):
    __slots__ = ("name", "subscriptions", "consume_from", "consume_timestamp_ms", "retry_max_times", "retry_policy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FROM_FIELD_NUMBER: _ClassVar[int]
    CONSUME_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_MAX_TIMES_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    name: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    consume_from: str
    consume_timestamp_ms: int
    retry_max_times: int
    retry_policy: str
    def __init__(self, name: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., consume_from: _Optional[str] = ..., consume_timestamp_ms: _Optional[int] = ..., retry_max_times: _Optional[int] = ..., retry_policy: _Optional[str] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("name", "subscriptions", "consume_from", "consume_timestamp_ms", "retry_max_times", "retry_policy", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FROM_FIELD_NUMBER: _ClassVar[int]
    CONSUME_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_MAX_TIMES_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    consume_from: str
    consume_timestamp_ms: int
    retry_max_times: int
    retry_policy: str
    version: int
    def __init__(self, name: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., consume_from: _Optional[str] = ..., consume_timestamp_ms: _Optional[int] = ..., retry_max_times: _Optional[int] = ..., retry_policy: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[Group]
    def __init__(self, groups: _Optional[_Iterable[_Union[Group, _Mapping]]] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControllerConfig(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateConfigRequest(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WriteOp(_message.Message):
    __slots__ = ("create_topic", "update_topic", "delete_topic", "create_group", "update_group", "delete_group", "update_config")
    CREATE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    DELETE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    CREATE_GROUP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_GROUP_FIELD_NUMBER: _ClassVar[int]
    DELETE_GROUP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    create_topic: TopicSpec
    update_topic: TopicSpec
    delete_topic: str
    create_group: GroupSpec
    update_group: GroupSpec
    delete_group: str
    update_config: UpdateConfigRequest
    def __init__(self, create_topic: _Optional[_Union[TopicSpec, _Mapping]] = ..., update_topic: _Optional[_Union[TopicSpec, _Mapping]] = ..., delete_topic: _Optional[str] = ..., create_group: _Optional[_Union[GroupSpec, _Mapping]] = ..., update_group: _Optional[_Union[GroupSpec, _Mapping]] = ..., delete_group: _Optional[str] = ..., update_config: _Optional[_Union[UpdateConfigRequest, _Mapping]] = ...) -> None: ...

class WriteBatch(_message.Message):
    __slots__ = ("writes",)
    WRITES_FIELD_NUMBER: _ClassVar[int]
    writes: _containers.RepeatedCompositeFieldContainer[WriteOp]
    def __init__(self, writes: _Optional[_Iterable[_Union[WriteOp, _Mapping]]] = ...) -> None: ...

class WriteResult(_message.Message):
    __slots__ = ("error_code", "message", "topic", "group", "config", "deleted")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    error_code: str
    message: str
    topic: Topic
    group: Group
    config: ControllerConfig
    deleted: str
    def __init__(self, error_code: _Optional[str] = ..., message: _Optional[str] = ..., topic: _Optional[_Union[Topic, _Mapping]] = ..., group: _Optional[_Union[Group, _Mapping]] = ..., config: _Optional[_Union[ControllerConfig, _Mapping]] = ..., deleted: _Optional[str] = ...) -> None: ...

class WriteResults(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[WriteResult]
    def __init__(self, results: _Optional[_Iterable[_Union[WriteResult, _Mapping]]] = ...) -> None: ...

class TieredSegment(_message.Message):
    __slots__ = ("key", "base_offset", "end_offset", "size", "sha256", "record_count", "first_epoch", "last_epoch")
    KEY_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    key: str
    base_offset: int
    end_offset: int
    size: int
    sha256: str
    record_count: int
    first_epoch: int
    last_epoch: int
    def __init__(self, key: _Optional[str] = ..., base_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., record_count: _Optional[int] = ..., first_epoch: _Optional[int] = ..., last_epoch: _Optional[int] = ...) -> None: ...

class TieredEpoch(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class TieredCheckpoint(_message.Message):
    __slots__ = ("cluster", "broker_name", "uploaded_offset", "checkpoint_epoch", "segments", "epochs", "inflight_upload_id", "inflight_base_offset", "inflight_end_offset", "abandoned_upload_ids")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_UPLOAD_IDS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    uploaded_offset: int
    checkpoint_epoch: int
    segments: _containers.RepeatedCompositeFieldContainer[TieredSegment]
    epochs: _containers.RepeatedCompositeFieldContainer[TieredEpoch]
    inflight_upload_id: str
    inflight_base_offset: int
    inflight_end_offset: int
    abandoned_upload_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., uploaded_offset: _Optional[int] = ..., checkpoint_epoch: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[TieredSegment, _Mapping]]] = ..., epochs: _Optional[_Iterable[_Union[TieredEpoch, _Mapping]]] = ..., inflight_upload_id: _Optional[str] = ..., inflight_base_offset: _Optional[int] = ..., inflight_end_offset: _Optional[int] = ..., abandoned_upload_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TieredUploadStartRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_broker_id", "master_epoch", "upload_id", "base_offset", "end_offset")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    upload_id: str
    base_offset: int
    end_offset: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., upload_id: _Optional[str] = ..., base_offset: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class TieredCommitRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_broker_id", "master_epoch", "upload_id", "segments", "epochs")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    upload_id: str
    segments: _containers.RepeatedCompositeFieldContainer[TieredSegment]
    epochs: _containers.RepeatedCompositeFieldContainer[TieredEpoch]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., upload_id: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[TieredSegment, _Mapping]]] = ..., epochs: _Optional[_Iterable[_Union[TieredEpoch, _Mapping]]] = ...) -> None: ...

class TieredForgetRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_broker_id", "master_epoch", "upload_ids")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_IDS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_broker_id: int
    master_epoch: int
    upload_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_broker_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., upload_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("cluster", "broker_name")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("index", "kind", "cluster", "broker_name", "name", "replica_info")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICA_INFO_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    cluster: str
    broker_name: str
    name: str
    replica_info: ReplicaInfo
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., name: _Optional[str] = ..., replica_info: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class WatchBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WatchEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[WatchEvent, _Mapping]]] = ...) -> None: ...

class ReplicatorTaskKey(_message.Message):
    __slots__ = ("rule", "topic", "broker_name", "queue_id")
    RULE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    rule: str
    topic: str
    broker_name: str
    queue_id: int
    def __init__(self, rule: _Optional[str] = ..., topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class ReplicatorTaskStats(_message.Message):
    __slots__ = ("task", "epoch", "replicated", "replicated_bytes", "errors", "lag_messages", "delay_ms", "last_sync_ms", "messages_per_s")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SYNC_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_PER_S_FIELD_NUMBER: _ClassVar[int]
    task: ReplicatorTaskKey
    epoch: int
    replicated: int
    replicated_bytes: int
    errors: int
    lag_messages: int
    delay_ms: int
    last_sync_ms: int
    messages_per_s: float
    def __init__(self, task: _Optional[_Union[ReplicatorTaskKey, _Mapping]] = ..., epoch: _Optional[int] = ..., replicated: _Optional[int] = ..., replicated_bytes: _Optional[int] = ..., errors: _Optional[int] = ..., lag_messages: _Optional[int] = ..., delay_ms: _Optional[int] = ..., last_sync_ms: _Optional[int] = ..., messages_per_s: _Optional[float] = ...) -> None: ...

class ReplicatorHeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "incarnation", "lease_ms", "dead_after_ms", "rules", "tasks", "running", "leaving")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    incarnation: str
    lease_ms: int
    dead_after_ms: int
    rules: _containers.RepeatedScalarFieldContainer[str]
    tasks: _containers.RepeatedCompositeFieldContainer[ReplicatorTaskKey]
    running: _containers.RepeatedCompositeFieldContainer[ReplicatorTaskStats]
    leaving: bool
    def __init__(self, worker_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., lease_ms: _Optional[int] = ..., dead_after_ms: _Optional[int] = ..., rules: _Optional[_Iterable[str]] = ..., tasks: _Optional[_Iterable[_Union[ReplicatorTaskKey, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[ReplicatorTaskStats, _Mapping]]] = ..., leaving: _Optional[bool] = ...) -> None: ...

class ReplicatorLease(_message.Message):
    __slots__ = ("task", "epoch", "start_offset", "acked_offset", "rule_digest")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RULE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    task: ReplicatorTaskKey
    epoch: int
    start_offset: int
    acked_offset: int
    rule_digest: str
    def __init__(self, task: _Optional[_Union[ReplicatorTaskKey, _Mapping]] = ..., epoch: _Optional[int] = ..., start_offset: _Optional[int] = ..., acked_offset: _Optional[int] = ..., rule_digest: _Optional[str] = ...) -> None: ...

class ReplicatorHeartbeatResponse(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[ReplicatorLease]
    def __init__(self, leases: _Optional[_Iterable[_Union[ReplicatorLease, _Mapping]]] = ...) -> None: ...

class CommitReplicatorTaskRequest(_message.Message):
    __slots__ = ("worker_id", "task", "epoch", "start_offset", "acked_offset", "replicated", "rule_digest")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    RULE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task: ReplicatorTaskKey
    epoch: int
    start_offset: int
    acked_offset: int
    replicated: int
    rule_digest: str
    def __init__(self, worker_id: _Optional[str] = ..., task: _Optional[_Union[ReplicatorTaskKey, _Mapping]] = ..., epoch: _Optional[int] = ..., start_offset: _Optional[int] = ..., acked_offset: _Optional[int] = ..., replicated: _Optional[int] = ..., rule_digest: _Optional[str] = ...) -> None: ...

class ReplicatorCheckpoint(_message.Message):
    __slots__ = ("task", "worker_id", "epoch", "start_offset", "acked_offset", "replicated")
    TASK_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    task: ReplicatorTaskKey
    worker_id: str
    epoch: int
    start_offset: int
    acked_offset: int
    replicated: int
    def __init__(self, task: _Optional[_Union[ReplicatorTaskKey, _Mapping]] = ..., worker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., start_offset: _Optional[int] = ..., acked_offset: _Optional[int] = ..., replicated: _Optional[int] = ...) -> None: ...

class GetReplicatorStatusRequest(_message.Message):
    __slots__ = ("rule",)
    RULE_FIELD_NUMBER: _ClassVar[int]
    rule: str
    def __init__(self, rule: _Optional[str] = ...) -> None: ...

class ReplicatorTaskStatus(_message.Message):
    __slots__ = ("task", "worker_id", "epoch", "start_offset", "acked_offset", "running", "stats")
    TASK_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    task: ReplicatorTaskKey
    worker_id: str
    epoch: int
    start_offset: int
    acked_offset: int
    running: bool
    stats: ReplicatorTaskStats
    def __init__(self, task: _Optional[_Union[ReplicatorTaskKey, _Mapping]] = ..., worker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., start_offset: _Optional[int] = ..., acked_offset: _Optional[int] = ..., running: _Optional[bool] = ..., stats: _Optional[_Union[ReplicatorTaskStats, _Mapping]] = ...) -> None: ...

class ReplicatorRuleStatus(_message.Message):
    __slots__ = ("name", "tasks", "replicated", "lag_messages", "delay_ms", "last_sync_ms", "messages_per_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SYNC_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_PER_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    tasks: _containers.RepeatedCompositeFieldContainer[ReplicatorTaskStatus]
    replicated: int
    lag_messages: int
    delay_ms: int
    last_sync_ms: int
    messages_per_s: float
    def __init__(self, name: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[ReplicatorTaskStatus, _Mapping]]] = ..., replicated: _Optional[int] = ..., lag_messages: _Optional[int] = ..., delay_ms: _Optional[int] = ..., last_sync_ms: _Optional[int] = ..., messages_per_s: _Optional[float] = ...) -> None: ...

class ReplicatorWorker(_message.Message):
    __slots__ = ("worker_id", "running")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    running: _containers.RepeatedCompositeFieldContainer[ReplicatorTaskKey]
    def __init__(self, worker_id: _Optional[str] = ..., running: _Optional[_Iterable[_Union[ReplicatorTaskKey, _Mapping]]] = ...) -> None: ...

class ReplicatorStatus(_message.Message):
    __slots__ = ("rules", "workers")
    RULES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[ReplicatorRuleStatus]
    workers: _containers.RepeatedCompositeFieldContainer[ReplicatorWorker]
    def __init__(self, rules: _Optional[_Iterable[_Union[ReplicatorRuleStatus, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[ReplicatorWorker, _Mapping]]] = ...) -> None: ...

class GetCommandHistoryRequest(_message.Message):
    __slots__ = ("limit", "before_index", "command_types")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMAND_TYPES_FIELD_NUMBER: _ClassVar[int]
    limit: int
    before_index: int
    command_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, limit: _Optional[int] = ..., before_index: _Optional[int] = ..., command_types: _Optional[_Iterable[str]] = ...) -> None: ...

class AppliedCommand(_message.Message):
    __slots__ = ("index", "term", "position", "command", "fields", "result", "code", "message", "time_ms")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    position: int
    command: str
    fields: _containers.ScalarMap[str, str]
    result: str
    code: str
    message: str
    time_ms: int
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., position: _Optional[int] = ..., command: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ..., result: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., time_ms: _Optional[int] = ...) -> None: ...

class CommandHistory(_message.Message):
    __slots__ = ("commands", "next_before_index", "oldest_index", "last_applied_index", "node_id")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEFORE_INDEX_FIELD_NUMBER: _ClassVar[int]
    OLDEST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[AppliedCommand]
    next_before_index: int
    oldest_index: int
    last_applied_index: int
    node_id: str
    def __init__(self, commands: _Optional[_Iterable[_Union[AppliedCommand, _Mapping]]] = ..., next_before_index: _Optional[int] = ..., oldest_index: _Optional[int] = ..., last_applied_index: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...
