"""Master -> slave replication over HaFetch (a Kafka-style long-poll fetch).

Slave: the first fetch of a session sends its epoch lineage; the master answers the
consistent point (the slave's log is identical to the master's below it) and the
slave truncates there, crash-safely, before fetching more. Each later fetch asks from
the slave's durable end offset, which acknowledges everything before it.

Master: records each fetch offset as that slave's ack (advancing the confirm offset),
then returns whole records from the fetch offset, waiting up to wait_ms when there
is nothing new.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import grpc

from broker_agent.ha import Role
from mqmeta.clock import now_ms
from mqmeta.dialmap import dial
from mqmeta.errors import FencedEpoch, MqmetaError, NotMaster
from mqmeta.formats.epochs import consistent_point
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.rpc import from_rpc_error

if TYPE_CHECKING:
    from broker_agent.agent import BrokerAgent

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.1
FETCH_MAX_BYTES_LIMIT = 16 << 20


def _entries(pairs) -> list[bpb.EpochEntry]:
    return [bpb.EpochEntry(epoch=e, start_offset=s) for e, s in pairs]


def follow(agent: BrokerAgent, session: int) -> None:
    """The slave's fetch loop; ends when the agent starts another session."""
    with agent.lock:
        address = agent.master_address
    channel = grpc.insecure_channel(dial(address))
    stub = bpb_grpc.BrokerServiceStub(channel)
    handshake = True
    try:
        while _current(agent, session):
            try:
                handshake = _fetch_once(agent, session, stub, handshake)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                log.debug("fetch from %s failed: %s", address, error)
                if isinstance(error, NotMaster | FencedEpoch):
                    agent.request_refresh()
                handshake = True
                agent.stopping.wait(RETRY_PAUSE_S)
            except MqmetaError as error:
                log.warning("replication from %s: %s", address, error)
                handshake = True
                agent.stopping.wait(RETRY_PAUSE_S)
            except Exception:  # e.g. OSError from the store: report, pause, go on
                log.exception("replication from %s failed", address)
                handshake = True
                agent.stopping.wait(1.0)
    finally:
        channel.close()


def _current(agent: BrokerAgent, session: int) -> bool:
    return not agent.stopping.is_set() and agent.fetch_session == session and agent.role == Role.SLAVE


def _fetch_once(agent: BrokerAgent, session: int, stub, handshake: bool) -> bool:
    store = agent.store
    request = bpb.HaFetchRequest(
        cluster=agent.config.cluster,
        broker_name=agent.config.broker_name,
        broker_id=agent.broker_id,
        master_epoch=agent.master_epoch,
        fetch_offset=store.max_offset,
        handshake=handshake,
        epoch_entries=_entries(store.epochs.entries) if handshake else [],
        max_bytes=agent.config.fetch_max_bytes,
        wait_ms=agent.config.fetch_wait_ms,
    )
    reply = stub.HaFetch(request, timeout=agent.config.fetch_wait_ms / 1000 + 2.0)
    if reply.offset_moved_to_tiered:
        from broker_agent.tiered import bootstrap_from_tiered

        # Not under the agent lock: it downloads; it re-checks the session per append.
        bootstrap_from_tiered(agent, reply.min_offset, lambda: _current(agent, session))
        return True  # handshake again from the new end
    with agent.lock:
        if not _current(agent, session):
            return handshake
        if reply.master_epoch > agent.master_epoch:
            agent.request_refresh()
        if reply.truncate_to >= 0:
            log.warning(
                "truncating from %d to the consistent point %d (master epoch %d)",
                store.max_offset,
                reply.truncate_to,
                reply.master_epoch,
            )
            store.truncate(reply.truncate_to)
            return False
        if reply.data:
            # fsynced (the next fetch acknowledges it); epoch entries follow from the records
            store.append_replicated(reply.data_offset, reply.data)
        agent.confirm = min(reply.confirm_offset, store.max_offset)
        agent.note_confirm()
    return False


def serve_fetch(agent: BrokerAgent, request: bpb.HaFetchRequest) -> bpb.HaFetchResponse:
    """The master's side of one fetch."""
    max_bytes = max(1, min(request.max_bytes or (1 << 20), FETCH_MAX_BYTES_LIMIT))
    wait_s = max(0, min(request.wait_ms, 1000)) / 1000
    store = agent.store
    with agent.lock:
        _check_master(agent, request)
        mine = store.epochs.entries
        if request.handshake or request.fetch_offset > store.max_offset:
            point = consistent_point(
                [(e.epoch, e.start_offset) for e in request.epoch_entries],
                mine,
                store.max_offset,
                request.fetch_offset,
            )
            if point < request.fetch_offset:
                return _reply(agent, truncate_to=point)
        if request.fetch_offset < store.min_offset:
            return _reply(agent, moved=True)  # retention deleted it here: tiered store
        if request.broker_id in agent.registered_ids:
            agent.on_slave_fetch(request.broker_id, request.fetch_offset)
        deadline = time.monotonic() + wait_s
        while store.max_offset <= request.fetch_offset and time.monotonic() < deadline:
            agent.lock.wait(timeout=deadline - time.monotonic())
            _check_master(agent, request)
        data = store.read_bytes(request.fetch_offset, max_bytes)
        if request.broker_id in agent.registered_ids:
            agent.tracker.on_answer(request.broker_id, store.max_offset, now_ms())  # the agent's clock
        return _reply(agent, data_offset=request.fetch_offset, data=data)


def _check_master(agent: BrokerAgent, request: bpb.HaFetchRequest) -> None:
    if agent.role != Role.MASTER:
        raise NotMaster(
            f"broker {agent.broker_id} is {agent.role.value}, not the master", leader=agent.master_address
        )
    if request.master_epoch > agent.master_epoch:
        agent.request_refresh()  # the slave knows a newer epoch: this master is stale
        raise FencedEpoch(
            f"master epoch {agent.master_epoch} is older than the slave's {request.master_epoch}"
        )


def _reply(
    agent: BrokerAgent, truncate_to: int = -1, data_offset: int = 0, data: bytes = b"", moved: bool = False
) -> bpb.HaFetchResponse:
    return bpb.HaFetchResponse(
        master_epoch=agent.master_epoch,
        master_max_offset=agent.store.max_offset,
        confirm_offset=agent.confirm,
        truncate_to=truncate_to,
        data_offset=data_offset,
        data=data,
        epoch_entries=_entries(agent.store.epochs.entries),
        min_offset=agent.store.min_offset,
        offset_moved_to_tiered=moved,
    )
