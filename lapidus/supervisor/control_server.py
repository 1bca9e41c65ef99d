"""The supervisor's end of the control socket (see :mod:`lapidus.control` for the protocol).

Runs in the supervisor process, inside the arbiter loop: the listening socket is one more thing
the loop waits on, and each request is answered right there (requests are tiny), so the
arbiter's state is never touched from another thread.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable, Dict

from ..control import encode_message, read_message
from .listener import LoopListener


class ControlServer(LoopListener):
    def __init__(self, path: Path, handlers: Dict[str, Callable[[dict], dict]], log):
        super().__init__(self._answer, log)
        self.path = Path(path)
        self.handlers = handlers

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Created with umask 077 so there is no moment at which others could connect.
        old = os.umask(0o077)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.listen(sock)

    def _answer(self, conn: socket.socket) -> None:
        request = read_message(conn)
        if request is not None:
            conn.sendall(encode_message(self.dispatch(request)))

    def dispatch(self, request: dict) -> dict:
        command = request.get("command")
        handler = self.handlers.get(command)
        if handler is None:
            return {"ok": False, "code": "unknown_command",
                    "error": f"unknown command {command!r} (expected: "
                             f"{', '.join(sorted(self.handlers))})"}
        try:
            return handler(request)
        except KeyError as exc:
            return {"ok": False, "code": "unknown_backend", "error": str(exc).strip("'\"")}

    def close(self) -> None:
        super().close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
