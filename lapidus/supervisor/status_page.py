"""The live status page: ``/`` (HTML, JS and CSS shipped in ``lapidus/supervisor/page``),
``/status.json`` and ``/events`` (its live updates), served by the ``[http]`` listener.

Runs in the supervisor process, in the arbiter loop (:class:`HttpServer` hands it the requests
and a wake-up every loop turn).  Live updates are server-sent events: ``/events`` is a response
that never ends, which the loop writes to (:meth:`LoopListener.send`).  That fits a loop
without threads or asyncio, unlike a websocket (a handshake and framing both ways) and unlike
polling (a new connection and a status every second per page).  A page that stops reading
costs at most ``max_backlog`` bytes, then it is closed; nothing waits on it.

Every ``PUSH_EVERY`` seconds each page gets ``status`` (the very object ``lapidusctl status
--json`` prints) and ``rates`` (the chart's new points, :mod:`.rates`); ``tail`` events come as
the dispatcher sends them (:mod:`.tail_view`), masked unless the page asked for ``values=1``.

With ``[http] token`` set, the page, ``/status.json`` and ``/events`` need it: as
``Authorization: Bearer <token>``, or in the cookie the page sets once it was entered.
"""

from __future__ import annotations

import hmac
import json
import time
import urllib.parse
from importlib import resources
from typing import Callable, Dict, List, Optional

from .http import Request, Response
from .listener import Client
from .rates import RateHistory
from .tail_view import TailView

PUSH_EVERY = 1.0
MAX_VIEWERS = 16
COOKIE = "lapidus_token"
ASSETS = {"/": ("index.html", "text/html; charset=utf-8"),
          "/page.js": ("page.js", "text/javascript; charset=utf-8"),
          "/page.css": ("page.css", "text/css; charset=utf-8")}
NO_STORE = (("Cache-Control", "no-store"),)

LOGIN_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Lapidus status: token needed</title>
<link rel="stylesheet" href="/page.css"><link rel="icon" href="data:,"></head>
<body><main class="login"><h1>Lapidus</h1>
<p>This status page needs the token set in <code>[http] token</code>.</p>
<form method="get" action="/"><label>Token <input name="token" type="password"
autocomplete="current-password" autofocus></label> <button type="submit">Open</button></form>
%s</main></body></html>
"""


class Viewer:
    """One open page: its stream, the backend whose tail it shows, whether with values."""

    def __init__(self, client: Client, backend: str, values: bool):
        self.client = client
        self.backend = backend
        self.values = values
        self.rates_until = 0.0    # the newest chart point sent


def sse(event: str, payload) -> bytes:
    """One server-sent event; JSON never holds a raw newline, so one data line."""
    return f"event: {event}\ndata: {json.dumps(payload, default=str)}\n\n".encode()


class StatusPage:
    def __init__(self, status: Callable[[], dict],
                 history: Callable[[], Dict[str, RateHistory]], tails: TailView,
                 token: Optional[str], log):
        self.status = status
        self.history = history      # backend -> its events/s points
        self.tails = tails
        self.token = token
        self.log = log
        self.server = None          # the HttpServer (it sets itself)
        self.viewers: List[Viewer] = []
        self.due = 0.0
        self.assets = {path: resources.files(__package__).joinpath("page", name).read_bytes()
                       for path, (name, _type) in ASSETS.items()}

    # -- requests ----------------------------------------------------------------------------

    def authorized(self, request: Request) -> bool:
        if not self.token:
            return True
        given = ""
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = credentials.strip()
        else:
            for part in request.headers.get("cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE:
                    given = urllib.parse.unquote(value)
        return hmac.compare_digest(given.encode(), self.token.encode())

    def refusal(self, request: Request) -> Response:
        if request.path == "/":
            note = b'<p class="bad">That token is not the one configured.</p>' \
                if "token" in request.query else b""
            return Response("401 Unauthorized", "text/html; charset=utf-8", LOGIN_PAGE % note,
                            NO_STORE)
        return Response("401 Unauthorized", "text/plain",
                        b"this needs the status page token: Authorization: Bearer <token>\n",
                        (("WWW-Authenticate", 'Bearer realm="lapidus"'),) + NO_STORE)

    def route(self, request: Request) -> Optional[Response]:
        """The page's own paths (None for any other)."""
        if request.path == "/" and self.token and "token" in request.query:
            if hmac.compare_digest(request.query["token"].encode(), self.token.encode()):
                # into a cookie, and out of the address bar
                cookie = (f"{COOKIE}={urllib.parse.quote(self.token, safe='')}; HttpOnly; "
                          f"SameSite=Strict; Path=/")
                return Response("303 See Other", "text/plain", b"",
                                (("Location", "/"), ("Set-Cookie", cookie)) + NO_STORE)
            return self.refusal(request)
        if request.path in ("/page.js", "/page.css"):
            return Response("200 OK", ASSETS[request.path][1], self.assets[request.path])
        if request.path not in ("/", "/status.json"):
            return None
        if not self.authorized(request):
            return self.refusal(request)
        if request.path == "/":
            return Response("200 OK", ASSETS["/"][1], self.assets["/"], NO_STORE)
        body = json.dumps(self.document(), indent=2, default=str).encode() + b"\n"
        return Response("200 OK", "application/json", body, NO_STORE)

    def document(self) -> dict:
        """What ``lapidusctl status --json`` prints."""
        return {"ok": True, **self.status(), "time": time.time()}

    def streams(self, request: Request) -> bool:
        return request.path == "/events"

    def open_stream(self, client: Client, request: Request) -> Optional[Response]:
        """``/events?tail=BACKEND&values=1``: start a viewer's stream (None), or refuse it."""
        if not self.authorized(request):
            return self.refusal(request)
        self.viewers = [v for v in self.viewers if self._alive(v)]
        if len(self.viewers) >= MAX_VIEWERS:
            return Response("503 Service Unavailable", "text/plain",
                            f"at most {MAX_VIEWERS} status pages at once\n".encode())
        viewer = Viewer(client, request.query.get("tail", ""),
                        request.query.get("values") == "1")
        self.server.start_stream(client, (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
            "Connection: keep-alive\r\n\r\nretry: 2000\n\n").encode())
        self.viewers.append(viewer)
        document = sse("status", self.document())
        self._push(viewer, document, time.time())
        if viewer.backend:
            self._send(viewer, sse("tail", {"backend": viewer.backend, "events": [
                e.shown(viewer.values) for e in self.tails.last(viewer.backend)]}))
        self.tails.want(self._watched(), time.monotonic())
        return None

    # -- the loop's wake-ups -----------------------------------------------------------------

    def next_push(self) -> Optional[float]:
        """When the loop must wake for the next push (None without pages: an unwatch that
        could not be sent yet is tried again at the loop's next turn, never in a spin)."""
        return self.due if self.viewers else None

    def tick(self, now: float) -> None:
        self.viewers = [v for v in self.viewers if self._alive(v)]
        self.tails.want(self._watched(), now)
        if not self.viewers or now < self.due:
            return
        self.due = now + PUSH_EVERY
        document = sse("status", self.document())
        wall = time.time()
        for viewer in list(self.viewers):
            self._push(viewer, document, wall)

    def tail_arrived(self, fields: dict) -> None:
        """The dispatcher's ``tail`` message: on to the pages that show that backend."""
        backend = fields.get("backend", "")
        new = self.tails.arrived(backend, fields.get("events") or [])
        if not new:
            return
        for viewer in [v for v in self.viewers if v.backend == backend]:
            self._send(viewer, sse("tail", {"backend": backend, "events": [
                e.shown(viewer.values) for e in new]}))

    def _push(self, viewer: Viewer, document: bytes, wall: float) -> None:
        points = {name: history.since(viewer.rates_until)
                  for name, history in self.history().items()}
        viewer.rates_until = max([viewer.rates_until] + [p[-1][0] for p in points.values() if p])
        if self._send(viewer, document):
            self._send(viewer, sse("rates", points))

    def _send(self, viewer: Viewer, data: bytes) -> bool:
        return self.server.send(viewer.client, data)

    def _alive(self, viewer: Viewer) -> bool:
        client = viewer.client
        return client.fileno() >= 0 and self.server.clients.get(client.fileno()) is client

    def _watched(self) -> List[str]:
        return [v.backend for v in self.viewers if v.backend]
