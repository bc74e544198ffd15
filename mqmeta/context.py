"""Where the cluster is, for the commands that dial it (`admin`, `produce`, `consume`).

As etcdctl reads ETCDCTL_ENDPOINTS and mqadmin NAMESRV_ADDR, a command takes its
addresses from, in this order (the first that gives one wins):

1. the flag: `--controllers HOST:PORT,...` (admin) or `--namesrv HOST:PORT,...`;
2. `--cluster-dir DIR`: the `cluster.json` that `mqmeta local up --data-dir DIR` writes
   (with its TLS files and tokens when the cluster runs with `--tls` or `--auth`,
   unless a `--tls-*` or `--token-file` flag is given);
3. the environment: MQMETA_CONTROLLERS, MQMETA_NAMESRV (`local up` prints the lines).

The flag is named --cluster-dir, not --cluster: the admin commands' `--cluster` is a
RocketMQ cluster name.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.errors import InvalidArgument

ENV_CONTROLLERS = "MQMETA_CONTROLLERS"
ENV_NAMESRV = "MQMETA_NAMESRV"
CLUSTER_FILE = "cluster.json"
# cluster.json's "state": "running", or "stopped" once `local up` has stopped (every pid null)
STATE_RUNNING = "running"
STATE_STOPPED = "stopped"
CLUSTER_FILE_BYTES_MAX = 16 << 20  # a layout of many brokers is well under this


@dataclass(frozen=True)
class _Target:
    """What a command dials: its flag's dest, the flag, the variable, cluster.json's key."""

    dest: str
    flag: str
    env: str
    document_key: str
    noun: str


CONTROLLERS = _Target("controllers", "--controllers", ENV_CONTROLLERS, "controllers", "controller")
NAMESRV = _Target("namesrv", "--namesrv", ENV_NAMESRV, "namesrv", "nameserver")
_TARGETS = {t.dest: t for t in (CONTROLLERS, NAMESRV)}

PRECEDENCE_HELP = (
    "the addresses come from {flag}, else --cluster-dir, else ${env}; `mqmeta local up` prints "
    "the export line"
)


def add_context_flags(parser: argparse.ArgumentParser, target: _Target) -> None:
    """{flag} and --cluster-dir on `parser`, and the parser's --help says which one wins."""
    parser.add_argument(
        target.flag,
        dest=target.dest,
        metavar="HOST:PORT[,...]",
        help=f"{target.noun} addresses (default: from --cluster-dir, else ${target.env})",
    )
    parser.add_argument(
        "--cluster-dir",
        type=Path,
        metavar="DIR",
        help=f"a `mqmeta local up` data dir: dial the cluster its {CLUSTER_FILE} describes",
    )
    epilog = PRECEDENCE_HELP.format(flag=target.flag, env=target.env)
    parser.epilog = f"{parser.epilog} {epilog}" if parser.epilog else epilog


def read_cluster_file(directory: Path) -> dict[str, Any]:
    """DIR/cluster.json as a dict; InvalidArgument (one sentence) when it is not one."""
    path = directory / CLUSTER_FILE
    try:
        with path.open("rb") as file:
            text = file.read(CLUSTER_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise InvalidArgument(
            f"--cluster-dir {directory}: no {CLUSTER_FILE} there; start the cluster with "
            f"`mqmeta local up --data-dir {directory}` (it writes the file once every node answers)"
        ) from None
    except OSError as error:
        raise InvalidArgument(f"--cluster-dir {directory}: cannot read {path} ({error.strerror})") from None
    if len(text) > CLUSTER_FILE_BYTES_MAX:
        raise InvalidArgument(f"{path} is larger than {CLUSTER_FILE_BYTES_MAX} bytes: not a cluster file")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidArgument(f"{path} is not JSON: not a file `mqmeta local up` wrote") from None
    if not isinstance(document, dict):
        raise InvalidArgument(f"{path} is not a JSON object: not a file `mqmeta local up` wrote")
    if document.get("state") == STATE_STOPPED:
        raise InvalidArgument(
            f"--cluster-dir {directory}: the cluster there is stopped ({CLUSTER_FILE} says so); "
            f"start it again with `mqmeta local up --data-dir {directory}`"
        )
    return document


def addresses(document: dict[str, Any], key: str, where: str) -> str:
    """The comma-separated gRPC addresses of cluster.json's `key` list."""
    nodes = document.get(key)
    found = [n.get("grpc") for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []
    if not found or not all(isinstance(a, str) and a for a in found):
        raise InvalidArgument(f"{where} lists no {key} addresses: not a file `mqmeta local up` wrote")
    return ",".join(str(a) for a in found)


def resolve(args: argparse.Namespace, role: str) -> None:
    """Fills the address flag of `args` (and, from a --cluster-dir, the TLS files and the
    token of `role`: "admin" or "client") by the order above; InvalidArgument when no
    source gives the addresses."""
    target = _TARGETS["controllers" if role == "admin" else "namesrv"]
    if getattr(args, target.dest):
        return
    directory: Path | None = getattr(args, "cluster_dir", None)
    if directory is not None:
        document = read_cluster_file(directory)
        setattr(args, target.dest, addresses(document, target.document_key, str(directory / CLUSTER_FILE)))
        _credentials_from(document, args, role)
        return
    from_env = os.environ.get(target.env, "").strip()
    if from_env:
        setattr(args, target.dest, from_env)
        return
    raise InvalidArgument(
        f"no {target.noun} addresses: give {target.flag} HOST:PORT, --cluster-dir DIR (a "
        f"`mqmeta local up` data dir) or set {target.env}"
    )


def _credentials_from(document: dict[str, Any], args: argparse.Namespace, role: str) -> None:
    """A --tls/--auth local cluster's client credentials, unless the flags give some: with
    TLS the certificate is the credential (admin.pem for admin, client.pem otherwise);
    without it, the admin or read token."""
    given = [getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key", "token_file")]
    if any(value is not None for value in given):
        return
    tls, auth = document.get("tls"), document.get("auth")
    if isinstance(tls, dict):
        prefix = "admin" if role == "admin" else "client"
        args.tls_ca = _path(tls, "ca")
        args.tls_cert, args.tls_key = _path(tls, f"{prefix}_cert"), _path(tls, f"{prefix}_key")
    elif isinstance(auth, dict):
        args.token_file = _path(auth, "admin_token_file" if role == "admin" else "read_token_file")


def _path(table: dict[str, Any], key: str) -> Path:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{CLUSTER_FILE} names no {key!r}: not a file `mqmeta local up` wrote")
    return Path(value)


def export_lines(document: dict[str, Any], directory: Path) -> list[str]:
    """The shell lines that point later commands at this cluster (`local up` prints them)."""
    controllers = addresses(document, "controllers", CLUSTER_FILE)
    namesrv = addresses(document, "namesrv", CLUSTER_FILE)
    return [
        f"# for mqmeta admin, produce and consume: paste this line, or pass --cluster-dir {directory}",
        f"export {ENV_CONTROLLERS}={controllers} {ENV_NAMESRV}={namesrv}",
    ]
