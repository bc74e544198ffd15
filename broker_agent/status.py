"""What a broker reports about itself: its HA status (role, offsets, slaves) and a consumer
group's lag per queue. Read by the broker service, the admin calls and the metrics alike."""

from __future__ import annotations

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.store import MessageStore

from mqmeta.clock import now_ms
from mqmeta.pb import broker_pb2 as bpb


def ha_status(agent: BrokerAgent) -> bpb.HaStatus:
    with agent.lock:
        now = now_ms()
        core = agent.core
        view = core.view()
        max_offset = agent.store.max_offset
        slaves = [
            bpb.SlaveStatus(
                broker_id=i,
                acked_offset=p.acked_offset,
                in_sync=i in view.sync_state_set,
                lag_bytes=max(0, max_offset - p.acked_offset),
                last_fetch_ms_ago=now - p.last_fetch_ms,
                streamed=agent.fetch_transports.get(i, False),
            )
            for i, p in sorted(core.slaves().items())  # empty unless master
        ]
        return bpb.HaStatus(
            cluster=agent.config.cluster,
            broker_name=agent.config.broker_name,
            broker_id=view.broker_id,
            role=view.role.value,
            master_epoch=view.master_epoch,
            master_broker_id=view.master_broker_id,
            master_address=view.master_address,
            max_offset=max_offset,
            confirm_offset=view.confirm_offset,
            sync_state_set=list(view.sync_state_set),
            sync_state_set_epoch=view.sync_state_set_epoch,
            slaves=slaves,
            lease_valid=core.lease_valid(now),
            writable=core.writable(now),
            remoting_address=agent.config.extra.get("remoting", ""),
        )


def queue_lag(
    store: MessageStore, group: str, topic: str, queue_id: int, confirm: int, now_ms: int
) -> bpb.QueueLag:
    """One queue's lag for `group`: the oldest unconsumed offset is the consumed offset
    (pop: the offsets acknowledged above it are not backlog)."""
    progress = store.consumer_progress(group, topic, queue_id)
    readable = store.readable_queue_max_offset(topic, queue_id, confirm)
    minimum = store.queue_min_offset(topic, queue_id)
    consumed = -1 if progress is None else progress[0]
    ranges = () if progress is None else progress[1]
    start = max(consumed, minimum)
    backlog = max(0, readable - start) - sum(
        max(0, min(high, readable) - max(low, start)) for low, high in ranges
    )
    backlog_ms = 0
    if backlog > 0:
        oldest = store.record_at(topic, queue_id, start)
        if oldest is not None:
            backlog_ms = max(0, now_ms - oldest.store_timestamp_ms)
    return bpb.QueueLag(
        topic=topic,
        queue_id=queue_id,
        consumed_offset=consumed,
        max_offset=readable,
        backlog=backlog,
        backlog_ms=backlog_ms,
        acknowledged_above=sum(high - low for low, high in ranges),
    )
