"""A TCP proxy on loopback that a test takes down and brings back up: a database outage
without touching the shared database server.

``down()`` closes the listening socket and every forwarded connection (clients see their
connection drop, then "connection refused"); ``up()`` listens again on the same port.
"""

from __future__ import annotations

import socket
import threading
from typing import List, Optional, Tuple

import pytest


class OutageProxy:
    def __init__(self, target: Tuple[str, int]):
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        self._sockets: List[socket.socket] = []
        self._stop = threading.Event()
        self.up()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
        if listener is not None:
            _close(listener)
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        self._stop.set()
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:      # went down meanwhile
                    _close(client)
                    _close(server)
                    return
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
            except OSError:
                break
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def outage_proxy_for(target: Tuple[str, int]):
    """Fixture body: a proxy to ``target``, closed after the test."""
    proxy = OutageProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def pg_proxy():
    yield from outage_proxy_for(("127.0.0.1", 5432))


@pytest.fixture
def mysql_proxy():
    yield from outage_proxy_for(("127.0.0.1", 3306))
