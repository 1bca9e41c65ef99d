"""A webhook receiver for tests: an aiohttp server in a background thread of the test process.

:class:`Receiver` records every request it takes (2xx) with its events and headers, verifies
``Lapidus-Signature`` when given the secret (a bad one is answered 401 and counted), and can be
told how to answer: ``receiver.answer = lambda events: 503`` (or a ``(status, headers)``
pair) answers every request so until it is set back to None.  ``tls=`` a
:class:`tests.integration.tls_fixtures.Pki` serves https:// with its server certificate.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from typing import Callable, Dict, List, NamedTuple, Optional

import pytest
from aiohttp import web

from lapidus.sinks.webhook.requests import verify
from tests.conftest import wait_until


class Taken(NamedTuple):
    events: List[dict]
    headers: Dict[str, str]


class Receiver:
    def __init__(self, secret: Optional[str] = None, user: Optional[str] = None, tls=None):
        self.secret = secret
        self._ssl: Optional[ssl.SSLContext] = None
        if tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(str(tls.server_cert), str(tls.server_key))
        self.taken: List[Taken] = []
        self.answered: Dict[int, int] = {}            # status -> count of non-2xx answers
        self.bad_signatures = 0
        self.answer: Optional[Callable[[List[dict]], object]] = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: Optional[web.AppRunner] = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test webhook receiver did not start")
        scheme = "https" if self._ssl is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/hook"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.secret is not None and not verify(self.secret, body,
                                                  request.headers.get("Lapidus-Signature")):
            with self._lock:
                self.bad_signatures += 1
            return web.Response(status=401, text="bad signature")
        events = json.loads(body)["events"]
        answer = self.answer(events) if self.answer is not None else 200
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        if not 200 <= status < 300:
            with self._lock:
                self.answered[status] = self.answered.get(status, 0) + 1
            return web.Response(status=status, headers=headers, text="not now")
        with self._lock:
            self.taken.append(Taken(events, dict(request.headers)))
        return web.Response(status=200)

    # -- observing ------------------------------------------------------------------------

    def events(self) -> List[dict]:
        with self._lock:
            return [event for taken in self.taken for event in taken.events]

    def requests(self) -> List[Taken]:
        with self._lock:
            return list(self.taken)

    def wait_ids(self, ids, timeout: float = 60.0) -> List[dict]:
        """Wait until every id of ``ids`` was taken; the events taken so far."""
        wanted = set(ids)

        def done():
            events = self.events()
            return events if wanted <= {e["id"] for e in events} else None
        return wait_until(done, timeout,
                          message=f"{len(wanted)} events at the webhook")

    def wait_count(self, count: int, timeout: float = 60.0) -> List[dict]:
        return wait_until(lambda: (lambda e: e if len({x["id"] for x in e}) >= count
                                   else None)(self.events()), timeout,
                          message=f"{count} distinct events at the webhook")

    def close(self) -> None:
        async def stop():
            if self._runner is not None:
                await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def receiver():
    """``receiver(secret=None)`` -> a started :class:`Receiver`, closed after the test."""
    started: List[Receiver] = []

    def start(**options) -> Receiver:
        r = Receiver(**options)
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()
