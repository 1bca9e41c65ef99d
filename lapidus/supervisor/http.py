"""The HTTP listener: the status page (``/``, :mod:`.status_page`), ``/metrics`` and
``/healthz``, served from the arbiter loop.

Runs in the supervisor process, without threads: the listening socket and its clients are
polled by the loop (:class:`LoopListener`; it explains why no thread), and a request (a few
hundred bytes) is answered as soon as its head is complete.  The page's live updates are a
stream (server-sent events) the loop writes to; see :mod:`.status_page`.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from . import metrics
from .listener import Client, LoopListener


class Request(NamedTuple):
    method: str
    path: str                    # without the query
    query: Dict[str, str]        # the first value of each parameter
    headers: Dict[str, str]      # names in lower case


class Response(NamedTuple):
    code: str                    # "200 OK"
    content_type: str
    body: bytes
    headers: Tuple[Tuple[str, str], ...] = ()


def parse_request(received: bytes) -> Optional[Request]:
    """The request once its head is complete, else None; ValueError for what is not HTTP."""
    end = received.find(b"\r\n\r\n")
    if end < 0:
        end = received.find(b"\n\n")
        if end < 0:
            return None
    lines = received[:end].decode("latin-1").splitlines()
    parts = lines[0].split() if lines else []
    if len(parts) < 2:
        raise ValueError("not an HTTP request")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    path, _, query = parts[1].partition("?")
    params = {k: v[0] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
    return Request(parts[0], path, params, headers)


def reply(response: Response, method: str = "GET") -> bytes:
    head = f"HTTP/1.1 {response.code}\r\nContent-Type: {response.content_type}\r\n" \
           f"Content-Length: {len(response.body)}\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in response.headers)
    return (head + "\r\n").encode() + (response.body if method != "HEAD" else b"")


class HttpServer(LoopListener):
    max_request = 8192

    def __init__(self, host: str, port: int, status: Callable[[], dict], log, page=None):
        super().__init__(log)
        self.address = (host, port)
        self.status = status
        self.page = page          # a StatusPage, or None: /metrics and /healthz only
        if page is not None:
            page.server = self

    def open(self) -> None:
        """Bind and listen; OSError (the address is in use, not local ...) goes to the caller."""
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self.address)
        except OSError:
            sock.close()
            raise
        self.listen(sock)
        host, port = sock.getsockname()[:2]
        self.log.info("http listening", address=f"{host}:{port}")

    @property
    def bound_port(self) -> Optional[int]:
        return self.sock.getsockname()[1] if self.sock is not None else None

    def parse(self, received: bytes) -> Optional[Request]:
        return parse_request(received)

    def error_response(self, message: str) -> bytes:
        return reply(Response("400 Bad Request", "text/plain", message.encode() + b"\n"))

    def answer(self, client: Client, request: Request) -> None:
        if self.page is not None and request.method == "GET" and self.page.streams(request):
            refused = self.page.open_stream(client, request)
            if refused is not None:
                client.answer = memoryview(reply(refused))
            return
        super().answer(client, request)

    def respond(self, request: Request) -> bytes:
        return reply(self.route(request), request.method)

    def route(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response("405 Method Not Allowed", "text/plain", b"only GET\n")
        if request.path == "/metrics":
            return Response("200 OK", metrics.CONTENT_TYPE,
                            metrics.render(self.status()).encode())
        if request.path == "/healthz":
            health = healthz(self.status())
            body = json.dumps(health).encode() + b"\n"
            return Response("200 OK" if health["ok"] else "503 Service Unavailable",
                            "application/json", body)
        if self.page is not None:
            response = self.page.route(request)
            if response is not None:
                return response
            return Response("404 Not Found", "text/plain",
                            b"try / (the status page), /metrics or /healthz\n")
        return Response("404 Not Found", "text/plain", b"try /metrics or /healthz\n")

    # the page pushes its updates from the loop's wake-ups

    def next_deadline(self) -> Optional[float]:
        due = [d for d in (super().next_deadline(),
                           self.page.next_push() if self.page is not None else None) if d]
        return min(due, default=None)

    def expire(self, now: float) -> None:
        super().expire(now)
        if self.page is not None:
            self.page.tick(now)


def healthz(status: dict) -> dict:
    """``ok`` only while every backend streams and none is held by a sink: the backends that
    are not streaming (with what they wait for) and the failing sinks are listed.  In cluster
    mode "every backend" is every backend another node does not hold (a backend nobody holds
    counts: this node should take it), and a node without its connection to the cluster is
    not ok."""
    down, waiting, failing = [], {}, {}
    cluster = status.get("cluster")
    me = cluster.get("node") if cluster else None
    for row in status["backends"]:
        owner = row.get("owner")
        if cluster is not None and owner is not None and owner != me:
            continue
        if row["state"] != "RUNNING":
            down.append(row["name"])
        if row.get("waiting_for"):
            waiting[row["name"]] = row["waiting_for"]
        if row.get("sink_error"):
            failing[row["name"]] = row["sink_error"]
    health = {"ok": not down and not failing, "not_streaming": down, "waiting_for": waiting,
              "sinks_failing": failing}
    if cluster is not None:
        health["cluster_connected"] = bool(cluster.get("connected"))
        health["ok"] = health["ok"] and health["cluster_connected"]
    return health
