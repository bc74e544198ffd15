"""`mqmeta controller` and `mqmeta namesrv`: their flags, and a node made of them (and a TOML file)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqmeta.config_file import accept_config_file
from mqmeta.errors import InvalidArgument
from mqmeta.validate import parse_addresses

if TYPE_CHECKING:
    from mqmeta.controller.server import ControllerConfig, RunningNode


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML file with any of these flags as keys")
    parser.add_argument("--id", dest="node_id", help="this controller node's id, e.g. c1")
    parser.add_argument("--grpc", help="gRPC address HOST:PORT of this node")
    parser.add_argument("--raft", help="Raft address HOST:PORT of this node")
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        help="another node as ID=RAFT_HOST:PORT/GRPC_HOST:PORT (repeat)",
    )
    parser.add_argument("--data-dir", type=Path, help="where this node keeps its journal and logs")
    parser.add_argument(
        "--secret-file", type=Path, help="file holding the Raft secret (authenticates and encrypts peers)"
    )
    parser.add_argument(
        "--insecure-raft",
        action="store_true",
        help="let a node with peers run without --secret-file (its Raft port must be unreachable "
        "from untrusted hosts: the wire format is pickle)",
    )
    parser.add_argument("--metrics-listen", help="serve Prometheus metrics over HTTP on HOST:PORT")
    parser.add_argument(
        "--no-call-stream",
        action="store_true",
        help="offer our clients no call stream: their unary calls stay gRPC calls (the stream "
        "is offered only without TLS and auth in any case)",
    )


def add_parser(subparsers: Any) -> None:
    """`mqmeta controller` and `mqmeta namesrv` (a nameserver may embed a controller node)."""
    controller = subparsers.add_parser("controller", help="run one standalone controller node")
    _add_node_flags(controller)
    accept_config_file(controller, tables=("raft_settings",))

    namesrv = subparsers.add_parser("namesrv", help="run a nameserver (optionally embedding a controller)")
    namesrv.add_argument("--listen", required=True, help="nameserver gRPC address HOST:PORT")
    namesrv.add_argument("--controllers", help="controller addresses (standalone nameserver)")
    namesrv.add_argument(
        "--embed-controller", action="store_true", help="also run a controller node in this process"
    )
    namesrv.add_argument(
        "--remoting-listen",
        nargs="?",
        const="0.0.0.0:9876",
        default="",
        help="serve RocketMQ 4.x clients (the classic remoting protocol) on HOST:PORT "
        "(RocketMQ's 0.0.0.0:9876 when the flag has no value)",
    )
    _add_route_flags(namesrv)
    _add_node_flags(namesrv)
    accept_config_file(namesrv, tables=("raft_settings",))


def _add_route_flags(namesrv: argparse.ArgumentParser) -> None:
    """What a nameserver's routes name: itself or the masters (RocketMQ 5), proxies or the
    masters (remoting)."""
    namesrv.add_argument(
        "--rocketmq-routes",
        choices=("proxy", "direct"),
        default="proxy",
        help="what QueryRoute gives RocketMQ 5 clients: proxy (the nameservers, which forward "
        "every call to the current master; the default) or direct (the masters' addresses)",
    )
    namesrv.add_argument(
        "--rocketmq-merge-calls",
        choices=("on", "off"),
        default="on",
        help="with proxy routes: merge the AckMessages and plain sends of one client that wait "
        "together into one call to the master (on, the default; see docs/clients.md)",
    )
    namesrv.add_argument(
        "--rocketmq-endpoints",
        default="",
        help="with proxy routes: every nameserver's gRPC address HOST:PORT,... "
        "(default: this one's --listen)",
    )
    namesrv.add_argument(
        "--remoting-proxy",
        action="append",
        metavar="BROKER_SET=HOST:PORT",
        help="a remoting proxy for a broker set (repeatable): routes name it instead of the "
        "set's master, and it forwards to whichever replica is master, so RocketMQ 4.x clients "
        "keep working across a failover without waiting for their next route refresh",
    )
    namesrv.add_argument(
        "--remoting-routes",
        choices=("proxy", "direct"),
        default="proxy",
        help="proxy (default): routes name the --remoting-proxy of a set that has one; direct: "
        "every route names the master's own remoting address (no proxy is started)",
    )
    namesrv.add_argument(
        "--console-listen",
        default="",
        help="serve the web console on HOST:PORT (https with --tls-cert; the --auth-file allow list)",
    )


def controller_config(args: argparse.Namespace) -> ControllerConfig:
    """A node from the parsed flags (mqmeta.config_file has merged --config into them)."""
    from mqmeta.controller.server import ControllerConfig, parse_peer, raft_settings_from

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
        call_stream=not getattr(args, "no_call_stream", False),
    )


def _run_controller(args: argparse.Namespace) -> int:
    from mqmeta.controller.server import start_controller

    from mqmeta.rpc import serve_until_signal

    config = controller_config(args)
    serve_until_signal(_short_full_gc_passes(start_controller(config), config))
    return 0


def _short_full_gc_passes(node: RunningNode, config: ControllerConfig) -> RunningNode:
    """The process's full garbage collections kept short (controller/gc_pauses.py): set
    up here, for a controller process, not by the node (tests run several in one)."""
    from mqmeta.controller.gc_pauses import SUPPORTED, FullPasses

    interval_s = config.raft_settings.gc_thaw_interval_s
    if interval_s and node.core is not None and SUPPORTED:
        raft = node.core.raft
        passes = FullPasses(lambda: not raft.is_leader() and bool(raft.leader_raft_address()), interval_s)
        passes.start()
        node.closers.append(passes.stop)
    return node


def remoting_proxies(args: argparse.Namespace, remoting: str) -> dict[str, str]:
    """--remoting-proxy checked (each needs --remoting-listen: the routes that name them);
    none with --remoting-routes direct."""
    from mqmeta.controller.remoting_proxy import parse_proxies

    proxies = parse_proxies(getattr(args, "remoting_proxy", None))
    if proxies and not remoting:
        raise InvalidArgument("--remoting-proxy needs --remoting-listen (the routes that name the proxies)")
    return proxies if getattr(args, "remoting_routes", "proxy") == "proxy" else {}


def _run_namesrv(args: argparse.Namespace) -> int:
    from mqmeta.controller.namesrv import RocketMQRoutes
    from mqmeta.controller.server import start_controller, start_namesrv

    from mqmeta.remoting.server import listen_address
    from mqmeta.rpc import check_can_listen, serve_until_signal

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
        merge_calls=str(getattr(args, "rocketmq_merge_calls", None) or "on") == "on",
    )
    proxies = remoting_proxies(args, remoting)
    if args.embed_controller:
        config = controller_config(args)
        node = _short_full_gc_passes(
            start_controller(
                config,
                namesrv_address=args.listen,
                remoting_address=remoting,
                routes=routes,
                remoting_proxies=proxies,
            ),
            config,
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
    from mqmeta.controller.console.service import start_console

    if args.embed_controller:
        peers = controller_config(args).peers
        controllers = list(dict.fromkeys([str(args.grpc), *(p.grpc for p in peers)]))
    else:
        controllers = parse_addresses(args.controllers)
    try:
        console = start_console(args.console_listen, controllers, node.route_cache)
    except BaseException:
        node.stop(graceful=False)
        raise
    node.closers.insert(0, console.stop)
    print(f"mqmeta console: {console.url()}", flush=True)


_RUNS: dict[str, Callable[[argparse.Namespace], int]] = {
    "controller": _run_controller,
    "namesrv": _run_namesrv,
}


def run(args: argparse.Namespace) -> int:
    """`mqmeta controller` or `mqmeta namesrv`, as args.command names."""
    return _RUNS[args.command](args)
