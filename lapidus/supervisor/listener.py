"""A listening socket served from the arbiter loop, one short request at a time.

Runs in the supervisor process.  The control socket and the HTTP endpoint share this: the loop
waits on :meth:`fileno`; when it is readable, :meth:`answer_pending` accepts every waiting
connection and hands it to ``answer`` with a short timeout, so a slow client costs the loop at
most that long and never blocks it for good.
"""

from __future__ import annotations

import socket
from typing import Callable, Optional


class LoopListener:
    timeout = 2.0

    def __init__(self, answer: Callable[[socket.socket], None], log):
        self.answer = answer
        self.log = log
        self.sock: Optional[socket.socket] = None

    def listen(self, sock: socket.socket) -> None:
        sock.listen(16)
        sock.setblocking(False)
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def answer_pending(self) -> None:
        """Answer every pending connection (called when the socket is readable)."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            with conn:
                conn.settimeout(self.timeout)
                try:
                    self.answer(conn)
                except (OSError, ValueError) as exc:
                    # a client that goes away or sends garbage is its own problem
                    self.log.debug("request not answered", error=str(exc))
                except Exception:
                    # a bug in answering one request must never stop the supervisor
                    self.log.exception("request failed")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
