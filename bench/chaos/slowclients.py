"""A crowd of slow clients on the control socket and the HTTP listener.

Half of the clients of each endpoint trickle a valid request one byte every half second (a
control request in its framing, ``GET /healthz``), the other half connect and never send.
A server that serves them where a slow client costs nothing (or bounds each request by a
deadline) keeps answering everybody else meanwhile; one that reads them in its main loop with a
per-``recv`` timeout stalls for as long as they trickle.

One background thread drives every socket (non-blocking sends, no reads beyond noticing a
close), so the crowd costs the harness next to nothing.  :meth:`SlowCrowd.close` ends them all.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import List, Optional, Tuple

from lapidus.control import encode_message

TRICKLE_EVERY = 0.5          # seconds between two bytes of a trickling client


@dataclass
class SlowClient:
    endpoint: str            # "control" or "http"
    sock: socket.socket
    payload: bytes           # what it trickles; empty: never sends
    sent: int = 0
    closed_by_server: bool = False


def _control_request() -> bytes:
    return encode_message({"command": "status"})


def _http_request(host: str, port: int) -> bytes:
    return f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


class SlowCrowd:
    """``count`` clients, half on ``control_path`` and half on ``http`` (host, port)."""

    def __init__(self, control_path: str, http: Optional[Tuple[str, int]], count: int = 50):
        self.control_path = control_path
        self.http = http
        self.count = count
        self.clients: List[SlowClient] = []
        self.connect_errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True, name="slow-clients")

    def open(self) -> "SlowCrowd":
        """Connect every client (a refused connection is counted, not raised), then start
        trickling."""
        endpoints = ["control", "http"] if self.http is not None else ["control"]
        for number in range(self.count):
            endpoint = endpoints[number % len(endpoints)]
            trickles = (number // len(endpoints)) % 2 == 0
            try:
                if endpoint == "control":
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.settimeout(0.5)
                    sock.connect(self.control_path)
                    payload = _control_request()
                else:
                    sock = socket.create_connection(self.http, timeout=0.5)
                    payload = _http_request(*self.http)
            except OSError:
                self.connect_errors += 1
                continue
            sock.setblocking(False)
            self.clients.append(SlowClient(endpoint, sock, payload if trickles else b""))
        self._thread.start()
        return self

    def _trickle(self) -> None:
        while not self._stop.wait(TRICKLE_EVERY):    # the pace of the trickle, by design
            for client in self.clients:
                if client.closed_by_server:
                    continue
                if self._closed(client):
                    client.closed_by_server = True
                    continue
                if client.sent < len(client.payload):
                    try:
                        client.sock.send(client.payload[client.sent:client.sent + 1])
                        client.sent += 1
                    except BlockingIOError:
                        pass
                    except OSError:
                        client.closed_by_server = True

    @staticmethod
    def _closed(client: SlowClient) -> bool:
        """The server closed (or reset) the connection: a read says so without blocking.
        Bytes of an answer are read and dropped (a server may answer a complete request)."""
        try:
            data = client.sock.recv(4096)
        except BlockingIOError:
            return False
        except OSError:
            return True
        return data == b""

    def closed_by_server(self) -> int:
        return sum(1 for c in self.clients if c.closed_by_server)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for client in self.clients:
            try:
                client.sock.close()
            except OSError:
                pass

    def summary(self) -> str:
        trickling = sum(1 for c in self.clients if c.payload)
        return (f"{len(self.clients)} slow clients ({trickling} trickling, "
                f"{len(self.clients) - trickling} silent; "
                f"{sum(1 for c in self.clients if c.endpoint == 'http')} on HTTP), "
                f"{self.connect_errors} could not connect, {self.closed_by_server()} closed by "
                f"the server")

    def __enter__(self) -> "SlowCrowd":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
