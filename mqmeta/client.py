"""Client library for the controller: finds the leader and retries there transparently.

Every call has a deadline (default 5 s overall, 2 s per attempt). A NOT_LEADER answer
names the leader, and the next attempt goes there when that address is one of the
configured ones (otherwise the next configured address: they may be proxies or NAT
addresses that differ from what the controllers advertise); an unreachable node is
skipped.
Heartbeats go on one long-lived HeartbeatStream to the leader (about half the leader's CPU
of a unary call); when it breaks, that heartbeat goes as a unary call (which finds the
leader) and the next one opens a stream there. A controller without the stream
(UNIMPLEMENTED: an older version during a rolling upgrade) is sent unary calls, and the
stream is tried again STREAM_RETRY_S later (the upgrade may have reached it by then).
Retries make writes at-least-once: creates answer ALREADY_EXISTS when retried after
an outcome the client could not see, and the other writes are idempotent or fenced.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Any

import grpc

from mqmeta import backoff, tls
from mqmeta.call_stream import CallStreamClient, grpc_timeout_s
from mqmeta.dialmap import dial
from mqmeta.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MqmetaError,
    NotLeader,
    Unavailable,
)
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import controller_pb2_grpc as pb_grpc
from mqmeta.rpc import REQUEST_ID_HEADER, from_rpc_error
from mqmeta.validate import parse_addresses

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
# gRPC's default reply limit is 4 MB: ListTopics of 100,000 topics (6.8 MB) failed with it.
REPLY_BYTES_MAX = 256 << 20
ATTEMPT_TIMEOUT_S = 2.0
# A connection to a controller that was lost is dialed again within half a second. gRPC's
# default waits 1 s, then 1.6 times longer at each failure (up to 120 s): a broker whose link
# to the leader dropped twice could not reach it within broker_dead_after_ms (2 s by
# default) though the link was back, and was replaced (a false failover under lossy links).
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", REPLY_BYTES_MAX),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
]
SERVICE = pb.DESCRIPTOR.services_by_name["ControllerService"]
STREAM_RETRY_S = 60.0  # after UNIMPLEMENTED, heartbeats go unary this long before the stream is tried again


def new_request_id() -> str:
    """A fresh id for one logical admin write (sent with each of its attempts)."""
    return uuid.uuid4().hex


class _StreamEnded(Exception):
    """The stream's own end, not a refusal of the heartbeat: the caller goes unary."""

    def __init__(self, error: MqmetaError, unimplemented: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.unimplemented = unimplemented


_END = object()  # ends the request iterator that feeds a HeartbeatStream


class HeartbeatCall:
    """One HeartbeatStream to `target`: `exchange` sends a request and waits for its
    answer (the stream answers in order, one each). A reader thread moves the answers into
    a queue, so a wait is bounded even when the node stops answering. Any failure closes
    the stream for good; a stale answer can never be read as a later request's."""

    def __init__(self, stub: pb_grpc.ControllerServiceStub, target: str) -> None:
        self.target = target
        self.closed = False
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._call = stub.HeartbeatStream(iter(self._requests.get, _END))
        self._reader = threading.Thread(target=self._read, name="heartbeat-stream", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._replies.put(reply)
            self._replies.put(_StreamEnded(Unavailable(f"{self.target} ended the heartbeat stream")))
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
            if rpc_error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._replies.put(_StreamEnded(error, unimplemented=True))
            elif isinstance(error, Unavailable | NotLeader) or rpc_error.code() == grpc.StatusCode.CANCELLED:
                self._replies.put(_StreamEnded(error))
            else:
                self._replies.put(error)  # refused as the unary call would be: NOT_FOUND, ...

    def exchange(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        """The answer; MqmetaError when the controller refused it; _StreamEnded when the
        stream broke or gave no answer within `timeout_s` (the stream is then closed)."""
        self._requests.put(request)
        try:
            item = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise _StreamEnded(
                DeadlineExceeded(f"{self.target} did not answer a heartbeat in {timeout_s:.1f} s")
            ) from None
        if isinstance(item, _StreamEnded | MqmetaError):
            self.close()
            raise item
        return item

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._requests.put(_END)
            self._call.cancel()


class ControllerClient:
    """`call_stream`: send unary calls over a controller's call stream when it offers one
    (mqmeta/call_stream.py); False: gRPC calls only."""

    def __init__(
        self, addresses: list[str] | str, timeout_s: float = CALL_TIMEOUT_S, call_stream: bool = True
    ) -> None:
        self.addresses = parse_addresses(addresses) if isinstance(addresses, str) else addresses
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self.streams = CallStreamClient(self._channel, enabled=call_stream)
        self._closed = False  # close() ends calls in flight and refuses new ones
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, pb_grpc.ControllerServiceStub] = {}
        self._watch_channels: dict[str, grpc.Channel] = {}  # keepalive watch streams, per node
        self._target = self.addresses[0]
        self._leader_known = False
        self._heartbeat_lock = threading.Lock()
        self._heartbeat_call: HeartbeatCall | None = None
        # monotonic time from which heartbeats try the stream; set ahead on UNIMPLEMENTED
        self._heartbeat_stream_after = 0.0

    def _stub(self, address: str) -> pb_grpc.ControllerServiceStub:
        with self._lock:
            self._refuse_if_closed()
            stub = self._stubs.get(address)
            if stub is None:
                channel = tls.channel(dial(address), options=CHANNEL_OPTIONS)
                self._channels[address] = channel
                stub = self._stubs[address] = pb_grpc.ControllerServiceStub(channel)
            return stub

    def _channel(self, address: str) -> grpc.Channel:
        self._stub(address)
        return self._channels[address]

    def _attempt(
        self, target: str, method: str, request: Any, timeout_s: float, request_id: str | None
    ) -> Any:
        """One attempt at `target`: over its call stream when it offers one, else a gRPC
        call; a failure is the typed error either way."""
        deadline = time.monotonic() + timeout_s
        reply = self.streams.call(target, SERVICE, method, request, timeout_s, request_id or "", deadline)
        if reply is not None:
            return reply
        metadata = ((REQUEST_ID_HEADER, request_id),) if request_id else None
        timeout_s = grpc_timeout_s(deadline)  # what the stream's attempt left
        try:
            return getattr(self._stub(target), method)(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None

    def _next_target(self, failed: str) -> str:
        candidates = self.addresses
        index = candidates.index(failed) if failed in candidates else -1
        return candidates[(index + 1) % len(candidates)]

    def _discover_leader(self, deadline: float) -> None:
        """Points the client at the leader once, so writes skip the follower's forwarding."""
        self._leader_known = True
        for address in self.addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                meta = self._stub(address).GetMetadata(
                    pb.GetMetadataRequest(), timeout=min(remaining, ATTEMPT_TIMEOUT_S / 4)
                )
            except grpc.RpcError:
                continue
            if meta.leader_grpc in self.addresses:
                self._target = meta.leader_grpc
                return

    def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """Any unary method by its name: for tests and ad-hoc scripts. Code calls the typed
        methods below, which mypy checks against the service's request and reply types."""
        return self._call(method, request, timeout_s)

    def _call(
        self, method: str, request: Any, timeout_s: float | None = None, request_id: str | None = None
    ) -> Any:
        """One logical call, retried on UNAVAILABLE and NOT_LEADER until its deadline. With
        `request_id` (admin writes) every attempt carries it, so the controller applies the
        write once and answers a retry with the first attempt's answer."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        if not self._leader_known and len(self.addresses) > 1:
            self._discover_leader(deadline)
        target = self._target
        last_error: MqmetaError | None = None
        attempts = backoff.Attempts(backoff.CONTROLLER_CALL, deadline)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded(
                    f"no controller answered {method} in time "
                    f"(tried {', '.join(self.addresses)}): {last_error or 'no answer'}"
                )
            try:
                reply = self._attempt(target, method, request, min(remaining, ATTEMPT_TIMEOUT_S), request_id)
                self._target = target
                return reply
            except MqmetaError as failed:
                error = failed
            if not isinstance(error, Unavailable | NotLeader):
                raise error
            last_error = error
            target = self._retry_target(target, error)
            if target != error.leader:  # no leader to go to: a pause before the next node
                time.sleep(attempts.failed())

    def _retry_target(self, failed: str, error: MqmetaError) -> str:
        """Where the next attempt goes after `error` (UNAVAILABLE or NOT_LEADER) from
        `failed`: the leader it names when that is a configured address (only configured
        endpoints: they may be proxies), otherwise the next configured address. The next
        call looks for the leader again."""
        self._leader_known = False
        if isinstance(error, NotLeader) and error.leader in self.addresses:
            return error.leader
        return self._next_target(failed)

    # One typed method per unary call of the ControllerService ----------------------------
    def register_broker(
        self, request: pb.RegisterBrokerRequest, timeout_s: float | None = None
    ) -> pb.RegisterBrokerResponse:
        return self._call("RegisterBroker", request, timeout_s)

    def get_next_broker_id(
        self, request: pb.BrokerSetRef, timeout_s: float | None = None
    ) -> pb.NextBrokerIdResponse:
        return self._call("GetNextBrokerId", request, timeout_s)

    def get_replica_info(self, request: pb.BrokerSetRef, timeout_s: float | None = None) -> pb.ReplicaInfo:
        return self._call("GetReplicaInfo", request, timeout_s)

    def elect_master(self, request: pb.ElectMasterRequest, timeout_s: float | None = None) -> pb.ReplicaInfo:
        return self._call("ElectMaster", request, timeout_s)

    def alter_sync_state_set(
        self, request: pb.AlterSyncStateSetRequest, timeout_s: float | None = None
    ) -> pb.ReplicaInfo:
        return self._call("AlterSyncStateSet", request, timeout_s)

    def get_sync_state_data(
        self, request: pb.BrokerSetRef, timeout_s: float | None = None
    ) -> pb.SyncStateData:
        return self._call("GetSyncStateData", request, timeout_s)

    def clean_broker_data(
        self, request: pb.CleanBrokerDataRequest, timeout_s: float | None = None
    ) -> pb.CleanBrokerDataResponse:
        return self._call("CleanBrokerData", request, timeout_s)

    def get_metadata(
        self, request: pb.GetMetadataRequest, timeout_s: float | None = None
    ) -> pb.ControllerMetadata:
        return self._call("GetMetadata", request, timeout_s)

    def list_broker_sets(
        self, request: pb.ListBrokerSetsRequest, timeout_s: float | None = None
    ) -> pb.ListBrokerSetsResponse:
        return self._call("ListBrokerSets", request, timeout_s)

    def create_topic(self, request: pb.TopicSpec, timeout_s: float | None = None) -> pb.Topic:
        return self._call("CreateTopic", request, timeout_s, new_request_id())

    def update_topic(self, request: pb.TopicSpec, timeout_s: float | None = None) -> pb.Topic:
        return self._call("UpdateTopic", request, timeout_s, new_request_id())

    def delete_topic(self, request: pb.NameRequest, timeout_s: float | None = None) -> pb.DeleteResponse:
        return self._call("DeleteTopic", request, timeout_s, new_request_id())

    def list_topics(
        self, request: pb.ListTopicsRequest, timeout_s: float | None = None
    ) -> pb.ListTopicsResponse:
        return self._call("ListTopics", request, timeout_s)

    def get_topic_route(self, request: pb.NameRequest, timeout_s: float | None = None) -> pb.TopicRoute:
        return self._call("GetTopicRoute", request, timeout_s)

    def create_group(self, request: pb.GroupSpec, timeout_s: float | None = None) -> pb.Group:
        return self._call("CreateGroup", request, timeout_s, new_request_id())

    def update_group(self, request: pb.GroupSpec, timeout_s: float | None = None) -> pb.Group:
        return self._call("UpdateGroup", request, timeout_s, new_request_id())

    def delete_group(self, request: pb.NameRequest, timeout_s: float | None = None) -> pb.DeleteResponse:
        return self._call("DeleteGroup", request, timeout_s, new_request_id())

    def list_groups(
        self, request: pb.ListGroupsRequest, timeout_s: float | None = None
    ) -> pb.ListGroupsResponse:
        return self._call("ListGroups", request, timeout_s)

    def get_config(self, request: pb.GetConfigRequest, timeout_s: float | None = None) -> pb.ControllerConfig:
        return self._call("GetConfig", request, timeout_s)

    def update_config(
        self, request: pb.UpdateConfigRequest, timeout_s: float | None = None
    ) -> pb.ControllerConfig:
        return self._call("UpdateConfig", request, timeout_s, new_request_id())

    def write(self, request: pb.WriteBatch, timeout_s: float | None = None) -> pb.WriteResults:
        return self._call("Write", request, timeout_s, new_request_id())

    def tiered_upload_start(
        self, request: pb.TieredUploadStartRequest, timeout_s: float | None = None
    ) -> pb.TieredCheckpoint:
        return self._call("TieredUploadStart", request, timeout_s)

    def tiered_commit(
        self, request: pb.TieredCommitRequest, timeout_s: float | None = None
    ) -> pb.TieredCheckpoint:
        return self._call("TieredCommit", request, timeout_s)

    def tiered_forget_abandoned(
        self, request: pb.TieredForgetRequest, timeout_s: float | None = None
    ) -> pb.TieredCheckpoint:
        return self._call("TieredForgetAbandoned", request, timeout_s)

    def get_tiered_checkpoint(
        self, request: pb.BrokerSetRef, timeout_s: float | None = None
    ) -> pb.TieredCheckpoint:
        return self._call("GetTieredCheckpoint", request, timeout_s)

    def replicator_heartbeat(
        self, request: pb.ReplicatorHeartbeatRequest, timeout_s: float | None = None
    ) -> pb.ReplicatorHeartbeatResponse:
        return self._call("ReplicatorHeartbeat", request, timeout_s)

    def commit_replicator_task(
        self, request: pb.CommitReplicatorTaskRequest, timeout_s: float | None = None
    ) -> pb.ReplicatorCheckpoint:
        return self._call("CommitReplicatorTask", request, timeout_s)

    def get_replicator_status(
        self, request: pb.GetReplicatorStatusRequest, timeout_s: float | None = None
    ) -> pb.ReplicatorStatus:
        return self._call("GetReplicatorStatus", request, timeout_s)

    def get_command_history(
        self, request: pb.GetCommandHistoryRequest, timeout_s: float | None = None
    ) -> pb.CommandHistory:
        return self._call("GetCommandHistory", request, timeout_s)

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float | None = None) -> pb.HeartbeatResponse:
        """`request` on the heartbeat stream to the leader, or as a unary call when the
        stream cannot take it (see the module's docstring); the same errors as `call`."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self._heartbeat_lock:
            if time.monotonic() >= self._heartbeat_stream_after:
                try:
                    return self._stream_heartbeat(
                        request, min(ATTEMPT_TIMEOUT_S, deadline - time.monotonic())
                    )
                except _StreamEnded as ended:
                    self._stream_ended(ended)
            return self._call("Heartbeat", request, max(0.001, deadline - time.monotonic()))

    def _stream_heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        if not self._leader_known and len(self.addresses) > 1:
            self._discover_leader(time.monotonic() + timeout_s)
        call = self._heartbeat_call
        if call is None or call.closed or call.target != self._target:
            if call is not None:
                call.close()
            call = self._heartbeat_call = HeartbeatCall(self._stub(self._target), self._target)
        return call.exchange(request, timeout_s)

    def _stream_ended(self, ended: _StreamEnded) -> None:
        """Where the next attempt goes: unary for a while (UNIMPLEMENTED), or as `call` goes."""
        if ended.unimplemented:
            log.info(
                "%s has no HeartbeatStream (%s): heartbeats go as unary calls for %.0f s",
                self._target,
                ended,
                STREAM_RETRY_S,
            )
            self._heartbeat_stream_after = time.monotonic() + STREAM_RETRY_S
            return
        self._target = self._retry_target(self._target, ended.error)

    def watch(
        self,
        cluster: str = "",
        broker_name: str = "",
        timeout_s: float | None = None,
        keepalive_ms: tuple[int, int] | None = None,
        batched: bool = False,
        target: str | None = None,
    ):
        """Server stream of WatchEvents from one node (`target`, one of the configured
        addresses, or else the current target); `batched`:
        of WatchBatch messages (WatchBatched: the events waiting together in one message;
        a controller older than it answers UNIMPLEMENTED). With `keepalive_ms` (interval,
        timeout) the stream runs on a channel of its own that pings the node and fails the
        stream when a ping goes unanswered: a silently cut stream (a stopped node, a
        black-holed link) then ends instead of waiting forever."""
        request = pb.WatchRequest(cluster=cluster, broker_name=broker_name)
        if target is not None and target not in self.addresses:
            raise InvalidArgument(f"{target} is not one of this client's controller addresses")
        node = target or self._target
        if keepalive_ms is None:
            stub = self._stub(node)
            return (stub.WatchBatched if batched else stub.Watch)(request, timeout=timeout_s)
        interval_ms, timeout_ms = keepalive_ms
        channel = tls.channel(
            dial(node),
            options=[
                *CHANNEL_OPTIONS,
                ("grpc.keepalive_time_ms", interval_ms),
                ("grpc.keepalive_timeout_ms", timeout_ms),
                ("grpc.keepalive_permit_without_calls", 1),
                # an idle stream sends no data: without these, gRPC pings it at most
                # twice, then once per 5 minutes, and waits a minute for the answer
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.http2.min_time_between_pings_ms", interval_ms),
                ("grpc.http2.ping_timeout_ms", timeout_ms),
            ],
        )
        with self._lock:
            if self._closed:
                channel.close()
                self._refuse_if_closed()
            old = self._watch_channels.pop(node, None)
            self._watch_channels[node] = channel
        if old is not None:
            old.close()  # the previous keepalive stream to this node, ended or abandoned
        stub = pb_grpc.ControllerServiceStub(channel)
        return (stub.WatchBatched if batched else stub.Watch)(request, timeout=timeout_s)

    def _refuse_if_closed(self) -> None:
        if self._closed:  # a call retried after close() would wait out its whole deadline
            raise FailedPrecondition("this controller client is closed")

    def close(self) -> None:
        """Ends every call in flight (CANCELLED) and refuses new ones."""
        with self._heartbeat_lock:
            if self._heartbeat_call is not None:
                self._heartbeat_call.close()
        self.streams.close()
        with self._lock:
            self._closed = True
            for channel in [*self._channels.values(), *self._watch_channels.values()]:
                channel.close()
            self._channels.clear()
            self._watch_channels.clear()
            self._stubs.clear()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
