"""A TCP proxy on 127.0.0.1 that can cut every connection and refuse new ones for a while.

Runs its own asyncio loop in a background thread; the harness calls :meth:`TcpProxy.cut` and
:meth:`TcpProxy.restore` from other threads.  A cut aborts both sides of every forwarded
connection (the client and the server each see the connection reset) and closes the listening
socket, so connection attempts are refused until :meth:`restore` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Optional, Set

from .servers import HOST

CHUNK = 1 << 16


class TcpProxy:
    def __init__(self, name: str, target_port: int, target_host: str = HOST):
        self.name = name
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._server: Optional[asyncio.AbstractServer] = None
        self._transports: Set[asyncio.BaseTransport] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"proxy-{name}")

    # -- control (any thread) ---------------------------------------------------------------

    def start(self) -> "TcpProxy":
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> int:
        """Drop every connection and refuse new ones; returns how many were dropped."""
        self.cuts += 1
        return self._call(self._cut())

    def restore(self) -> None:
        """Listen again (same port); a no-op when listening."""
        self._call(self._listen())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._cut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    @property
    def listening(self) -> bool:
        return self._server is not None

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- inside the loop -----------------------------------------------------------------------

    async def _listen(self) -> None:
        if self._server is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, self.port))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._handle, sock=sock)

    async def _cut(self) -> int:
        if self._server is not None:
            self._server.close()
            self._server = None
        dropped = len(self._transports)
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        return dropped

    async def _handle(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()     # the server is down: so is the proxy's side
            return
        ends = (client_writer.transport, server_writer.transport)
        if self._server is None:                # cut while connecting
            for end in ends:
                end.abort()
            return
        self._transports.update(ends)
        for end in ends:
            sock = end.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(self._pump(client_reader, server_writer),
                                 self._pump(server_reader, client_writer))
        finally:
            for end in ends:
                self._transports.discard(end)
                end.abort()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # one side finished: close the other (half-close is not needed by these protocols)
            writer.transport.abort()
