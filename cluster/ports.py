"""Ports held for a cluster's processes from the moment they are chosen until the cluster ends.

Picking a free port by binding port 0 and closing the socket hands out a port that any
other process may take before the child binds it (another test's server asking for port
0, another cluster picking ports the same way): the child then dies with "Address
already in use". A child that binds port 0 itself and reports its port avoids that, but
a cluster needs its addresses before its processes start (every controller is told its
peers, brokers are told the controllers, dial maps and fault proxies name them), and a
broker killed -9 must come back on the same address.

So the kernel picks each port (bind to port 0) and a PortReservation keeps that socket
bound, with SO_REUSEADDR and never listening, for as long as the cluster lives. On Linux:
- no other process can take the port: a bind without SO_REUSEADDR fails, a bind to port 0
  and the port a connect() picks skip it (both skip every port a socket is bound to), and
  a bind with SO_REUSEADDR fails once the child listens;
- the child binds and listens on it, because it sets SO_REUSEADDR as every server here
  does (gRPC, pysyncobj's Raft listener, asyncio and http.server servers) and the other
  socket bound to the port is not listening;
- after a kill -9 of the child the reservation still holds the port, and the restarted
  child binds it again.
The reserving process never accepts on these sockets: a connection to a port whose child
is down is refused, as it would be without the reservation.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

from mqmeta.errors import Unavailable

LOOPBACK_HOST = "127.0.0.1"
# The largest `local up` (7 controllers, 26 broker sets of 5 replicas) listens on 571
# ports, 744 with embedded nameservers (a test keeps this above Layout.port_count of it).
RESERVATION_PORTS_MAX = 1024


class PortReservation:
    """Bound, non-listening sockets that keep their ports for the processes meant to bind them."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._sockets = sockets

    @classmethod
    def pick(cls, count: int, host: str = LOOPBACK_HOST) -> PortReservation:
        """`count` ports of `host` that the kernel chooses, each held until release()."""
        _check_count(count)
        return cls._bound([(host, 0)] * count)

    @classmethod
    def hold(cls, addresses: Iterable[str]) -> PortReservation:
        """Holds the given HOST:PORT addresses again (a cluster restarted from its layout);
        raises Unavailable when one is in use by a listening socket."""
        pairs = [_split(address) for address in addresses]
        _check_count(len(pairs))
        return cls._bound(pairs)

    @classmethod
    def _bound(cls, pairs: list[tuple[str, int]]) -> PortReservation:
        sockets: list[socket.socket] = []
        try:
            for host, port in pairs:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, port))
                except OSError as error:
                    raise Unavailable(
                        f"cannot hold {host}:{port} ({error.strerror}): another process listens on "
                        "it; stop it (an earlier run on the same data dir?) or use another data dir"
                    ) from None
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        return cls(sockets)

    @property
    def ports(self) -> list[int]:
        return [int(sock.getsockname()[1]) for sock in self._sockets]

    @property
    def addresses(self) -> list[str]:
        return [f"{host}:{port}" for host, port in (sock.getsockname() for sock in self._sockets)]

    @property
    def held(self) -> bool:
        return bool(self._sockets)

    def release(self) -> None:
        """Lets the ports go (idempotent); call it once no process of the cluster runs."""
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _check_count(count: int) -> None:
    if not 1 <= count <= RESERVATION_PORTS_MAX:
        raise ValueError(f"a reservation holds 1 to {RESERVATION_PORTS_MAX} ports, not {count}")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host, int(port)
