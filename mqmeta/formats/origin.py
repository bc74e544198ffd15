"""Where a replicated message came from: the origin properties (cross-cluster replication).

A message the replicator copies into another cluster keeps its body, tags, keys,
properties and message id, and gains these properties:

    __ORIGIN_CLUSTER, __ORIGIN_BROKER, __ORIGIN_TOPIC, __ORIGIN_QUEUE, __ORIGIN_OFFSET
        the origin key: the source cluster, broker set, topic, queue id and queue offset
        of the record it copies (the idempotence key the target deduplicates on);
    __ORIGIN_PREV      the origin offset of the previous message the replicator sent of
                       the same origin queue (-1: none): the chain the target checks, so
                       a batch is stored only if it directly follows what the target holds;
    __ORIGIN_STORE_MS  when the source stored it;
    __ORIGIN_BORN_MS   when it was first stored anywhere (kept across hops);
    __ORIGIN_MSG_ID    the source record's message id: the copy is stored under the same id;
    __ORIGIN_PATH      the clusters it passed through, oldest first, comma-separated: a
                       message never enters a cluster on its path (no loops, X2).

Pure and standard-library only: the broker, the replicator and the Spark audit read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from mqmeta.errors import InvalidArgument
from mqmeta.validate import NAME_PATTERN, REQUEST_INT_MAX

PREFIX = "__ORIGIN_"
CLUSTER = "__ORIGIN_CLUSTER"
BROKER = "__ORIGIN_BROKER"
TOPIC = "__ORIGIN_TOPIC"
QUEUE = "__ORIGIN_QUEUE"
OFFSET = "__ORIGIN_OFFSET"
PREVIOUS = "__ORIGIN_PREV"
STORE_MS = "__ORIGIN_STORE_MS"
BORN_MS = "__ORIGIN_BORN_MS"
PATH = "__ORIGIN_PATH"
MSG_ID = "__ORIGIN_MSG_ID"
KEY_PROPERTIES = (CLUSTER, BROKER, TOPIC, QUEUE, OFFSET)
RMQ_BORN_MS = "__RMQ_BORN_MS"  # a RocketMQ 5 client's born time (mqmeta.rocketmq.BORN_MS)
PATH_CLUSTERS_MAX = 16
NO_PREVIOUS = -1
# An origin offset is read from a message property that any producer can set, then summed
# (the next offset, offset + 1) and sent in int64 fields: it is held to the bound of a value
# from outside (mqmeta.validate.REQUEST_INT_MAX, 2**62, so a sum of two never overflows),
# not to the formats' OFFSET_MAX.
ORIGIN_OFFSET_MAX = REQUEST_INT_MAX


class OriginKey(NamedTuple):
    """One source queue: what a target deduplicates by."""

    cluster: str
    broker_name: str
    topic: str
    queue_id: int

    def label(self) -> str:
        return f"{self.cluster}/{self.broker_name}/{self.topic}/{self.queue_id}"


class Origin(NamedTuple):
    key: OriginKey
    offset: int  # the source queue offset
    previous: int  # the origin offset this one follows in the replicator's chain, or NO_PREVIOUS
    store_ms: int


def _int(properties: Mapping[str, str], name: str, minimum: int) -> int:
    text = properties.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"property {name}={text!r} is not a whole number") from None
    if not minimum <= value <= ORIGIN_OFFSET_MAX:
        raise InvalidArgument(f"property {name}={value} is out of range")
    return value


def origin_of(properties: Mapping[str, str]) -> Origin | None:
    """The origin a message's properties name; None for a message that was not replicated.
    InvalidArgument when some but not all key properties are present or one is malformed."""
    present = [name for name in KEY_PROPERTIES if name in properties]
    if not present:
        return None
    if len(present) != len(KEY_PROPERTIES):
        missing = ", ".join(n for n in KEY_PROPERTIES if n not in properties)
        raise InvalidArgument(f"a replicated message needs every origin property; {missing} missing")
    for name in (CLUSTER, BROKER, TOPIC):
        if not NAME_PATTERN.fullmatch(properties[name]):
            raise InvalidArgument(f"property {name}={properties[name]!r} is not a valid name")
    key = OriginKey(properties[CLUSTER], properties[BROKER], properties[TOPIC], _int(properties, QUEUE, 0))
    previous = _int(properties, PREVIOUS, NO_PREVIOUS) if PREVIOUS in properties else NO_PREVIOUS
    store_ms = _int(properties, STORE_MS, 0) if STORE_MS in properties else 0
    return Origin(key, _int(properties, OFFSET, 0), previous, store_ms)


def path_of(properties: Mapping[str, str]) -> list[str]:
    """The clusters a message has passed through, oldest first."""
    text = properties.get(PATH, "")
    return [c for c in text.split(",") if c]


def enters_loop(properties: Mapping[str, str], source_cluster: str, target_cluster: str) -> bool:
    """Whether copying this message from source_cluster into target_cluster would bring it
    into a cluster it has already passed through (or back into its source)."""
    return target_cluster == source_cluster or target_cluster in path_of(properties)


def replicated_properties(
    properties: Mapping[str, str], origin: Origin, source_store_ms: int, msg_id: str
) -> dict[str, str]:
    """The properties of the copy: the source's, with this hop's origin in place of any
    earlier hop's, the path extended by the source cluster, and the first born time kept."""
    path = path_of(properties) + [origin.key.cluster]
    if len(path) > PATH_CLUSTERS_MAX:
        raise InvalidArgument(f"a message may pass through at most {PATH_CLUSTERS_MAX} clusters")
    born = properties.get(BORN_MS) or properties.get(RMQ_BORN_MS) or str(source_store_ms)
    copied = {k: v for k, v in properties.items() if not k.startswith(PREFIX)}
    copied.update(
        {
            CLUSTER: origin.key.cluster,
            BROKER: origin.key.broker_name,
            TOPIC: origin.key.topic,
            QUEUE: str(origin.key.queue_id),
            OFFSET: str(origin.offset),
            PREVIOUS: str(origin.previous),
            STORE_MS: str(source_store_ms),
            BORN_MS: born,
            PATH: ",".join(path),
            MSG_ID: msg_id,
        }
    )
    return copied


def user_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties without the origin ones (what must equal the source's)."""
    return {k: v for k, v in properties.items() if not k.startswith(PREFIX)}
