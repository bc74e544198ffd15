"""A client that sends a frame's header, then a byte now and then: how long a frame
server keeps such a connection (the frame deadline the call stream and the HA stream
enforce)."""

from __future__ import annotations

import socket
import struct
import time

from mqmeta import frames

TRICKLE_FOR_S_MAX = 4.0  # how long the bytes keep coming when the server never ends it


def trickled_connection_lifetime_s(port: int, claimed_bytes: int) -> float | None:
    """Seconds from a request header claiming `claimed_bytes` to the server ending the
    connection, one byte sent every 0.1 s meanwhile; None when it was still open after
    TRICKLE_FOR_S_MAX."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as slow:
        started = time.monotonic()
        slow.sendall(struct.pack(">IBI", claimed_bytes, frames.KIND_REQUEST, 0))
        slow.settimeout(0.1)
        while time.monotonic() - started < TRICKLE_FOR_S_MAX:
            try:
                slow.sendall(b"x")
                if slow.recv(1) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:  # reset by the server
                return time.monotonic() - started
    return None
