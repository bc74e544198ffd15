"""`mqmeta controller` and `mqmeta namesrv`: turn flags (merged with a TOML file) into a node."""

from __future__ import annotations

import argparse
from pathlib import Path

from mqmeta.controller.namesrv import RocketMQRoutes
from mqmeta.controller.remoting_proxy import parse_proxies
from mqmeta.controller.server import (
    ControllerConfig,
    RunningNode,
    parse_peer,
    raft_settings_from,
    start_controller,
    start_namesrv,
)

from mqmeta.errors import InvalidArgument
from mqmeta.remoting.server import listen_address
from mqmeta.rpc import check_can_listen, serve_until_signal
from mqmeta.validate import parse_addresses


def controller_config(args: argparse.Namespace) -> ControllerConfig:
    """A node from the parsed flags (mqmeta.config_file has merged --config into them)."""
    missing = [k for k in ("node_id", "grpc", "raft", "data_dir") if not getattr(args, k, None)]
    if missing:
        flags = ", ".join("--" + k.replace("node_id", "id").replace("_", "-") for k in missing)
        raise InvalidArgument(f"a controller node needs {flags} (flags or --config keys)")
    secret = None
    if args.secret_file:
        path = Path(args.secret_file)
        try:
            secret = path.read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read --secret-file {path}: {exc.strerror}") from None
        if not secret:
            raise InvalidArgument(f"--secret-file {path} is empty")
    elif args.peer and not getattr(args, "insecure_raft", False):
        # pysyncobj's wire format is pickle: an unauthenticated Raft port runs code it is sent
        raise InvalidArgument(
            "a controller node with peers needs --secret-file (the same secret on every node), "
            "or --insecure-raft to run without one on a network no untrusted host can reach"
        )
    return ControllerConfig(
        node_id=str(args.node_id),
        grpc=str(args.grpc),
        raft=str(args.raft),
        data_dir=Path(args.data_dir),
        peers=[parse_peer(p) for p in args.peer or []],
        raft_settings=raft_settings_from(getattr(args, "raft_settings", None) or {}, secret),
        metrics_listen=str(args.metrics_listen or ""),
    )


def run_controller(args: argparse.Namespace) -> int:
    serve_until_signal(start_controller(controller_config(args)))
    return 0


def remoting_proxies(args: argparse.Namespace, remoting: str) -> dict[str, str]:
    """--remoting-proxy checked (each needs --remoting-listen: the routes that name them);
    none with --remoting-routes direct."""
    proxies = parse_proxies(getattr(args, "remoting_proxy", None))
    if proxies and not remoting:
        raise InvalidArgument("--remoting-proxy needs --remoting-listen (the routes that name the proxies)")
    return proxies if getattr(args, "remoting_routes", "proxy") == "proxy" else {}


def run_namesrv(args: argparse.Namespace) -> int:
    parse_addresses(args.listen, "--listen address")
    if args.console_listen:  # before anything starts: a bad address is one sentence
        parse_addresses(args.console_listen, "--console-listen address")
        check_can_listen(args.console_listen)
    remoting = listen_address(args)
    routes = RocketMQRoutes(
        str(getattr(args, "rocketmq_routes", None) or "proxy"),
        tuple(parse_addresses(args.rocketmq_endpoints, "--rocketmq-endpoints address"))
        if getattr(args, "rocketmq_endpoints", None)
        else (),
    )
    proxies = remoting_proxies(args, remoting)
    if args.embed_controller:
        node = start_controller(
            controller_config(args),
            namesrv_address=args.listen,
            remoting_address=remoting,
            routes=routes,
            remoting_proxies=proxies,
        )
    elif args.controllers:
        node = start_namesrv(
            args.listen,
            parse_addresses(args.controllers),
            args.metrics_listen or "",
            remoting,
            rocketmq_routes=routes,
            remoting_proxies=proxies,
        )
    else:
        raise InvalidArgument("a nameserver needs --controllers ADDRS or --embed-controller")
    if args.console_listen:
        _add_console(node, args)
    serve_until_signal(node)
    return 0


def _add_console(node: RunningNode, args: argparse.Namespace) -> None:
    """The web console beside the nameserver, reading from the same controllers."""
    from mqmeta.controller.console import start_console

    if args.embed_controller:
        peers = controller_config(args).peers
        controllers = list(dict.fromkeys([str(args.grpc), *(p.grpc for p in peers)]))
    else:
        controllers = parse_addresses(args.controllers)
    try:
        console = start_console(args.console_listen, controllers)
    except BaseException:
        node.stop(graceful=False)
        raise
    node.closers.insert(0, console.stop)
    print(f"mqmeta console: {console.url()}", flush=True)
