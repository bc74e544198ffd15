"""`mqmeta local up`: a whole cluster on this machine, in the foreground.

The layout (ports, ids, the generated Raft secret) is written once to DIR/layout.json,
so running the command again on the same DIR restarts the same cluster from its data.
The command holds the cluster's ports while it runs (cluster/ports.py), so no other
process takes one before its child binds it. Once every node answers, DIR/cluster.json
says where everything is.

With `--clusters N` it runs N such clusters named a, b, ...: the first in DIR (its
brokers in cluster `a`, listed at the top of cluster.json as with one cluster), the
others in DIR/cluster-b, ...; cluster.json adds "clusters" (each one's controllers,
nameserver and brokers). `--replicate` adds one `mqmeta replicator` worker with a rule
a -> b for every topic (DIR/replicator.toml), listed under "replicators".
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.cluster.certs import LocalCerts, LocalTokens, ensure_local_certs, ensure_local_tokens
from mqmeta.cluster.layout import (
    Layout,
    broker_command,
    controller_command,
    ensure_secret,
    load_or_create_layout,
    namesrv_command,
    save_layout,
    tiered_dir,
)
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.ready import wait_brokers_ready, wait_ready
from mqmeta.cluster.supervisor import NOT_RESTARTED, Supervisor

from mqmeta import auth, tls
from mqmeta.client import ControllerClient
from mqmeta.context import CLUSTER_FILE, STATE_RUNNING, STATE_STOPPED, export_lines
from mqmeta.errors import InvalidArgument
from mqmeta.formats.atomic import write_json_atomically
from mqmeta.pb import controller_pb2 as pb
from mqmeta.rpc import exit_at_once

CONTROLLERS_MAX = 7
CLUSTERS_MAX = 4
BROKER_SETS_MAX = 26  # broker sets are named a-z
REPLICAS_MAX = 5
CLUSTER_NAMES = "abcd"
REPLICATOR_NAME = "replicator-1"
SUPERVISE_INTERVAL_S = 0.5


@dataclass(frozen=True)
class _Site:
    name: str  # the brokers' cluster name ("" for a lone cluster: the default cluster)
    root: Path
    layout: Layout
    supervisor: Supervisor
    tls_flags: tuple[str, ...] = ()  # every child's --tls-* and --token-file flags
    server_flags: tuple[str, ...] = ()  # the servers' --auth-file (local up --auth)
    rocketmq_routes: str = "proxy"  # what the nameservers' QueryRoute gives RocketMQ 5 clients


def local_up(args: argparse.Namespace) -> int:
    if not 1 <= args.controllers <= CONTROLLERS_MAX or args.controllers % 2 == 0:
        raise InvalidArgument(f"--controllers must be odd, from 1 to {CONTROLLERS_MAX}")
    if not 0 <= args.broker_sets <= BROKER_SETS_MAX or not 1 <= args.replicas <= REPLICAS_MAX:
        raise InvalidArgument(
            f"--broker-sets must be 0 to {BROKER_SETS_MAX} and --replicas 1 to {REPLICAS_MAX}"
        )
    clusters, replicate = getattr(args, "clusters", 1), getattr(args, "replicate", False)
    if not 1 <= clusters <= CLUSTERS_MAX:
        raise InvalidArgument(f"--clusters must be from 1 to {CLUSTERS_MAX}")
    if replicate and (clusters < 2 or args.broker_sets < 1):
        raise InvalidArgument("--replicate needs --clusters 2 or more, each with a broker set")
    auth_on, anonymous = getattr(args, "auth", False), getattr(args, "anonymous_reads", False)
    if anonymous and not auth_on:
        raise InvalidArgument("--anonymous-reads needs --auth (without it nothing is checked)")
    root = args.data_dir.resolve()
    certs = _setup_tls(root, admin=auth_on) if getattr(args, "tls", False) else None
    tls_flags = tuple(certs.server_flags()) if certs else ()
    tokens = _setup_auth(root, certificates=certs is not None) if auth_on else None
    if tokens is not None and certs is None:  # with mutual TLS, node.pem is the cluster credential
        tls_flags += ("--token-file", str(tokens.admin_token))
    server_flags: tuple[str, ...] = ("--auth-file", str(tokens.auth_file)) if tokens else ()
    server_flags += ("--anonymous-reads",) if anonymous else ()
    _check_cluster_count(root, clusters)
    with contextlib.ExitStack() as held:
        sites = []
        for i in range(clusters):
            site_root = root if i == 0 else root / f"cluster-{CLUSTER_NAMES[i]}"
            name = CLUSTER_NAMES[i] if clusters > 1 else ""
            layout, ports = load_or_create_layout(
                site_root, args.controllers, args.embedded, args.broker_sets, args.replicas, name
            )
            held.enter_context(ports)
            if i == 0 and replicate:
                held.enter_context(_replicator_metrics_port(site_root, layout))
            routes = getattr(args, "rocketmq_routes", "proxy")
            sites.append(
                _Site(name, site_root, layout, Supervisor(site_root), tls_flags, server_flags, routes)
            )
        status = _run(root, sites, replicate, certs, tokens, reads_need_credential=not anonymous)
    exit_at_once(status)  # every child has ended: as they do, skip the slow finalization


def _check_cluster_count(root: Path, clusters: int) -> None:
    """A DIR first started with --clusters N keeps N clusters: started with another count,
    its brokers would register under another cluster's name (DefaultCluster for one)."""
    if not (root / "layout.json").exists():
        return
    found = 1 + sum(1 for name in CLUSTER_NAMES[1:] if (root / f"cluster-{name}" / "layout.json").exists())
    if found != clusters:
        raise InvalidArgument(
            f"{root} holds {found} local cluster{'s' if found > 1 else ''} and --clusters is {clusters}: "
            f"run `mqmeta local up --data-dir {root} --clusters {found}`, or use another --data-dir"
        )


def _replicator_metrics_port(root: Path, layout: Layout) -> PortReservation:
    """The replicator's metrics port, chosen once and kept in DIR/layout.json (held by the
    returned reservation while the cluster runs)."""
    if layout.replicator_metrics:
        return PortReservation.hold([layout.replicator_metrics])
    ports = PortReservation.pick(1)
    layout.replicator_metrics = ports.addresses[0]
    save_layout(root, layout)
    return ports


def _setup_tls(root: Path, admin: bool) -> LocalCerts:
    """The local CA and certificates in DIR/tls/; this process (which waits for the cluster
    and configures it) dials with the admin certificate when admin writes need a credential,
    else with the client certificate."""
    certs = ensure_local_certs(root / "tls")
    cert, key = (certs.admin_cert, certs.admin_key) if admin else (certs.client_cert, certs.client_key)
    tls.configure(tls.load(cert=cert, key=key, ca=certs.ca))
    return certs


def _setup_auth(root: Path, certificates: bool) -> LocalTokens:
    """DIR/auth/: an admin token and a read-only one, and the allow list (with mutual TLS it
    also names the certificates' CNs). Without TLS every process and this one send the admin
    token; with it, they dial with a certificate of an admin identity and send none."""
    tokens = ensure_local_tokens(root / "auth", certificates)
    auth.configure(token=None if certificates else auth.load_token(tokens.admin_token))
    return tokens


def _tls_document(certs: LocalCerts) -> dict[str, Any]:
    """Where the CA and the client certificates are (paths only: never a key's contents)."""
    return {
        "ca": str(certs.ca),
        "client_cert": str(certs.client_cert),
        "client_key": str(certs.client_key),
        "admin_cert": str(certs.admin_cert),
        "admin_key": str(certs.admin_key),
        "mutual": True,
    }


def _run(
    root: Path,
    sites: list[_Site],
    replicate: bool,
    certs: LocalCerts | None = None,
    tokens: LocalTokens | None = None,
    reads_need_credential: bool = True,
) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    mark_stopped(root)  # a cluster.json left by a launcher that was killed names dead processes
    document: dict[str, Any] = {}
    try:
        documents = [_start_site(site) for site in sites]
        document = {"state": STATE_RUNNING, **documents[0]}
        if len(sites) > 1:
            document["clusters"] = [{"name": s.name, **d} for s, d in zip(sites, documents, strict=True)]
        if replicate:
            document["replicators"] = [_start_replicator(root, sites)]
        if certs is not None:
            document["tls"] = _tls_document(certs)
        if tokens is not None:  # the files' paths, never a token
            document["auth"] = {
                "auth_file": str(tokens.auth_file),
                "admin_token_file": str(tokens.admin_token),
                "read_token_file": str(tokens.read_token),
                "reads_need_credential": reads_need_credential,
            }
        write_json_atomically(root / CLUSTER_FILE, document, indent=2)
        for site in sites:
            print(
                f"mqmeta local cluster {site.name + ' ' if site.name else ''}ready: controllers "
                f"{site.layout.controller_addresses}; nameserver {','.join(site.layout.namesrv)}; "
                f"see {root / CLUSTER_FILE}",
                flush=True,
            )
        print("\n".join(export_lines(document, root)), flush=True)
        _supervise(root, [s.supervisor for s in sites], document, stop)
    finally:
        # SIGINT: every child stops at once (no broker hands off to a slave that is stopping too)
        for site in reversed(sites):
            site.supervisor.stop_all(signal.SIGINT)
        mark_stopped(root)
    return 0


def mark_stopped(root: Path) -> None:
    """Rewrites DIR/cluster.json, if there is one, to say the cluster is stopped: "state"
    "stopped" and every "pid" null (the processes it named are gone)."""
    path = root / CLUSTER_FILE
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if document.get("state") != STATE_STOPPED:
        write_json_atomically(
            path, _with_pids({**document, "state": STATE_STOPPED}, lambda pid: None), indent=2
        )


def _start_site(site: _Site) -> dict[str, Any]:
    """Starts one cluster and waits until it is ready; its part of cluster.json."""
    root, layout, supervisor = site.root, site.layout, site.supervisor
    ensure_secret(root)
    flags = [*site.tls_flags, *site.server_flags]
    routes = ["--rocketmq-routes", site.rocketmq_routes]
    for node in layout.controllers:
        supervisor.start(
            node.id, controller_command(root, layout, node) + flags + (routes if layout.embedded else [])
        )
    if not layout.embedded:
        supervisor.start("namesrv", namesrv_command(layout) + flags + routes)
    started = list(supervisor.children)

    def check_running() -> None:  # a child that exits ends the wait at once, with its log
        supervisor.check_running(started)

    wait_ready(layout.controller_addresses, layout.namesrv, check_running=check_running)
    if site.name:  # topics created without --cluster go to this cluster's brokers
        with ControllerClient(layout.controller_addresses) as client:
            client.update_config(pb.UpdateConfigRequest(values={"default_cluster": site.name}))
    cluster_flag = ["--cluster", site.name] if site.name else []
    for broker in layout.brokers:
        supervisor.start(broker.name, broker_command(root, layout, broker) + cluster_flag + flags)
        started.append(broker.name)
    statuses = wait_brokers_ready(layout.brokers, check_running=check_running) if layout.brokers else {}
    document = cluster_document(root, layout, supervisor, rocketmq_routes=site.rocketmq_routes)
    document["brokers"] = [
        {
            "cluster": statuses[b.name].cluster,
            "broker_name": b.broker_name,
            "broker_id": statuses[b.name].broker_id,
            "grpc": b.grpc,
            "pid": supervisor.children[b.name].pid,
            "data_dir": str(root / b.data_dir),
            "metrics": b.metrics,
            **({"remoting": b.remoting} if b.remoting else {}),
        }
        for b in layout.brokers
    ]
    return document


def _start_replicator(root: Path, sites: list[_Site]) -> dict[str, Any]:
    """One worker with a rule a -> b for every topic (each must exist in both clusters).
    Its leases and checkpoints live in the target's controllers: the copies and the DR
    site are there, so progress survives the loss of the source site with them."""
    source, target = sites[0], sites[1]
    config = root / "replicator.toml"
    config.write_text(
        "\n".join(
            [
                "[replicator]",
                f'controllers = "{target.layout.controller_addresses}"',
                "[[rules]]",
                f'name = "{source.name}-to-{target.name}"',
                f'source_namesrv = "{",".join(source.layout.namesrv)}"',
                f'target_namesrv = "{",".join(target.layout.namesrv)}"',
                'topic = "re:.*"',
                'start = "earliest"',
            ]
        )
        + "\n"
    )
    metrics = source.layout.replicator_metrics
    command = [sys.executable, "-m", "mqmeta.cli", "replicator", "--config", str(config)]
    command += ["--worker-id", "w1", "--metrics-listen", metrics, *source.tls_flags]
    process = source.supervisor.start(REPLICATOR_NAME, command)
    return {"pid": process.pid, "config": str(config), "metrics": metrics}


def _supervise(
    root: Path, supervisors: list[Supervisor], document: dict[str, Any], stop: threading.Event
) -> None:
    """Until `stop`: a child that exits is reported and started again (Supervisor.restart_exited:
    after a bounded backoff; not one that was asked to stop or refused its flags); cluster.json then names
    its new pid."""
    while not stop.wait(SUPERVISE_INTERVAL_S):
        restarted_all: dict[int, int] = {}
        for i, supervisor in enumerate(supervisors):
            where = f"cluster-{CLUSTER_NAMES[i]}/" if i else ""
            exited, restarted = supervisor.restart_exited()
            restarted_all.update(restarted)
            for name, code in exited:
                again = "" if code in NOT_RESTARTED else "; starting it again"
                print(
                    f"mqmeta local: {name} exited with status {code}; see {where}logs/{name}.log{again}",
                    file=sys.stderr,
                    flush=True,
                )
        if restarted_all and not stop.is_set():
            document = _with_pids(document, functools.partial(_renamed, restarted_all))
            write_json_atomically(root / CLUSTER_FILE, document, indent=2)


def _renamed(pids: dict[int, int], pid: Any) -> Any:
    return pids.get(pid, pid)


def _with_pids(value: Any, change: Callable[[Any], Any]) -> Any:
    """`value` (cluster.json's document) with every "pid" replaced by change(pid)."""
    if isinstance(value, dict):
        return {k: change(v) if k == "pid" else _with_pids(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_pids(v, change) for v in value]
    return value


def _proxies(text: str) -> dict[str, Any]:
    """A nameserver's remoting proxies as cluster.json names them: broker set -> HOST:PORT."""
    if not text:
        return {}
    return {"remoting_proxies": dict(item.split("=", 1) for item in text.split(","))}


def cluster_document(
    root: Path, layout: Layout, supervisor: Supervisor, remoting: bool = True, rocketmq_routes: str = "proxy"
) -> dict[str, Any]:
    controllers = [
        {
            "id": n.id,
            "grpc": n.grpc,
            "raft": n.raft,
            "pid": supervisor.children[n.id].pid,
            "data_dir": str(root / n.data_dir),
            "metrics": n.metrics,
        }
        for n in layout.controllers
    ]
    if layout.embedded:
        namesrv = [
            {
                "grpc": n.namesrv,
                "pid": supervisor.children[n.id].pid,
                "metrics": n.metrics,
                **({"remoting": n.remoting} if n.remoting and remoting else {}),
                **_proxies(n.remoting_proxy if n.remoting and remoting else ""),
            }
            for n in layout.controllers
        ]  # one process: the controller's metrics
    else:
        namesrv = [
            {
                "grpc": layout.namesrv[0],
                "pid": supervisor.children["namesrv"].pid,
                "metrics": layout.namesrv_metrics,
                **({"remoting": layout.namesrv_remoting} if layout.namesrv_remoting and remoting else {}),
                **_proxies(layout.namesrv_remoting_proxy if layout.namesrv_remoting and remoting else ""),
            }
        ]
    tiered = {"url": str(tiered_dir(root))} if layout.brokers else None
    return {
        "controllers": controllers,
        "namesrv": namesrv,
        "brokers": [],
        "tiered_store": tiered,
        "embedded": layout.embedded,
        "rocketmq_routes": rocketmq_routes,
    }
