"""A loopback TCP forwarder that a test can cut (drop every connection, refuse new ones).

Stands between one broker and the controllers so that only that link is partitioned.
(The chaos suite's Toxiproxy-compatible proxy replaces it in P5.)
"""

from __future__ import annotations

import socket
import threading


class TcpCut:
    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for s in self._sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._sockets.clear()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(timeout=2)
        self.server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                client.close()
                continue
            # The 2 s bounds the connect only: a stream idle for longer (a Watch between two
            # events) must stay open, not end in a recv timeout.
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                if self._cut.is_set():  # cut while this connection was being made
                    client.close()
                    upstream.close()
                    continue
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self._cut.is_set():
                data = source.recv(65536)
                if not data or self._cut.is_set():  # nothing read is forwarded after the cut
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # shutdown, not only close: the other direction's thread is blocked in recv on
            # one of these sockets, and a close alone neither wakes it nor sends the FIN, so
            # the far end would wait on a dead connection forever.
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass
