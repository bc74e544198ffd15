"""Port reservations (cluster/ports.py): a cluster's ports stay its own while it lives.

Properties checked:
- while a port is reserved, no other socket can take it: a bind without SO_REUSEADDR
  fails, and a server with SO_REUSEADDR fails once the child listens;
- the child (SO_REUSEADDR, as every server here) binds and serves on it; after a kill -9
  of the child the port is still not takeable and refuses connections, and the
  restarted child binds it again; once released, anyone can bind it;
- the race that picking a free port and closing it had is gone: binds to port 0 (what
  other tests' servers and fault proxies do) never land on a reserved port, while they
  do land on ports that were picked and released;
- a harness Cluster holds every address of its layout from construction to stop(), a
  second Cluster on the same dir holds the same addresses again, and one whose address
  another process listens on is refused with a sentence saying so.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.layout import Layout
from mqmeta.cluster.local import BROKER_SETS_MAX, CONTROLLERS_MAX, REPLICAS_MAX
from mqmeta.cluster.ports import RESERVATION_PORTS_MAX, PortReservation

from mqmeta.errors import Unavailable

pytestmark = pytest.mark.timeout(60)

HOST = "127.0.0.1"
CHILD_START_TIMEOUT_S = 20.0
RESERVED_COUNT = 200
PORT_0_BINDS = 3000

# A server as ours bind theirs (SO_REUSEADDR): says "listening", then answers "up" to
# every connection.
_CHILD = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"up")
    connection.close()
"""


def _plain_bind_works(port: int) -> bool:
    """Whether a socket without SO_REUSEADDR (a client's, most programs') can take the port."""
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _server_bind_works(port: int) -> bool:
    """Whether a server (SO_REUSEADDR) can bind and listen on the port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            sock.listen()
        except OSError:
            return False
        return True


def _start_child(port: int) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    line = child.stdout.readline()  # the child says so once it listens, or dies
    if line.strip() != "listening":
        child.kill()
        _, errors = child.communicate(timeout=CHILD_START_TIMEOUT_S)
        pytest.fail(f"the child could not listen on {port}: {errors}")
    return child


def _stop(child: subprocess.Popen) -> None:
    child.kill()  # kill -9
    child.communicate(timeout=CHILD_START_TIMEOUT_S)


def _ask(port: int) -> bytes:
    with socket.create_connection((HOST, port), timeout=5) as sock:
        return sock.recv(16)


def test_a_reserved_port_is_kept_for_its_child_across_kill_9():
    with PortReservation.pick(1) as reservation:
        [port] = reservation.ports
        assert reservation.addresses == [f"{HOST}:{port}"]
        assert not _plain_bind_works(port), "another program took a reserved port"
        child = _start_child(port)
        try:
            assert _ask(port) == b"up"
            assert not _server_bind_works(port), "a second server bound the child's port"
        finally:
            _stop(child)
        assert not _plain_bind_works(port), "the port was takeable after the child died"
        with pytest.raises(ConnectionRefusedError):
            _ask(port)  # the reservation never accepts connections
        restarted = _start_child(port)
        try:
            assert _ask(port) == b"up", "the restarted child got its port back"
        finally:
            _stop(restarted)
    assert not reservation.held
    assert _server_bind_works(port), "released: the port is free again"


def test_port_0_binds_never_land_on_a_reserved_port():
    """Binds to port 0 are what took a picked-and-released port before its child bound it.
    The control half shows this test can see that race: released ports do get taken."""

    def port_0_binds() -> set[int]:
        landed = set()
        for i in range(PORT_0_BINDS):
            with socket.socket() as sock:
                if i % 2:  # half as servers do (SO_REUSEADDR), half as clients do
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((HOST, 0))
                landed.add(sock.getsockname()[1])
        return landed

    with PortReservation.pick(RESERVED_COUNT) as reservation:
        reserved = set(reservation.ports)
        assert len(reserved) == RESERVED_COUNT, "every reserved port is distinct"
        assert not reserved & port_0_binds(), "a bind to port 0 got a reserved port"
    taken = reserved & port_0_binds()  # the old way: picked, released, handed out later
    assert taken, "released ports are taken by binds to port 0 (the race reservations remove)"


def test_reservation_bounds():
    for count in (0, RESERVATION_PORTS_MAX + 1):
        with pytest.raises(ValueError, match="a reservation holds 1 to"):
            PortReservation.pick(count)
    with pytest.raises(ValueError, match="not HOST:PORT"):
        PortReservation.hold(["127.0.0.1"])


@pytest.mark.parametrize("embedded", [False, True])
def test_the_largest_local_up_fits_one_reservation(embedded):
    assert (
        Layout.port_count(CONTROLLERS_MAX, embedded, BROKER_SETS_MAX, REPLICAS_MAX) <= RESERVATION_PORTS_MAX
    )


@pytest.mark.parametrize("embedded", [False, True])
def test_a_cluster_holds_its_layout_until_it_stops(tmp_path, embedded):
    root = tmp_path / "c"
    cluster = Cluster(root, count=3, embedded=embedded, broker_sets=1, replicas=2)
    addresses = cluster.layout.addresses()
    ports = [int(a.rpartition(":")[2]) for a in addresses]
    try:
        assert len(set(addresses)) == len(addresses) == Layout.port_count(3, embedded, 1, 2)
        assert set(addresses) >= {n.grpc for n in cluster.layout.controllers} | set(cluster.layout.namesrv)
        assert not any(_plain_bind_works(p) for p in ports), "a cluster's port was takeable"
    finally:
        cluster.stop()
    assert all(_server_bind_works(p) for p in ports), "stop() lets the ports go"
    with Cluster(root, count=3, embedded=embedded, broker_sets=1, replicas=2) as again:
        assert again.layout.addresses() == addresses, "the same dir is the same cluster"
        assert not any(_plain_bind_works(p) for p in ports)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((HOST, ports[-1]))
        squatter.listen()
        with pytest.raises(Unavailable, match=f"cannot hold {HOST}:{ports[-1]} .*another process listens"):
            Cluster(root, count=3, embedded=embedded, broker_sets=1, replicas=2)
    assert all(_server_bind_works(p) for p in ports), "a refused reservation holds nothing"
