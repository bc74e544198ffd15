"""Waiting on a broker set of a real cluster (cluster.harness.Cluster) and reading it back."""

from __future__ import annotations

from collections.abc import Collection

import grpc
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.wait import wait_for

from mqmeta.broker_client import Consumer
from mqmeta.errors import MqmetaError
from mqmeta.pb import broker_pb2

IN_SYNC_TIMEOUT_S = 20.0
CONSUME_TIMEOUT_S = 30.0


def wait_in_sync(
    cluster: Cluster, members: int, timeout_s: float = IN_SYNC_TIMEOUT_S, broker_name: str = "broker-a"
) -> str:
    """Waits until a writable master's SyncStateSet has `members` brokers; returns the master."""

    def master_and_set() -> tuple[str, list[int]]:
        master = cluster.writable_master(broker_name)
        return master, list(cluster.broker_status(master).sync_state_set) if master else []

    master, _ = wait_for(
        master_and_set,
        timeout_s,
        f"a master of {broker_name} with {members} members in its SyncStateSet",
        until=lambda found: bool(found[0]) and len(found[1]) == members,
        retry_on=(grpc.RpcError,),
    )
    return master


def consume_all(
    cluster: Cluster,
    group: str,
    expected: Collection[bytes],
    timeout_s: float = CONSUME_TIMEOUT_S,
    topic: str = "Orders",
) -> list[broker_pb2.StoredMessage]:
    """Everything a new consumer group reads of `topic`: it pulls until it has seen every
    body in `expected` and then a pull of every queue returned nothing (so every queue was
    read to its readable end, and what is missing past `expected` was never readable)."""
    consumer = Consumer(cluster.namesrv, topic, group)
    seen: list[broker_pb2.StoredMessage] = []
    missing = set(expected)

    def drained() -> tuple[int, int, bool]:
        try:
            batch = consumer.poll()
        except MqmetaError:
            consumer.refresh()  # a failover moved a queue: ask the nameserver again
            raise
        seen.extend(batch)
        missing.difference_update(m.body for m in batch)
        return len(seen), len(missing), not batch

    try:
        wait_for(
            drained,
            timeout_s,
            f"group {group} to read {len(missing)} expected messages and every queue to its end "
            "(last value: messages read, expected ones still missing, whether the last pull was empty)",
            until=lambda state: state[1] == 0 and state[2],
            retry_on=(MqmetaError,),
        )
    finally:
        consumer.close()
    return seen


def broker_ends(cluster: Cluster, names: list[str]) -> dict[str, int]:
    """Each named broker's log end (max offset), by process name."""
    return {name: cluster.broker_status(name).max_offset for name in names}


def wait_same_end(cluster: Cluster, names: list[str], timeout_s: float) -> int:
    """Waits until the named brokers' logs end at the same offset; returns it."""
    ends = wait_for(
        lambda: broker_ends(cluster, names),
        timeout_s,
        f"{', '.join(names)} to reach the same log end",
        until=lambda found: len(set(found.values())) == 1,
        retry_on=(grpc.RpcError,),  # a broker still starting
    )
    return next(iter(ends.values()))
