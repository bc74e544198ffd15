"""Runs a controller node and/or a nameserver as gRPC servers in this process."""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from controller.core import ControllerCore
from controller.namesrv import NameServerServicer, add_messaging_service
from controller.raft_node import Peer, RaftSettings
from controller.service import ControllerServicer
from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument
from mqmeta.pb import controller_pb2, controller_pb2_grpc, namesrv_pb2, namesrv_pb2_grpc
from mqmeta.rpc import add_health_and_reflection, build_server
from mqmeta.validate import parse_addresses

log = logging.getLogger(__name__)

GRPC_WORKERS_MAX = 64  # module-level so that bench/controller_bench.py can change it
CONTROLLER_SERVICE = controller_pb2.DESCRIPTOR.services_by_name["ControllerService"].full_name
NAMESRV_SERVICE = namesrv_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name


@dataclass
class ControllerConfig:
    node_id: str
    grpc: str
    raft: str
    data_dir: Path
    peers: list[Peer] = field(default_factory=list)
    raft_settings: RaftSettings = field(default_factory=RaftSettings)

    def validate(self) -> None:
        parse_addresses(self.grpc, "--grpc address")
        parse_addresses(self.raft, "--raft address")
        ids = [p.id for p in self.peers]
        if len(ids) != len(set(ids)):
            raise InvalidArgument(f"peer ids must be unique, got {ids}")
        mine = [p for p in self.peers if p.id == self.node_id]
        if not mine:
            self.peers = [Peer(self.node_id, self.raft, self.grpc), *self.peers]
        elif mine[0].raft != self.raft or mine[0].grpc != self.grpc:
            raise InvalidArgument(f"peer {self.node_id} in --peer disagrees with --raft/--grpc")
        self.raft_settings.validate()
        if not self.raft_settings.secret:
            log.warning(
                "no Raft secret configured: the Raft port %s accepts unauthenticated "
                "pickled messages; never expose it to untrusted hosts",
                self.raft,
            )


def parse_peer(text: str) -> Peer:
    """ID=RAFT_HOST:PORT/GRPC_HOST:PORT"""
    node_id, sep, rest = text.partition("=")
    raft, slash, grpc_address = rest.partition("/")
    if not sep or not slash or not node_id:
        raise InvalidArgument(f"peer {text!r} is malformed: use ID=RAFT_HOST:PORT/GRPC_HOST:PORT")
    parse_addresses(raft, "peer Raft address")
    parse_addresses(grpc_address, "peer gRPC address")
    return Peer(node_id, raft, grpc_address)


def load_config_file(path: Path) -> dict[str, Any]:
    """A TOML file with the same keys as the command-line flags (peers as a list)."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None


def raft_settings_from(values: dict[str, Any], secret: str | None) -> RaftSettings:
    known = RaftSettings.__dataclass_fields__
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise InvalidArgument(f"unknown raft settings {unknown}; known: {sorted(known)}")
    return replace(RaftSettings(), secret=secret, **values)


class RunningNode:
    """What one process serves: a controller core, a nameserver, or both."""

    def __init__(
        self, server: grpc.Server, core: ControllerCore | None, client: ControllerClient | None
    ) -> None:
        self.server = server
        self.core = core
        self.client = client

    def stop(self) -> None:
        self.server.stop(grace=1).wait()
        if self.core is not None:
            self.core.close()
        if self.client is not None:
            self.client.close()


def start_controller(config: ControllerConfig, namesrv_address: str = "") -> RunningNode:
    config.validate()
    core = ControllerCore(config.node_id, config.peers, config.data_dir, config.raft_settings)
    server = build_server(config.grpc, GRPC_WORKERS_MAX)
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(ControllerServicer(core), server)
    services = [CONTROLLER_SERVICE]
    if namesrv_address == config.grpc:
        namesrv_pb2_grpc.add_NameServerServicer_to_server(NameServerServicer(core=core), server)
        services.append(NAMESRV_SERVICE)
        services.append(add_messaging_service(server, _embedded_route(core)))
    add_health_and_reflection(server, services)
    server.start()
    if namesrv_address and namesrv_address != config.grpc:
        return _with_separate_namesrv(server, core, namesrv_address)
    return RunningNode(server, core, None)


def _with_separate_namesrv(controller_server: grpc.Server, core: ControllerCore, address: str) -> RunningNode:
    namesrv_server = build_server(address, GRPC_WORKERS_MAX)
    namesrv_pb2_grpc.add_NameServerServicer_to_server(NameServerServicer(core=core), namesrv_server)
    messaging = add_messaging_service(namesrv_server, _embedded_route(core))
    add_health_and_reflection(namesrv_server, [NAMESRV_SERVICE, messaging])
    namesrv_server.start()

    class _Both(RunningNode):
        def stop(self) -> None:
            namesrv_server.stop(grace=1).wait()
            super().stop()

    return _Both(controller_server, core, None)


def _embedded_route(core: ControllerCore):
    from controller.service import route_pb

    return lambda topic: route_pb(core.topic_route(topic))


def start_namesrv(address: str, controllers: list[str]) -> RunningNode:
    client = ControllerClient(controllers)
    server = build_server(address, GRPC_WORKERS_MAX)
    namesrv_pb2_grpc.add_NameServerServicer_to_server(NameServerServicer(client=client), server)
    messaging = add_messaging_service(
        server, lambda topic: client.call("GetTopicRoute", controller_pb2.NameRequest(name=topic))
    )
    add_health_and_reflection(server, [NAMESRV_SERVICE, messaging])
    server.start()
    return RunningNode(server, None, client)
