"""`mqmeta controller` and `mqmeta namesrv`: turn flags (or a TOML file) into a node."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from controller.server import (
    ControllerConfig,
    load_config_file,
    parse_peer,
    raft_settings_from,
    start_controller,
    start_namesrv,
)
from mqmeta.errors import InvalidArgument
from mqmeta.rpc import serve_until_signal
from mqmeta.validate import parse_addresses

NODE_KEYS = ("node_id", "grpc", "raft", "peer", "data_dir", "secret_file", "metrics_listen")


def _merged(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if args.config is not None:
        values.update(load_config_file(args.config))
    for key in NODE_KEYS:
        flag = getattr(args, key)
        if flag not in (None, []):
            values[key] = flag
    return values


def controller_config(args: argparse.Namespace) -> ControllerConfig:
    values = _merged(args)
    missing = [k for k in ("node_id", "grpc", "raft", "data_dir") if not values.get(k)]
    if missing:
        flags = ", ".join("--" + k.replace("node_id", "id").replace("_", "-") for k in missing)
        raise InvalidArgument(f"a controller node needs {flags} (flags or --config keys)")
    secret = None
    if values.get("secret_file"):
        path = Path(values["secret_file"])
        try:
            secret = path.read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read --secret-file {path}: {exc.strerror}") from None
        if not secret:
            raise InvalidArgument(f"--secret-file {path} is empty")
    return ControllerConfig(
        node_id=str(values["node_id"]),
        grpc=str(values["grpc"]),
        raft=str(values["raft"]),
        data_dir=Path(values["data_dir"]),
        peers=[parse_peer(p) for p in values.get("peer", [])],
        raft_settings=raft_settings_from(values.get("raft_settings", {}), secret),
        metrics_listen=str(values.get("metrics_listen") or ""),
    )


def run_controller(args: argparse.Namespace) -> int:
    serve_until_signal(start_controller(controller_config(args)))
    return 0


def run_namesrv(args: argparse.Namespace) -> int:
    parse_addresses(args.listen, "--listen address")
    if args.embed_controller:
        node = start_controller(controller_config(args), namesrv_address=args.listen)
    elif args.controllers:
        node = start_namesrv(args.listen, parse_addresses(args.controllers), args.metrics_listen or "")
    else:
        raise InvalidArgument("a nameserver needs --controllers ADDRS or --embed-controller")
    serve_until_signal(node)
    return 0
