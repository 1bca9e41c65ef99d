"""``/metrics`` and ``/healthz`` over HTTP, served from the arbiter loop.

Runs in the supervisor process, without threads: the listening socket and its clients are
polled by the loop (:class:`LoopListener`; it explains why no thread), and a request (a few
hundred bytes) is answered as soon as its head is complete.
"""

from __future__ import annotations

import json
import socket
from typing import Callable, Optional, Tuple

from . import metrics
from .listener import LoopListener


class HttpServer(LoopListener):
    max_request = 8192

    def __init__(self, host: str, port: int, status: Callable[[], dict], log):
        super().__init__(log)
        self.address = (host, port)
        self.status = status

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

    def parse(self, received: bytes) -> Optional[Tuple[str, str]]:
        if b"\r\n\r\n" not in received and b"\n\n" not in received:
            return None
        parts = received.split(b"\n", 1)[0].split()
        if len(parts) < 2:
            raise ValueError("not an HTTP request")
        return parts[0].decode("latin-1"), parts[1].decode("latin-1")

    def error_response(self, message: str) -> bytes:
        return self._reply("400 Bad Request", "text/plain", message.encode() + b"\n", "GET")

    def respond(self, request: Tuple[str, str]) -> bytes:
        method, path = request
        code, content_type, body = self.route(method, path.split("?", 1)[0])
        return self._reply(code, content_type, body, method)

    @staticmethod
    def _reply(code: str, content_type: str, body: bytes, method: str) -> bytes:
        head = (f"HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        return head + (body if method != "HEAD" else b"")

    def route(self, method: str, path: str) -> Tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if path == "/metrics":
            return "200 OK", metrics.CONTENT_TYPE, metrics.render(self.status()).encode()
        if path == "/healthz":
            health = healthz(self.status())
            body = json.dumps(health).encode() + b"\n"
            return ("200 OK" if health["ok"] else "503 Service Unavailable"), \
                "application/json", body
        return "404 Not Found", "text/plain", b"try /metrics or /healthz\n"


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
