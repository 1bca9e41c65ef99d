"""A listening socket served from the arbiter loop without ever blocking it.

Runs in the supervisor process.  The control socket and the HTTP endpoint share this.  Every
accepted connection becomes a :class:`Client` with one overall deadline: the loop polls its
socket for reading until the request is complete, then for writing until the response is sent,
and closes it at the deadline whatever it was doing.  Nothing waits on a client, so a client that
trickles a byte at a time, never sends, or never reads its answer costs the loop nothing but a
file descriptor until its deadline; reaping, restarts and the watchdog go on meanwhile.

A subclass may turn a client into a *stream* once its request is complete (the status page's
server-sent events): it then has no deadline and stays open; the loop writes what
:meth:`LoopListener.send` queued for it whenever its socket takes more, and watches it for
reading only to see it close.  What is queued is bounded (``max_backlog``): a client that stops
reading is closed when it reaches that, so it costs memory up to the bound and never a wait.

Why not a thread or asyncio: the supervisor forks its children, and forking while another
thread holds a lock (logging, the allocator) can deadlock the child; an asyncio loop here would
be imported into every forked worker.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

# (file descriptor, poll mask, callback(events)): what the arbiter loop polls for this listener
PollEntry = Tuple[int, int, Callable[[int], None]]

READ = select.POLLIN | select.POLLPRI
WRITE = select.POLLOUT
BROKEN = select.POLLERR | select.POLLHUP | select.POLLNVAL


class Client:
    """One accepted connection: what it sent so far, what is left of its answer."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.deadline = deadline
        self.received = bytearray()
        self.answer: Optional[memoryview] = None   # set once the request is complete
        self.stream = False                 # kept open; ``backlog`` is written as it comes
        self.backlog = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()


class LoopListener:
    """Serves ``parse``/``respond`` of a subclass on a listening socket.

    ``parse(received)`` returns the complete request, or None while more bytes are needed, and
    raises ValueError for a request it cannot take; ``respond(request)`` returns the bytes to
    send back (``error_response(message)`` for a refused one).  Both run in the loop and must
    be quick.
    """

    deadline = 5.0          # seconds for a whole request and its answer
    max_request = 64 << 10  # bytes
    max_clients = 64        # beyond this a new connection is closed at once
    max_backlog = 1 << 20   # bytes queued for a stream that does not read, before it is closed

    def __init__(self, log):
        self.log = log
        self.sock: Optional[socket.socket] = None
        self.clients: Dict[int, Client] = {}

    # -- what subclasses provide -------------------------------------------------------------

    def parse(self, received: bytes) -> Any:
        raise NotImplementedError

    def respond(self, request: Any) -> bytes:
        raise NotImplementedError

    def error_response(self, message: str) -> Optional[bytes]:
        """What a client whose request cannot be taken gets (None: just close)."""
        return None

    def answer(self, client: Client, request: Any) -> None:
        """Answer a complete request: by default ``respond``'s bytes, then close.  A subclass
        that streams calls :meth:`start_stream` here instead."""
        client.answer = memoryview(self.respond(request))

    # -- streams -----------------------------------------------------------------------------

    def start_stream(self, client: Client, head: bytes) -> None:
        """Keep ``client`` open after its request: ``head`` goes first, then what
        :meth:`send` queues."""
        client.stream = True
        client.deadline = float("inf")
        client.backlog += head

    def send(self, client: Client, data: bytes) -> bool:
        """Queue ``data`` for a stream (written by the loop, never here); a client whose
        backlog would pass ``max_backlog`` has stopped reading and is closed.  False when the
        client is gone."""
        if client.fileno() < 0 or self.clients.get(client.fileno()) is not client:
            return False
        if len(client.backlog) + len(data) > self.max_backlog:
            self.log.info("a stream client stopped reading; closed", backlog=len(client.backlog))
            self._close(client)
            return False
        client.backlog += data
        return True

    # -- the loop's side ---------------------------------------------------------------------

    def listen(self, sock: socket.socket) -> None:
        sock.listen(128)
        sock.setblocking(False)
        self.sock = sock

    def poll_entries(self) -> List[PollEntry]:
        if self.sock is None:
            return []
        entries: List[PollEntry] = [(self.sock.fileno(), READ, self._accept)]
        for client in self.clients.values():
            if client.stream:
                mask = READ | (WRITE if client.backlog else 0)
            else:
                mask = READ if client.answer is None else WRITE
            entries.append((client.fileno(), mask,
                            lambda events, c=client: self._serve(c, events)))
        return entries

    def next_deadline(self) -> Optional[float]:
        return min((c.deadline for c in self.clients.values() if not c.stream), default=None)

    def expire(self, now: float) -> None:
        """Close every client past its deadline (streams have none)."""
        for client in [c for c in self.clients.values() if now >= c.deadline]:
            self.log.debug("client too slow; closed", deadline=self.deadline)
            self._close(client)

    def _accept(self, _events: int) -> None:
        while self.sock is not None:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:   # out of file descriptors: the next poll tries again
                self.log.warning("cannot accept a connection", error=str(exc))
                return
            conn.setblocking(False)
            if len(self.clients) >= self.max_clients:
                self.log.warning("too many clients at once; connection closed",
                                 max_clients=self.max_clients)
                conn.close()
                continue
            client = Client(conn, time.monotonic() + self.deadline)
            self.clients[client.fileno()] = client

    def _serve(self, client: Client, events: int) -> None:
        try:
            if client.stream:
                self._serve_stream(client, events)
                return
            if client.answer is None:
                self._read(client, events)
            if client.answer is not None:
                self._write(client)
        except (OSError, ValueError) as exc:
            # a client that goes away or sends garbage is its own problem
            self.log.debug("request not answered", error=str(exc))
            self._close(client)
        except Exception:
            # a bug in answering one request must never stop the supervisor
            self.log.exception("request failed")
            self._close(client)

    def _read(self, client: Client, events: int) -> None:
        try:
            chunk = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            self._close(client)   # closed before its request was complete
            return
        client.received += chunk
        try:
            if len(client.received) > self.max_request:
                raise ValueError(f"request larger than {self.max_request} bytes")
            request = self.parse(bytes(client.received))
        except ValueError as exc:
            answer = self.error_response(str(exc))
            if answer is None:
                raise
            client.answer = memoryview(answer)
            return
        if request is not None:
            self.answer(client, request)
            if client.stream:
                self._serve_stream(client, 0)

    def _serve_stream(self, client: Client, events: int) -> None:
        """A stream's client sends nothing after its request: readable means it closed (or
        sent something to ignore); writable means its backlog can go on."""
        if events & (READ | BROKEN):
            try:
                chunk = client.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                chunk = None
            if chunk == b"":
                self._close(client)
                return
        if client.backlog:
            try:
                sent = client.sock.send(client.backlog)
            except (BlockingIOError, InterruptedError):
                return
            del client.backlog[:sent]

    def _write(self, client: Client) -> None:
        try:
            sent = client.sock.send(client.answer)
        except (BlockingIOError, InterruptedError):
            return
        client.answer = client.answer[sent:]
        if not client.answer:
            self._close(client)

    def _close(self, client: Client) -> None:
        self.clients.pop(client.fileno(), None)
        try:
            client.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._close(client)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
