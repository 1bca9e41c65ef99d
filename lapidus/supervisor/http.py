"""``/metrics`` and ``/healthz`` over HTTP, served from the arbiter loop.

Runs in the supervisor process, without threads: the listening socket is one more thing the
loop waits on, and a request (a few hundred bytes) is read and answered right away with short
timeouts.  A thread would be simpler to write, but the supervisor forks workers, and forking
while another thread holds a lock (logging, the allocator) can deadlock the child.
"""

from __future__ import annotations

import json
import socket
from typing import Callable, Tuple

from . import metrics
from .listener import LoopListener


class HttpServer(LoopListener):
    timeout = 1.0

    def __init__(self, host: str, port: int, status: Callable[[], dict], log):
        super().__init__(self._answer, log)
        self.address = (host, port)
        self.status = status

    def open(self) -> None:
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(self.address)
        self.listen(sock)
        self.log.info("http listening", address=f"{self.address[0]}:{self.address[1]}")

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data and b"\n\n" not in data and len(data) < 8192:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        parts = data.split(b"\r\n", 1)[0].split()
        method, path = (parts[0].decode(), parts[1].decode()) if len(parts) >= 2 else ("", "")
        code, content_type, body = self.route(method, path.split("?", 1)[0])
        head = (f"HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        conn.sendall(head + (body if method != "HEAD" else b""))

    def route(self, method: str, path: str) -> Tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if path == "/metrics":
            return "200 OK", metrics.CONTENT_TYPE, metrics.render(self.status()).encode()
        if path == "/healthz":
            status = self.status()
            down = [b["name"] for b in status["backends"] if b["state"] != "RUNNING"]
            body = json.dumps({"ok": not down, "not_streaming": down}).encode() + b"\n"
            return ("200 OK" if not down else "503 Service Unavailable"), "application/json", body
        return "404 Not Found", "text/plain", b"try /metrics or /healthz\n"

