"""The nameserver's RocketMQ remoting listener: GET_ROUTEINFO_BY_TOPIC, the route a
RocketMQ 4.x client asks for before it sends or pulls.

The route is the controller's (the same the gRPC QueryRoute answers), written as
RocketMQ's TopicRouteData: each broker set with a master, under broker id 0 (the master,
which is where every send and pull goes), at the master's remoting address. That address
is asked of the master itself (its HaStatus) and remembered for ADDRESS_TTL_MS; a broker
set whose master serves no remoting listener is left out of the route.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from mqmeta.controller.remoting_proxy import RemotingProxies

from mqmeta import tls
from mqmeta.codec import remoting as codec
from mqmeta.codec.remoting import Command
from mqmeta.errors import InvalidArgument, MqmetaError, NotFound
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.remoting.server import Connection, Refusal, RemotingServer, ext_text, server_ssl_context
from mqmeta.validate import validate_name

log = logging.getLogger(__name__)

ADDRESS_TTL_MS = 10_000
ADDRESS_MISS_TTL_MS = 1_000  # a broker that did not answer is asked again this soon
ADDRESS_TIMEOUT_S = 1.0
ADDRESSES_MAX = 4096
PERMISSIONS = {"R": 4, "W": 2}  # RocketMQ's PermName bits
DEFAULT_REMOTING_LISTEN = "0.0.0.0:9876"  # RocketMQ's nameserver port


class RemotingAddresses:
    """gRPC address of a broker -> its remoting address ('' = none), asked and cached."""

    def __init__(self, ask: Callable[[str], str] | None = None) -> None:
        self._ask = ask or _ask_broker
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, str]] = {}

    def of(self, grpc_address: str) -> str:
        now = time.monotonic()
        with self._lock:
            cached = self._known.get(grpc_address)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            found, ttl_ms = self._ask(grpc_address), ADDRESS_TTL_MS
        except Exception as exc:  # grpc.RpcError and the like: the broker is down or busy
            log.debug("remoting address of %s unknown: %s", grpc_address, exc)
            found, ttl_ms = (cached[1] if cached else ""), ADDRESS_MISS_TTL_MS
        with self._lock:
            if len(self._known) >= ADDRESSES_MAX:
                self._known.clear()
            self._known[grpc_address] = (now + ttl_ms / 1000, found)
        return found


def _ask_broker(grpc_address: str) -> str:
    with tls.channel(grpc_address) as channel:
        status = bpb_grpc.BrokerServiceStub(channel).GetHaStatus(
            bpb.HaStatusRequest(), timeout=ADDRESS_TIMEOUT_S
        )
    return status.remoting_address


def _permission(perm: str) -> int:
    return sum(bit for letter, bit in PERMISSIONS.items() if letter in perm)


def route_body(
    route: cpb.TopicRoute, addresses: RemotingAddresses, proxies: Mapping[str, str] | None = None
) -> bytes:
    """The controller's route as RocketMQ's TopicRouteData (fastjson): a broker set with a
    proxy at the proxy's address (even while it elects a master: the proxy waits for one),
    any other at its master's own remoting address."""
    brokers = []
    served = set()
    for broker in route.brokers:
        remoting = (proxies or {}).get(broker.broker_name, "")
        if not remoting and broker.master_address:
            remoting = addresses.of(broker.master_address)
        if not remoting:
            continue
        served.add(broker.broker_name)
        brokers.append(
            {"cluster": broker.cluster, "brokerName": broker.broker_name, "brokerAddrs": {0: remoting}}
        )
    queues = [
        {
            "brokerName": q.broker_name,
            "readQueueNums": q.read_queue_count,
            "writeQueueNums": q.write_queue_count,
            "perm": _permission(q.perm),
            "topicSysFlag": 0,
        }
        for q in route.queues
        if q.broker_name in served
    ]
    return codec.fastjson_dumps(
        {"orderTopicConf": "", "queueDatas": queues, "brokerDatas": brokers, "filterServerTable": {}}
    )


def namesrv_handlers(
    route_of: Callable[[str], cpb.TopicRoute],
    addresses: RemotingAddresses,
    proxies: Mapping[str, str] | None = None,
):
    def route(command: Command, connection: Connection) -> Command:
        topic = ext_text(command, "topic")
        try:
            validate_name("topic", topic)
            found = route_of(topic)
        except (NotFound, InvalidArgument):
            raise Refusal(
                codec.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic[:128]} "
                "(create it with mqmeta admin)",
            ) from None
        except MqmetaError:
            raise
        return command.answer(body=route_body(found, addresses, proxies))

    return {codec.GET_ROUTEINFO_BY_TOPIC: route}


WARM_INTERVAL_S = 3.0  # below ADDRESS_TTL_MS: every replica's address stays known


class NamesrvRemoting:
    """The nameserver's remoting listener and its broker-set proxies, stopped together; a
    thread keeps every proxied set's replicas' remoting addresses known, so that after a
    failover the proxy finds the new master's without asking it first."""

    def __init__(
        self,
        server: RemotingServer,
        proxies: RemotingProxies | None,
        warm: Callable[[], None] | None = None,
    ) -> None:
        self.server = server
        self.proxies = proxies
        self._stop = threading.Event()
        self._warmer = threading.Thread(
            target=self._warm_loop, args=(warm,), name="remoting-warm", daemon=True
        )
        if warm is not None:
            self._warmer.start()

    def _warm_loop(self, warm: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                warm()
            except Exception as exc:  # the controller or a broker is unreachable: next round
                log.debug("remoting addresses not refreshed: %s", exc)
            self._stop.wait(WARM_INTERVAL_S)

    def stop(self) -> None:
        self._stop.set()
        if self.proxies is not None:
            self.proxies.stop()
        self.server.stop()
        if self._warmer.is_alive():
            self._warmer.join(timeout=ADDRESS_TIMEOUT_S * 2)


def start_namesrv_remoting(
    address: str,
    route_of: Callable[[str], cpb.TopicRoute],
    proxies: Mapping[str, str] | None = None,
    master_of: Callable[[str], tuple[str, tuple[str, ...]]] | None = None,
) -> NamesrvRemoting:
    """The listener on `address`; with `proxies` (broker set -> HOST:PORT) and `master_of`
    (broker set -> its master's gRPC address, '' for none, and every replica's) a proxy per
    broker set, named in the routes instead of the masters' own addresses."""
    addresses = RemotingAddresses()
    running: RemotingProxies | None = None
    warming: Callable[[], None] | None = None
    if proxies and master_of is not None:
        ask = master_of

        def remoting_master(broker_name: str) -> str:
            master, _ = ask(broker_name)
            return addresses.of(master) if master else ""

        def warm() -> None:
            for broker_name in proxies:
                for replica in ask(broker_name)[1]:
                    addresses.of(replica)

        warming = warm
        running = RemotingProxies(proxies, remoting_master).start()
    server = RemotingServer(
        address,
        namesrv_handlers(route_of, addresses, proxies if running else None),
        name="namesrv-remoting",
        read_codes=frozenset({codec.GET_ROUTEINFO_BY_TOPIC}),
        ssl_context=server_ssl_context(),
    )
    try:
        server.start()
    except BaseException:
        if running is not None:
            running.stop()
        raise
    log.info("remoting listener on %s (proxies: %s)", address, proxies or "none")
    return NamesrvRemoting(server, running, warming)
