"""Real websocket clients (the ``websockets`` library) for the websocket sink tests.

The clients run on one asyncio loop in a thread of the test process (:class:`ClientLoop`), so
a synchronous test drives them: :meth:`ClientLoop.connect` returns a :class:`Client` whose
``frames`` fill up as they arrive; a stalled client (``stalled=True``) reads nothing until
:meth:`Client.resume` (its library queue holds one message, its socket buffer 4 KiB, so the
server's writes back up at once).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import List, Optional

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import wait_until
from tests.integration.mqtt_fixtures import free_port

__all__ = ["ClientLoop", "Client", "client_loop", "free_port"]


class Client:
    def __init__(self, loop: "ClientLoop", url: str, headers: Optional[dict], stalled: bool):
        self.loop = loop
        self.url = url
        self.headers = headers or {}
        self.frames: List[dict] = []
        self.close_code: Optional[int] = None       # the server's close frame, once seen
        self.close_reason: Optional[str] = None
        self.ended = threading.Event()
        self.error: Optional[BaseException] = None
        self.connected = threading.Event()
        self._resume: Optional[asyncio.Event] = None
        self._stalled = stalled
        self._ws = None

    async def _run(self) -> None:
        self._resume = asyncio.Event()
        try:
            kwargs = {}
            if self._stalled:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                host, port = self.url.split("/")[2].rsplit(":", 1)
                sock.connect((host, int(port)))
                kwargs = {"sock": sock, "max_queue": 1}
            async with connect(self.url, additional_headers=self.headers, compression=None,
                               max_size=None, open_timeout=10, **kwargs) as ws:
                self._ws = ws
                self.connected.set()
                if self._stalled:
                    await self._resume.wait()
                async for message in ws:
                    self.frames.append(orjson.loads(message))
        except ConnectionClosed as exc:
            if exc.rcvd is not None:
                self.close_code, self.close_reason = exc.rcvd.code, exc.rcvd.reason
        except BaseException as exc:   # reported to the test (refused handshakes ...)
            self.error = exc
        finally:
            received = self._ws.protocol.close_rcvd if self._ws is not None else None
            if received is not None:
                self.close_code, self.close_reason = received.code, received.reason
            self.connected.set()
            self.ended.set()

    # -- used by the tests ------------------------------------------------------------

    def ids(self) -> List[str]:
        return [f.get("id") for f in self.frames]

    def events(self) -> List[dict]:
        return [f for f in self.frames if f.get("position") is not None]

    def wait_frames(self, count: int, timeout: float = 30.0) -> List[dict]:
        wait_until(lambda: len(self.frames) >= count or self.ended.is_set(), timeout,
                   message=f"{count} frames at the client (has {len(self.frames)})")
        assert len(self.frames) >= count, (self.close_code, self.close_reason, self.error)
        return self.frames

    def resume(self) -> None:
        self.loop.call(self._resume.set)

    def disconnect(self) -> None:
        if self._ws is not None:
            self.loop.run(self._ws.close())
        assert self.ended.wait(10)


class ClientLoop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.clients: List[Client] = []

    def connect(self, url: str, headers: Optional[dict] = None, stalled: bool = False,
                wait: bool = True) -> Client:
        client = Client(self, url, headers, stalled)
        self.clients.append(client)
        asyncio.run_coroutine_threadsafe(client._run(), self.loop)
        if wait:
            assert client.connected.wait(15), "the client did not connect"
        return client

    def run(self, coroutine, timeout: float = 20.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, fn) -> None:
        self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        async def close_all():
            await asyncio.gather(*(c._ws.close() for c in self.clients
                                   if c._ws is not None and not c.ended.is_set()),
                                 return_exceptions=True)
        for client in self.clients:
            if client._resume is not None:
                self.call(client._resume.set)
        try:
            self.run(close_all(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture
def client_loop():
    loop = ClientLoop()
    yield loop
    loop.stop()
