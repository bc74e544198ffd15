"""High availability's copying, master -> slave, over HaFetch (a Kafka-style long-poll fetch).

(In this project "replication" names the cross-cluster replicator; within a broker set
the slaves' copies are HA.)

Slave: the first fetch of a session sends its epoch lineage; the master answers the
consistent point (the slave's log is identical to the master's below it) and the
slave truncates there, crash-safely, before fetching more. Each later fetch asks from
the slave's durable end offset, which acknowledges everything before it.

Master: records each fetch offset as that slave's ack (advancing the confirm offset),
then returns whole records from the fetch offset up to its log end, synced or not (the
slaves' write and fsync overlap the master's own; an ack still needs the master's fsync
too), waiting up to wait_ms when there is nothing new; an append wakes it at once (over
the HA stream such a fetch is parked instead, and the appending thread sends its answer
itself: ParkedFetch). It
does not check their CRCs: the slave checks every record (CRC-32, framing, layout)
before it writes any, which also catches bytes corrupted on the
master's disk (the fetch fails there, as it did here before, and nothing is written).

What to do is the core's (core.py: SlaveFetch, MasterAnswered, Replicated); this
module does the I/O around it and sees the broker only as a seams.BrokerHost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from mqmeta.broker_agent import ha_stream
from mqmeta.broker_agent.core import (
    AnswerFetch,
    AppendReplicated,
    Departure,
    Effect,
    FetchAnswered,
    FetchStillWaiting,
    MasterAnswered,
    MasterUnreachable,
    Replicated,
    RoleView,
    SlaveFetch,
    Truncate,
)
from mqmeta.broker_agent.ha import Role
from mqmeta.broker_agent.ha_stream import Link, StreamBroken, StreamClient
from mqmeta.broker_agent.seams import BrokerHost, log_view
from mqmeta.broker_agent.tiered import bootstrap_from_tiered

from mqmeta import backoff, tls
from mqmeta.clock import now_ms
from mqmeta.dialmap import dial
from mqmeta.errors import FailedPrecondition, FencedEpoch, MqmetaError, NotMaster, Unavailable
from mqmeta.formats.epochs import EpochEntry
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.rpc import from_rpc_error

log = logging.getLogger(__name__)

ERROR_PAUSE_S = 1.0  # at least, after an error of our own (e.g. OSError from the store)
FETCH_MAX_BYTES_LIMIT = 16 << 20
FETCH_WAIT_MS_MAX = 1000
FETCH_DEADLINE_SLACK_S = 2.0  # beyond the long-poll wait, for the answer to arrive


@dataclass(frozen=True)
class FetchSettings:
    max_bytes: int
    wait_ms: int
    tiered_url: str = ""  # where to bootstrap from when the master no longer holds our offset
    stream: bool = True  # fetch over the master's HA stream when it offers one (ha_stream.py)


Fetch = Callable[[bpb.HaFetchRequest, float], bpb.HaFetchResponse]  # (request, timeout in s)


def _entries(pairs: Sequence[EpochEntry]) -> list[bpb.EpochEntry]:
    return [bpb.EpochEntry(epoch=e, start_offset=s) for e, s in pairs]


def follow(host: BrokerHost, session: int, settings: FetchSettings) -> None:
    """The slave's fetch loop; ends when the host starts another session. A handshake goes
    over gRPC; when its answer offers the master's HA stream (ha_stream.py) and this slave
    may use it, the later fetches go there until anything fails."""
    address = host.view().master_address
    channel = tls.channel(dial(address))
    stub = bpb_grpc.BrokerServiceStub(channel)
    handshake = True
    stream: StreamClient | None = None
    attempts = backoff.Attempts(backoff.REPLICA_FETCH)
    try:
        while _current(host, session):
            pause_s = 0.0
            try:
                if handshake or stream is None:
                    handshake, offer = _fetch_once(host, session, settings, stub.HaFetch, handshake)
                    if offer and stream is None and settings.stream and ha_stream.usable(address, offer):
                        stream = _connect(address, offer)
                else:
                    handshake = _stream_fetch(host, session, settings, stream)
                attempts.succeeded()
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                log.debug("fetch from %s failed: %s", address, error)
                if isinstance(error, NotMaster | FencedEpoch):
                    host.request_refresh()
                elif rpc_error.code() == grpc.StatusCode.UNAVAILABLE:
                    # Refused or reset: the master's process may be gone (the controller checks).
                    host.feed(MasterUnreachable(now_ms(), session))
                handshake, pause_s = True, attempts.failed()
            except StreamBroken as error:
                log.debug("the HA stream from %s failed: %s", address, error)
                stream = None  # closed: the next handshake (over gRPC) offers it again
                if error.unreachable:
                    host.feed(MasterUnreachable(now_ms(), session))
                handshake, pause_s = True, attempts.failed()
            except MqmetaError as error:
                log.warning("replication from %s: %s", address, error)
                if isinstance(error, NotMaster | FencedEpoch):  # refused on the stream
                    host.request_refresh()
                handshake, pause_s = True, attempts.failed()
            except Exception:  # e.g. OSError from the store: report, pause, go on
                log.exception("replication from %s failed", address)
                handshake, pause_s = True, max(ERROR_PAUSE_S, attempts.failed())
            if stream is not None and stream.in_flight and handshake:
                stream.close()  # a fetch sent ahead, its answer never to be read: it connects again
                stream = None
            if pause_s:
                host.stopping.wait(pause_s)
    finally:
        if stream is not None:
            stream.close()
        channel.close()


def _connect(address: str, port: int) -> StreamClient | None:
    """The master's HA stream, dialled through the dial map (its fault proxy in the chaos
    suite), or None (the fetches stay on gRPC until the next handshake)."""
    try:
        return StreamClient(dial(ha_stream.stream_address(address, port)))
    except StreamBroken as error:
        log.info("fetching from %s over gRPC: %s", address, error)
        return None


def _current(host: BrokerHost, session: int, view: RoleView | None = None) -> bool:
    view = host.view() if view is None else view
    return not host.stopping.is_set() and view.fetch_session == session and view.role is Role.SLAVE


def _request(
    host: BrokerHost,
    settings: FetchSettings,
    handshake: bool,
    view: RoleView | None = None,
    syncing: bool = False,
) -> bpb.HaFetchRequest:
    """The next fetch: from this slave's log end, which acknowledges everything before it,
    so never while that end is not durable. `view`: the host's, when the caller holds its
    lock and has just read it. `syncing`: the caller holds the lock and makes the log
    durable before it sends this fetch (_apply), so its end need not be durable yet."""
    store, view = host.store, host.view() if view is None else view
    if not syncing and store.durable_offset < store.max_offset:
        raise _not_durable(store.durable_offset, store.max_offset)
    return bpb.HaFetchRequest(
        cluster=host.cluster,
        broker_name=host.broker_name,
        broker_id=view.broker_id,
        master_epoch=view.master_epoch,
        fetch_offset=store.max_offset,
        handshake=handshake,
        epoch_entries=_entries(store.epochs.entries) if handshake else [],
        max_bytes=settings.max_bytes,
        wait_ms=settings.wait_ms,
        leaving=view.departure is Departure.LEAVING,
    )


def _not_durable(durable: int, end: int) -> FailedPrecondition:
    """The refusal to send a fetch from `end`, which would acknowledge bytes not yet durable."""
    return FailedPrecondition(
        f"this slave's log is durable to {durable}, not to its end {end}: it acknowledges nothing until it is"
    )


def _timeout_s(settings: FetchSettings) -> float:
    return settings.wait_ms / 1000 + FETCH_DEADLINE_SLACK_S


def _fetch_once(
    host: BrokerHost, session: int, settings: FetchSettings, call: Fetch, handshake: bool
) -> tuple[bool, int]:
    """One fetch over gRPC's `call`; returns whether the next one must handshake again,
    and the stream port the answer offers (0: none)."""
    reply = call(_request(host, settings, handshake), _timeout_s(settings))
    return _apply(host, session, settings, reply, None), reply.stream_port


def _stream_fetch(host: BrokerHost, session: int, settings: FetchSettings, stream: StreamClient) -> bool:
    """One fetch over the HA stream (sent now, or already by the last one); returns
    whether the next one must handshake again (over gRPC)."""
    if not stream.in_flight:
        stream.send(_request(host, settings, False), _timeout_s(settings))
    return _apply(host, session, settings, stream.receive(), stream)


def _apply(
    host: BrokerHost,
    session: int,
    settings: FetchSettings,
    reply: bpb.HaFetchResponse,
    ahead: StreamClient | None,
) -> bool:
    """Applies a fetch's answer; returns whether the next fetch must handshake again. The
    answer's bytes are appended, then made durable (sync_replicated) once all else the
    next fetch needs is done, under the host's lock. With `ahead` (the HA stream), that
    fetch is sent as soon as the fdatasync returns: it acknowledges them while this slave
    finishes with the answer (the master's confirm offset, Replicated), so the master's
    wait for it is not that much longer."""
    if reply.offset_moved_to_tiered:
        # Not under the host's lock: it downloads; it re-checks the session per append.
        bootstrap_from_tiered(host, settings.tiered_url, reply.min_offset, lambda: _current(host, session))
        return True  # handshake again from the new end
    store = host.store
    with host.lock:
        answer = MasterAnswered(
            session, reply.master_epoch, reply.truncate_to, reply.data_offset, reply.data, log_view(store)
        )
        effects = host.feed(answer)
        if any(isinstance(effect, Truncate) for effect in effects):
            return False
        view = host.view()
        current = ahead is not None and _current(host, session, view)
        request = _request(host, settings, False, view, syncing=True) if current else None
        frame = b"" if request is None else ha_stream.request_frame(request)
        appended = any(isinstance(effect, AppendReplicated) for effect in effects)
        durable = host.sync_replicated() if appended else store.durable_offset
        if request is None or ahead is None:  # (ahead is None: then so is request)
            host.feed(Replicated(session, reply.confirm_offset, log_view(store)))
            return False
        if durable < request.fetch_offset:  # nothing else writes a slave's log: never seen
            raise _not_durable(durable, request.fetch_offset)
    try:
        # The lock let go (a slow socket never holds it); the fetch was framed before the sync.
        ahead.send(request, _timeout_s(settings), frame)
    finally:
        with host.lock:
            host.feed(Replicated(session, reply.confirm_offset, log_view(store)))
    return False


def serve_fetch(
    host: BrokerHost, request: bpb.HaFetchRequest, link: Link | None = None
) -> bpb.HaFetchResponse | ParkedFetch:
    """The master's side of one fetch. Over gRPC (no `link`) a fetch with nothing to send
    waits here for the append; over the HA stream it is parked instead (returned): the
    appending thread answers it through `link` (answer_parked), or the connection's
    thread when its wait ends (ParkedFetch.settle)."""
    max_bytes = max(1, min(request.max_bytes or (1 << 20), FETCH_MAX_BYTES_LIMIT))
    wait_s = max(0, min(request.wait_ms, FETCH_WAIT_MS_MAX)) / 1000
    store = host.store
    with host.lock:
        fetch = SlaveFetch(
            now_ms(),
            request.broker_id,
            request.master_epoch,
            request.fetch_offset,
            request.handshake,
            tuple((e.epoch, e.start_offset) for e in request.epoch_entries) if request.epoch_entries else (),
            log_view(store),
            request.leaving,
        )
        answer = _answer(host.feed(fetch))  # a refusal is raised here
        if answer.truncate_to >= 0:
            return _reply(host, request, truncate_to=answer.truncate_to)
        if answer.moved_to_tiered:
            return _reply(host, request, moved=True)
        if link is not None and wait_s > 0 and store.max_offset <= request.fetch_offset:
            parked = ParkedFetch(host, request, max_bytes, time.monotonic() + wait_s, link)
            host.park(parked)
            return parked
        deadline = time.monotonic() + wait_s
        # Up to the log end, synced or not (AnswerFetch): woken by the append (Appended),
        # so the slaves write and fsync while this master's group commit runs.
        while store.max_offset <= request.fetch_offset and time.monotonic() < deadline:
            host.wait_for_append(deadline - time.monotonic())
            host.feed(FetchStillWaiting(request.master_epoch))
        return data_reply(host, request, max_bytes)


def data_reply(
    host: BrokerHost,
    request: bpb.HaFetchRequest,
    max_bytes: int,
    feed_answered: bool = True,
) -> bpb.HaFetchResponse:
    """With the host's lock held: the answer to a fetch the core accepted, from its offset
    up to the log end (nothing when the log has not grown past it). `feed_answered`: the
    core hears of the answer (FetchAnswered) now; False: the caller feeds it (agent.append)."""
    store = host.store
    end = store.max_offset
    size = min(max_bytes, end - request.fetch_offset)
    if size <= 0:
        data = b""
    else:
        # Unchecked here: the slave checks every record's CRC and layout (scan_records)
        # before it writes any, so a record corrupted on this disk is refused there.
        data = store.read_bytes(request.fetch_offset, size, check=False)
    if feed_answered:
        host.feed(FetchAnswered(now_ms(), request.broker_id, log_view(store)))  # the host's clock
    return _reply(host, request, data_offset=request.fetch_offset, data=data)


@dataclass(eq=False)
class ParkedFetch:
    """A fetch over the HA stream with nothing to send yet: the host holds it (park) until
    an append answers it (answer_parked, from the appending thread: no other thread is
    woken on a send's path), or the connection's thread settles it (its wait ended, or the
    host woke it: a new role or epoch). Whoever unparks it under the host's lock answers it."""

    host: BrokerHost
    request: bpb.HaFetchRequest
    max_bytes: int
    deadline: float  # time.monotonic() by which it is answered, with data or without
    link: Link
    started: float = field(default_factory=time.perf_counter)
    woken: bool = False  # its connection's thread was woken to answer it (agent._answer_parked)

    def settle(self) -> bpb.HaFetchResponse | None:
        """The connection thread's answer: None when another thread answered it; raises
        the refusal when the host no longer serves this fetch (a new role or epoch)."""
        with self.host.lock:
            if not self.host.unpark(self):
                return None
            self.host.feed(FetchStillWaiting(self.request.master_epoch))  # a refusal is raised here
            return data_reply(self.host, self.request, self.max_bytes)

    def abandon(self) -> bool:
        """The connection ended (or broke the protocol): whether it was still parked."""
        with self.host.lock:
            return self.host.unpark(self)


def answer_parked(host: BrokerHost, parked: ParkedFetch) -> bpb.HaFetchResponse | None:
    """With the host's lock held, after an append: the answer to `parked` (unparked), or
    None when the log has not grown past its offset or the core would refuse it now (its
    connection's thread, woken by the new role or epoch, answers it). The caller sends it
    and feeds FetchAnswered (agent.append, which pushes small answers first)."""
    if host.store.max_offset <= parked.request.fetch_offset or not host.serves(parked.request.master_epoch):
        return None
    host.unpark(parked)
    return data_reply(host, parked.request, parked.max_bytes, feed_answered=False)


def _answer(effects: list[Effect]) -> AnswerFetch:
    """The core's answer; it answers every fetch it does not refuse, unless it has stopped
    (a fetch served while the broker stops: UNAVAILABLE, the slave fetches elsewhere)."""
    answers = [effect for effect in effects if isinstance(effect, AnswerFetch)]
    if not answers:
        raise Unavailable("this broker is stopping")
    return answers[0]


def _reply(
    host: BrokerHost,
    request: bpb.HaFetchRequest,
    truncate_to: int = -1,
    data_offset: int = 0,
    data: bytes = b"",
    moved: bool = False,
) -> bpb.HaFetchResponse:
    view, store = host.view(), host.store
    # The master's epochs, for a handshake or a cut: a slave in sync does not read them
    entries = _entries(store.epochs.entries) if request.handshake or truncate_to >= 0 or moved else ()
    return bpb.HaFetchResponse(
        master_epoch=view.master_epoch,
        master_max_offset=store.max_offset,
        confirm_offset=view.confirm_offset,
        truncate_to=truncate_to,
        data_offset=data_offset,
        data=data,
        epoch_entries=entries,
        min_offset=store.min_offset,
        offset_moved_to_tiered=moved,
    )
