"""The peers, each a 3-node cluster on 127.0.0.1 in a temporary directory, started from
Debian's packages and stopped by pid: etcd (3.4), RabbitMQ (3.10, one quorum queue) and
NATS (2.9, one JetStream R3 file stream). A peer whose binary is absent is skipped by
name (`absent()` says which package installs it).

Each peer answers the same questions: `start()`, `stop()`, `pids()` (node name -> the pid
whose fsyncs and memory count), `version`, `settings` (what the JSON reports), and
`kill(node)` / `restart(node)` for the restart figures.
"""

from __future__ import annotations

import base64
import http.client
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from mqmeta.cluster.ports import PortReservation

NODES = 3
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 5.0

INSTALL = {
    "etcd": ("etcd", "apt-get install -y etcd-server etcd-client"),
    "rabbitmq": ("/usr/lib/rabbitmq/bin/rabbitmq-server", "apt-get install -y rabbitmq-server"),
    "nats": ("nats-server", "apt-get install -y nats-server"),
}


class PeerStartFailed(RuntimeError):
    """A peer did not come up in time (its log's tail is in the message)."""


CLIENT_MODULES = {"etcd": None, "rabbitmq": "pika", "nats": "nats"}  # etcd: HTTP/JSON, no package


def absent(name: str) -> str | None:
    """Why peer `name` cannot run here (one sentence), or None when its binary and its
    Python client are present."""
    binary, install = INSTALL[name]
    if shutil.which(binary) is None and not Path(binary).exists():
        return f"{name} is not installed ({binary} not found); install it with `{install}`"
    module = CLIENT_MODULES[name]
    if module is not None and importlib.util.find_spec(module) is None:
        return f"{name}'s Python client ({module}) is not installed; pip install 'mqmeta[peers]'"
    return None


def _wait(predicate, timeout_s: float, what: str, log_path: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.1)
    tail = ""
    if log_path is not None and log_path.exists():
        tail = log_path.read_text(errors="replace")[-1500:]
    raise PeerStartFailed(f"{what} not ready in {timeout_s:.0f}s; log tail: {tail}")


def _terminate(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; our children only (by pid)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "unknown"


# etcd -------------------------------------------------------------------------------------


class Etcd:
    name = "etcd"

    def __init__(self, root: Path) -> None:
        self.root = root / "etcd"
        self.version = _version(["etcd", "--version"])
        ports = PortReservation.pick(2 * NODES)
        self.client_ports = ports.ports[:NODES]
        self.peer_ports = ports.ports[NODES:]
        ports.release()  # etcd binds them itself in a moment
        self.procs: dict[str, subprocess.Popen] = {}
        self.settings = {
            "nodes": NODES,
            "api": "v3 HTTP/JSON gateway (/v3/kv/put, /v3/kv/range: linearizable by default)",
            "fsync": "default (WAL fdatasync per Raft Ready batch)",
            "snapshot_count": "default (100,000)",
            "heartbeat_ms": 100,
            "election_ms": 1000,
        }

    def _argv(self, i: int) -> list[str]:
        cluster = ",".join(f"e{k}=http://127.0.0.1:{p}" for k, p in enumerate(self.peer_ports))
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        return [
            "etcd",
            "--name", f"e{i}",
            "--data-dir", str(self.root / f"e{i}"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "bench-peers",
            "--logger", "zap",
            "--log-outputs", str(self.root / f"e{i}.log"),
        ]  # fmt: skip

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for i in range(NODES):
            self._start_node(i)
        _wait(lambda: self.leader() is not None, START_TIMEOUT_S, "etcd", self.root / "e0.log")

    def _start_node(self, i: int) -> None:
        self.procs[f"e{i}"] = subprocess.Popen(
            self._argv(i), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )

    def endpoint(self, node: str) -> tuple[str, int]:
        return "127.0.0.1", self.client_ports[int(node[1:])]

    def leader(self) -> str | None:
        """The leader's node name, as node e0..e2 report it (None while there is none)."""
        ids: dict[int, str] = {}
        leader_id = None
        for node in self.procs:
            if not _alive(self.procs[node].pid):
                continue
            try:
                status = http_json(self.endpoint(node), "/v3/maintenance/status", {}, timeout_s=1.0)
            except OSError:
                continue
            ids[int(status["header"]["member_id"])] = node
            leader_id = int(status.get("leader", 0)) or leader_id
        return ids.get(leader_id) if leader_id else None

    def pids(self) -> dict[str, int]:
        return {node: proc.pid for node, proc in self.procs.items() if _alive(proc.pid)}

    def kill(self, node: str) -> None:
        self.procs[node].kill()
        self.procs[node].wait(timeout=STOP_TIMEOUT_S)

    def restart(self, node: str) -> None:
        argv = self._argv(int(node[1:]))
        argv[argv.index("--initial-cluster-state") + 1] = "existing"
        self.procs[node] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            _terminate(proc.pid)
            proc.wait(timeout=STOP_TIMEOUT_S)


def b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def http_json(
    endpoint: tuple[str, int],
    path: str,
    body: dict[str, Any],
    timeout_s: float = HTTP_TIMEOUT_S,
    connection: http.client.HTTPConnection | None = None,
) -> dict[str, Any]:
    """POST `body` as JSON; the decoded answer. A connection given is reused (keep-alive)."""
    own = connection is None
    conn = connection or http.client.HTTPConnection(*endpoint, timeout=timeout_s)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise OSError(f"{path}: HTTP {response.status}: {data[:200]!r}")
        return json.loads(data)
    finally:
        if own:
            conn.close()


# RabbitMQ ---------------------------------------------------------------------------------

RABBIT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBIT_CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
RABBIT_QUEUE = "bench-quorum"


class RabbitMQ:
    """Three nodes clustered by classic peer discovery, their own epmd, one quorum queue
    (declared on r0, which leads it: the producers connect there)."""

    name = "rabbitmq"

    def __init__(self, root: Path) -> None:
        self.root = root / "rabbitmq"
        ports = PortReservation.pick(2 * NODES + 1)
        self.amqp_ports = ports.ports[:NODES]
        self.dist_ports = ports.ports[NODES : 2 * NODES]
        self.epmd_port = ports.ports[-1]
        ports.release()
        self.procs: dict[str, subprocess.Popen] = {}
        self.epmd: subprocess.Popen | None = None
        self.version = "RabbitMQ " + (
            (Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*").__next__().name.split("-", 1)[1])
            if Path("/usr/lib/rabbitmq/lib").exists()
            else "unknown"
        )
        self.settings = {
            "nodes": NODES,
            "queue": "quorum (x-queue-type=quorum), 3 members, leader on the node the producers use",
            "publish": "persistent (delivery_mode 2), publisher confirms, one channel per producer",
            "erlang_args": "+sbwt none +sbwtdcpu none +sbwtdio none (no scheduler busy-wait)",
            "fsync": "default (Ra WAL fsyncs each batch before confirming)",
        }

    def _env(self, i: int) -> dict[str, str]:
        home = self.root / f"r{i}"
        return dict(
            os.environ,
            HOME=str(home),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_NODENAME=f"r{i}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_ports[i]),
            RABBITMQ_DIST_PORT=str(self.dist_ports[i]),
            RABBITMQ_CONFIG_FILE=str(home / "rabbit.conf"),
            RABBITMQ_MNESIA_BASE=str(home / "mnesia"),
            RABBITMQ_LOG_BASE=str(home / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(home / "plugins"),
            RABBITMQ_PID_FILE=str(home / "pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "+sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}"
            ),
        )

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.epmd = subprocess.Popen(
            ["epmd", "-address", "127.0.0.1", "-port", str(self.epmd_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cookie = os.urandom(16).hex()
        for i in range(NODES):
            home = self.root / f"r{i}"
            home.mkdir(parents=True, exist_ok=True)
            nodes = "\n".join(
                f"cluster_formation.classic_config.nodes.{k + 1} = r{k}@localhost" for k in range(NODES)
            )
            (home / "rabbit.conf").write_text(
                f"listeners.tcp.1 = 127.0.0.1:{self.amqp_ports[i]}\n"
                "cluster_formation.peer_discovery_backend = classic_config\n"
                f"{nodes}\nloopback_users = none\n"
            )
            (home / "plugins").write_text("[].\n")
            cookie_file = home / ".erlang.cookie"
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)
        for i in range(NODES):
            self._start_node(i)
        _wait(self._clustered, START_TIMEOUT_S, "rabbitmq (3 nodes clustered)", self.root / "r0" / "out.log")
        self._declare_queue()

    def _start_node(self, i: int) -> None:
        home = self.root / f"r{i}"
        with (home / "out.log").open("ab") as log:  # the child holds its own copy
            self.procs[f"r{i}"] = subprocess.Popen(
                [RABBIT_SERVER], env=self._env(i), cwd=home, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    def _clustered(self) -> bool:
        out = subprocess.run(
            [RABBIT_CTL, "-n", "r0@localhost", "cluster_status", "--formatter", "json"],
            env=self._env(0),
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            return False
        running = json.loads(out.stdout).get("running_nodes", [])
        return len(running) == NODES and self._amqp_up()

    def _amqp_up(self) -> bool:
        import pika

        for port in self.amqp_ports:
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).close()
        return True

    def _declare_queue(self) -> None:
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.amqp_ports[0]))
        channel = connection.channel()
        channel.queue_declare(RABBIT_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        connection.close()

    def beam_pid(self, node: str) -> int | None:
        try:
            return int((self.root / node / "pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def pids(self) -> dict[str, int]:
        out = {}
        for node in self.procs:
            pid = self.beam_pid(node)
            if pid is not None and _alive(pid):
                out[node] = pid
        return out

    def stop(self) -> None:
        for node, proc in self.procs.items():
            pid = self.beam_pid(node)
            if pid is not None:
                _terminate(pid)
            _terminate(proc.pid)
            proc.wait(timeout=STOP_TIMEOUT_S)
        if self.epmd is not None:
            _terminate(self.epmd.pid)
            self.epmd.wait(timeout=STOP_TIMEOUT_S)


# NATS -------------------------------------------------------------------------------------

NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.msgs"


class Nats:
    """Three JetStream servers in one cluster and one R3 file stream. NATS 2.9 has no
    `sync_interval` setting (2.10 added it): its file store fsyncs every 2 minutes, so
    its figures are not durable ones (`durable` says so in the JSON)."""

    name = "nats"

    def __init__(self, root: Path) -> None:
        self.root = root / "nats"
        ports = PortReservation.pick(2 * NODES)
        self.client_ports = ports.ports[:NODES]
        self.route_ports = ports.ports[NODES:]
        ports.release()
        self.procs: dict[str, subprocess.Popen] = {}
        self.version = _version(["nats-server", "--version"])
        self.durable = False
        self.settings = {
            "nodes": NODES,
            "stream": "file storage, 3 replicas, one subject",
            "sync_interval": "default (2 min): nats-server 2.9 refuses `sync_interval: always`",
            "durable": False,
        }

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports)
        for i in range(NODES):
            (self.root / f"n{i}.conf").write_text(
                f"listen: 127.0.0.1:{self.client_ports[i]}\n"
                f"server_name: n{i}\n"
                f'jetstream {{ store_dir: "{self.root / f"n{i}"}" }}\n'
                f"cluster {{ name: bench, listen: 127.0.0.1:{self.route_ports[i]}, routes: [{routes}] }}\n"
            )
            self._start_node(i)
        _wait(self._stream_ready, START_TIMEOUT_S, "nats (JetStream R3 stream)", self.root / "n0.log")

    def _start_node(self, i: int) -> None:
        with (self.root / f"n{i}.log").open("ab") as log:  # the child holds its own copy
            self.procs[f"n{i}"] = subprocess.Popen(
                ["nats-server", "-c", str(self.root / f"n{i}.conf")],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )

    def url(self, i: int = 0) -> str:
        return f"nats://127.0.0.1:{self.client_ports[i]}"

    def _stream_ready(self) -> bool:
        import asyncio

        import nats
        from nats.js.api import StorageType, StreamConfig

        async def create() -> bool:
            connection = await nats.connect(self.url(0), connect_timeout=2, max_reconnect_attempts=0)
            try:
                js = connection.jetstream(timeout=5)
                await js.add_stream(
                    StreamConfig(
                        name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=StorageType.FILE, num_replicas=3
                    )
                )
                await js.publish(NATS_SUBJECT, b"ready")
                return True
            finally:
                await connection.close()

        return asyncio.run(create())

    def pids(self) -> dict[str, int]:
        return {node: proc.pid for node, proc in self.procs.items() if _alive(proc.pid)}

    def stop(self) -> None:
        for proc in self.procs.values():
            _terminate(proc.pid)
            proc.wait(timeout=STOP_TIMEOUT_S)


PEERS = {"etcd": Etcd, "rabbitmq": RabbitMQ, "nats": Nats}
